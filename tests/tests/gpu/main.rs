//! The GPU-backend tests, run by `scripts/ci/test-gpu.sh` on wgpu: with no GPU the script installs
//! Mesa's lavapipe, a Vulkan driver that runs on the CPU, so the device memory is the driver's
//! own allocations and the host memory is this program's heap — two meters that do not see each
//! other's bytes, as on a real GPU.

use std::sync::Mutex;

use burn::tensor::Device;
use napkin_core::device::DeviceKind;
use napkin_core::memory::CountingAllocator;

#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator;

/// The tests share one device pool: one at a time, so each reads only its own bytes.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The wgpu device (lavapipe where there is no GPU).
fn wgpu_device() -> Device {
    DeviceKind::Wgpu
        .open()
        .expect("a wgpu adapter (lavapipe without a GPU)")
}

/// `n` seeded values in [-scale, scale) (a linear congruential sequence from `seed`).
fn seeded_values(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

mod adamw_kernel;
mod adapter_generation;
mod attention_rows;
mod captured_step;
mod chunked_loss;
mod device_pool;
mod fused_training;
mod gradient_clipping;
mod kv_cache;
mod nf4_backward;
mod nf4_device;
mod nf4_rows;
mod offload;
mod out_of_memory;
mod queue_thread;
mod rms_norm_rows;
mod rope_rows;
mod swiglu_rows;
