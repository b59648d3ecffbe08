#!/usr/bin/env bash
# The GPU-backend tests: the wgpu test binary (`tests/tests/gpu`: optimizer offload, QLoRA's
# NF4 backward, the step peak and the roofline probe on a device pool) and `napkin measure
# --device wgpu` with offload and with QLoRA. With no GPU it installs Mesa's lavapipe (Debian
# `mesa-vulkan-drivers`, a Vulkan driver that runs on the CPU) and asks wgpu for Vulkan.
# Builds the wgpu feature (dev profile; about 26 minutes cold on 2 cores).
# Usage: scripts/test-gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."

have_vulkan_driver() {
    compgen -G '/usr/share/vulkan/icd.d/*.json' >/dev/null ||
        compgen -G '/etc/vulkan/icd.d/*.json' >/dev/null
}

if ! have_vulkan_driver; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing mesa-vulkan-drivers (lavapipe: Vulkan on the CPU)..."
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mesa-vulkan-drivers >/dev/null
    fi
    if ! have_vulkan_driver; then
        echo "error: no Vulkan driver found; install mesa-vulkan-drivers (Debian/Ubuntu) or a GPU driver" >&2
        exit 1
    fi
fi
export WGPU_BACKEND="${WGPU_BACKEND:-vulkan}"

cargo test -p napkin-tests --features wgpu --test gpu --locked -- --nocapture

# The same split as a user sees it (the tiny-smol preset, full fine-tuning, 2 steps).
cargo run -q -p napkin --features wgpu --locked -- measure --preset tiny-smol --device wgpu \
    --offload optimizer --seq-len 64 --steps 2

# QLoRA on the device (NF4 codes on the host; the products' transient weights on the device).
cargo run -q -p napkin --features wgpu --locked -- measure --preset tiny-smol --device wgpu \
    --lora-r 8 --nf4 --seq-len 64 --steps 2
