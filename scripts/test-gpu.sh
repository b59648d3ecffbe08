#!/usr/bin/env bash
# The GPU-backend tests: the wgpu test binary (`tests/tests/gpu`: NF4 resident on the device
# and dequantized there bit for bit, generation's few-row products read straight from the
# codes, no weight upload per step, 16-bit QLoRA, optimizer
# offload, QLoRA's NF4 backward, efficient attention, the step peak and the roofline probe on a
# device pool), `napkin measure --device wgpu` with offload and with QLoRA, and the GPU
# benchmark's smoke case. With no GPU it installs Mesa's lavapipe (Debian
# `mesa-vulkan-drivers`, a Vulkan driver that runs on the CPU) and asks wgpu for Vulkan.
# The test binary and the CLI are built in one cargo invocation, so the wgpu feature set is
# resolved once and burn/cubecl compile once (separately they resolved differently and compiled
# twice: 20.5 + 13.5 minutes cold on 2 cores). scripts/test.sh runs this script: 17.8 minutes
# there on a clean clone (2 cores, 2026-11-29; its clippy step 1.2), the whole test command 60.5
# (CI's limit: 90).
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

# One feature resolution for both: `cargo run -p napkin` alone would resolve another and rebuild.
gpu_build=(-p napkin -p napkin-tests --features napkin/wgpu,napkin-tests/wgpu --locked)
cargo build "${gpu_build[@]}" --test gpu --bin napkin
napkin="${CARGO_TARGET_DIR:-target}/debug/napkin"

cargo test "${gpu_build[@]}" --test gpu -- --nocapture
# The wgpu-only code (this test binary, the GPU bench) is outside the workspace's clippy run,
# which builds with napkin/cuda.
cargo clippy "${gpu_build[@]}" --test gpu --bin napkin -- -D warnings

# The same split as a user sees it (the tiny-smol preset, full fine-tuning, 2 steps).
"$napkin" measure --preset tiny-smol --device wgpu --offload optimizer --seq-len 64 --steps 2

# QLoRA on the device (NF4 codes resident there, dequantized by napkin's kernel per product).
"$napkin" measure --preset tiny-smol --device wgpu --lora-r 8 --nf4 --double-quant --seq-len 64 --steps 2

# The GPU benchmark's smoke case (scripts/bench-gpu.sh runs the full one on a real GPU).
"$napkin" bench gpu --device wgpu --smoke --runs 3
