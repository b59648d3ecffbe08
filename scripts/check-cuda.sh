#!/usr/bin/env bash
# Type-checks the CUDA build (`cargo check -p napkin --features cuda`) on a machine with no
# NVIDIA toolkit and no access to GitHub, as CI is. What burn 0.22.1's CUDA backend needs to
# compile, beyond crates:
# - cudarc reads the CUDA version from `nvcc --version`; without nvcc, CUDARC_CUDA_VERSION
#   names one (the driver and NVRTC themselves are loaded at run time);
# - cubecl-cuda compiles its kernels to PTX with LLVM (cubecl-llvm), whose build script
#   downloads tracel's LLVM 23.1 bundle from GitHub releases into $XDG_DATA_HOME/tracel. Where
#   that bundle is not installed, Debian's LLVM 22 (llvm-22-dev) stands in for it in a data
#   directory of this checkout's own (target/llvm-stand-in): enough to type-check, not to link
#   a binary that runs. A real CUDA build (scripts/bench-gpu.sh) needs the network once.
# Usage: scripts/check-cuda.sh
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v nvcc >/dev/null; then
    export CUDARC_CUDA_VERSION="${CUDARC_CUDA_VERSION:-12080}"
fi

bundle="tracel/tracel-llvm-23.1.0-4"
if [ ! -e "${XDG_DATA_HOME:-$HOME/.local/share}/$bundle/.tracel-llvm-installed" ]; then
    llvm=/usr/lib/llvm-22
    if [ ! -x "$llvm/bin/llvm-config" ]; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            echo "installing llvm-22-dev (stands in for the LLVM bundle cubecl-llvm downloads)..."
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq llvm-22-dev >/dev/null
        else
            echo "error: the CUDA check needs LLVM 22 (Debian: apt-get install llvm-22-dev) or" \
                "tracel's LLVM bundle (a build with network access installs it)" >&2
            exit 1
        fi
    fi
    stand_in="$PWD/target/llvm-stand-in"
    mkdir -p "$stand_in/$bundle"
    for dir in bin include lib; do
        ln -sfn "$llvm/$dir" "$stand_in/$bundle/$dir"
    done
    touch "$stand_in/$bundle/.tracel-llvm-installed"
    export XDG_DATA_HOME="$stand_in"
fi

cargo check -q -p napkin --features cuda --locked
echo "the CUDA build type-checks (cargo check -p napkin --features cuda)"
