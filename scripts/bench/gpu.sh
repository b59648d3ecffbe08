#!/usr/bin/env bash
# The GPU benchmark (`napkin bench gpu`): QLoRA steps of a TinyLlama-1.1B-shaped model (r 16,
# NF4 + double quantization, checkpointing, T = 512 and 2048) and LoRA steps of SmolLM2-135M on
# the first GPU found, predicted beside measured. With an NVIDIA driver (nvidia-smi answers) it
# builds the CUDA backend; otherwise wgpu (Vulkan, Metal, DX12). Without any GPU it runs the
# smoke case on Mesa's lavapipe (installed as scripts/ci/test-gpu.sh does).
# Usage: scripts/bench/gpu.sh [napkin bench options, e.g. --gpu-preset h100 --runs 5]
set -euo pipefail
cd "$(dirname "$0")/../.."

extra=()
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    features=cuda device=cuda profile=release
    # cudarc's CUDA version, and LLVM for cubecl-llvm's link (scripts/ci/cuda-env.sh).
    source scripts/ci/cuda-env.sh
    if ! ldconfig -p 2>/dev/null | grep -q libnvrtc; then
        echo "note: libnvrtc (NVRTC) was not found by ldconfig; CUDA kernels are compiled with it at" \
            "run time (the CUDA toolkit's lib64, or pip's nvidia-cuda-nvrtc, on LD_LIBRARY_PATH)" >&2
    fi
else
    features=wgpu device=wgpu profile=release
    if ! compgen -G '/usr/share/vulkan/icd.d/*.json' >/dev/null &&
        ! compgen -G '/etc/vulkan/icd.d/*.json' >/dev/null; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            echo "no GPU driver found: installing mesa-vulkan-drivers (lavapipe) for the smoke case..."
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mesa-vulkan-drivers >/dev/null
        fi
    fi
    export WGPU_BACKEND="${WGPU_BACKEND:-vulkan}"
    # A hardware GPU has a render node on Linux (macOS: Metal always has one); lavapipe none.
    if [ "$(uname)" != Darwin ] && ! compgen -G '/dev/dri/renderD*' >/dev/null; then
        echo "no hardware GPU: the smoke case on the software rasterizer (dev build)" >&2
        extra=(--smoke)
        profile=dev
    fi
fi

if [ "$profile" = release ]; then
    cargo build --release -q -p napkin --features "$features" --locked
    napkin=target/release/napkin
else
    cargo build -q -p napkin --features "$features" --locked
    napkin=target/debug/napkin
fi
"$napkin" bench gpu --device "$device" "${extra[@]}" "$@"
