#!/usr/bin/env bash
# The browser sandbox's checks: builds web/dist (scripts/web-build.sh), holds the bundle to
# its budget, installs Debian's Chromium when missing (root + apt) and playwright-core from
# npm (no browser download), then runs the end-to-end test in headless Chromium.
# Usage: scripts/test-web.sh   (env: NAPKIN_FIXTURES, CHROMIUM)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
fixtures="${NAPKIN_FIXTURES:-$(cd .. && pwd)/shared/fixtures}"
chromium="${CHROMIUM:-/usr/bin/chromium}"

# Budget for the release module without wasm-opt (measured 6.35 MB, 1.18 MB gzipped at first;
# 7.03 MB, 1.29 MB with the fused CPU kernels of docs/performance.md's runs 5 and 6, which the
# browser's Flex step runs too; `wasm-opt -Oz` takes the first build to 4.7 MB / 1.08 MB in
# 3 minutes, so it is opt-in).
max_wasm_bytes=7300000
max_gzip_bytes=1350000

if [ ! -x "$chromium" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing Debian's chromium for the browser tests..."
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
        echo "error: $chromium not found; install Chromium (Debian: apt-get install chromium) or set CHROMIUM" >&2
        exit 1
    fi
fi

bash scripts/web-build.sh
wasm="web/dist/napkin_web_bg.wasm"
wasm_bytes=$(stat -c %s "$wasm")
gzip_bytes=$(gzip -9 -c "$wasm" | wc -c)
if [ "$wasm_bytes" -gt "$max_wasm_bytes" ] || [ "$gzip_bytes" -gt "$max_gzip_bytes" ]; then
    echo "error: bundle over budget: $wasm_bytes bytes (max $max_wasm_bytes), $gzip_bytes gzipped (max $max_gzip_bytes)" >&2
    exit 1
fi
echo "bundle within budget: $wasm_bytes ≤ $max_wasm_bytes bytes, $gzip_bytes ≤ $max_gzip_bytes gzipped"

(cd web/e2e && npm ci --silent --no-audit --no-fund)
mkdir -p web/e2e/artifacts
# A report written by the CLI, for the page's import (the same JSON a real GPU run writes).
# After `cargo test --workspace` the CLI is already built with the workspace's features; a
# `cargo run -p napkin` would rebuild burn with napkin's own feature set (minutes).
napkin=target/debug/napkin
if [ ! -x "$napkin" ]; then
    cargo build --quiet --locked -p napkin
fi
"$napkin" measure --preset tiny-smol --seq-len 64 --steps 1 --json > web/e2e/artifacts/measure.json
CHROMIUM="$chromium" \
    NAPKIN_MEASURE_JSON="$root/web/e2e/artifacts/measure.json" \
    NAPKIN_CONFIG_JSON="$fixtures/tiny-smol/config.json" \
    node web/e2e/sandbox.test.mjs
