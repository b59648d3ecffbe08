#!/usr/bin/env bash
# Type-checks the CUDA build (`cargo check -p napkin --features cuda`) on a machine with no
# NVIDIA toolkit and no access to GitHub, as CI is (what it needs: scripts/cuda-env.sh). The
# full build links and runs (`scripts/bench-gpu.sh` on an NVIDIA machine, README "On a GPU");
# CI checks only, to stay within its time.
# Usage: scripts/check-cuda.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/cuda-env.sh
cargo check -q -p napkin --features cuda --locked
echo "the CUDA build type-checks (cargo check -p napkin --features cuda)"
