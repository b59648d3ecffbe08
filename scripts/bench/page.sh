#!/usr/bin/env bash
# The page's speed beside the native build's (web/e2e/bench-page.mjs): the f32 GEMMs at the
# page's shapes in headless Chromium against `napkin bench matmul --page-shapes` (the same code,
# native, one thread), and the page's own training run in tokens/s. Builds web/dist (CPU module
# only) and the release CLI when they are missing. More builds to compare are given as
# LABEL=DIST arguments (a web/dist built another way, e.g. without `+simd128`).
# Usage: scripts/bench/page.sh [LABEL=DIST ...]   (env: CHROMIUM, ROUNDS, GEMM_RUNS)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
if [ ! -f web/dist/napkin_web_bg.wasm ]; then
    NAPKIN_WEBGPU=0 bash scripts/ci/web-build.sh
fi
if [ ! -x target/release/napkin ]; then
    echo "building the release CLI (once)..."
    cargo build --quiet --locked --release -p napkin
fi
(cd web/e2e && npm ci --silent --no-audit --no-fund)
node web/e2e/bench-page.mjs "$root/target/release/napkin" "page=$root/web/dist" "$@"
