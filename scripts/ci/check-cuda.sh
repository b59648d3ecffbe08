#!/usr/bin/env bash
# The CUDA backend type-checked and linted as a CUDA user builds it (napkin-core and the CLI with
# `--features napkin/cuda`, check mode): no toolkit or GPU needed (scripts/ci/cuda-env.sh says
# why). Not part of scripts/test.sh: nearly all of napkin's CUDA code is the GPU code the wgpu
# build compiles and tests (`cfg(any(feature = "wgpu", feature = "cuda"))`); what only this check
# sees is the `Device::cuda` arm and cubecl-cuda's own crates, at ~20 minutes of a 2-core
# machine cold (docs/ci.md). Run it after touching device selection, features or the locked
# burn/cubecl versions; scripts/bench/gpu.sh builds the same code in release on a GPU machine.
# Usage: scripts/ci/check-cuda.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/ci/cuda-env.sh
cargo clippy --locked -p napkin-core -p napkin --lib --bins --features napkin/cuda -- -D warnings
