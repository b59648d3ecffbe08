//! This machine measured for the roofline: its f32 GEMM rate and its memory bandwidth.

use web_time::Instant;

use burn::tensor::{Device, Distribution, Tensor};

use crate::device::is_gpu;
use crate::model::autocast::linear_matmul;
use crate::predict::time::DevicePreset;

/// How hard to probe this machine for the roofline: the GEMM's size and the copy's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MachineProbe {
    /// n of the n×n×n f32 GEMM.
    pub gemm_n: usize,
    /// Bytes copied to measure the memory bandwidth.
    pub copy_bytes: usize,
}

impl MachineProbe {
    /// A native machine: 1024³ GEMM, 256 MiB copy.
    pub const NATIVE: MachineProbe = MachineProbe {
        gemm_n: 1024,
        copy_bytes: 256 << 20,
    };
    /// A browser tab (one thread, a 32-bit address space): 256³ GEMM, 16 MiB copy.
    pub const BROWSER: MachineProbe = MachineProbe {
        gemm_n: 256,
        copy_bytes: 16 << 20,
    };
}

/// Measures this machine's attainable f32 GEMM rate (best of 4) on `device` and the bandwidth
/// of the memory its tensors live in (a copy, best of 3), for the roofline.
pub fn this_machine(device: &Device, probe: MachineProbe) -> DevicePreset {
    let n = probe.gemm_n;
    let a: Tensor<2> = Tensor::random([n, n], Distribution::Default, device);
    let b: Tensor<2> = Tensor::random([n, n], Distribution::Default, device);
    let mut best_gemm = f64::INFINITY;
    for _ in 0..4 {
        let t = Instant::now();
        let c = linear_matmul(a.clone(), b.clone());
        // `into_data` does not wait on the GPU backends (the bytes are read when first
        // touched): a sync does.
        let _ = device.sync();
        drop(c);
        best_gemm = best_gemm.min(t.elapsed().as_secs_f64());
    }
    let flops = 2.0 * (n * n * n) as f64 / best_gemm;
    let bandwidth = if is_gpu(device) {
        device_copy_bandwidth(device, probe.copy_bytes)
    } else {
        host_copy_bandwidth(probe.copy_bytes)
    };
    DevicePreset {
        id: "this-machine".into(),
        name: "this machine (measured)".into(),
        f32_flops: flops,
        half_flops: flops,
        bandwidth,
        memory: f64::INFINITY,
        link_bytes_per_second: None,
    }
}

/// Bytes read and written per second by a copy in host memory (the CPU backends' tensors).
fn host_copy_bandwidth(bytes: usize) -> f64 {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    2.0 * bytes as f64 / best // read + write
}

/// Bytes read and written per second by element-wise ops over f32 on a GPU: its own memory,
/// not the host's (a host copy read 18 GB/s beside an H200's ~4 TB/s). At most 64 MiB a tensor
/// (lavapipe cannot make a 256 MiB buffer; a failed op "finishes" at once), four ops to a sync
/// so that one launch does not dominate; a result that cannot be read back falls back to the
/// host copy.
fn device_copy_bandwidth(device: &Device, bytes: usize) -> f64 {
    const REPEATS: usize = 4;
    let values = (bytes.min(64 << 20) / 4).max(1);
    let x: Tensor<1> = Tensor::ones([values], device);
    // The first launch compiles the kernel; it is not timed.
    drop(x.clone() * 1.0);
    let _ = device.sync();
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        // `x` stays alive, so each product gets a buffer of its own: one read, one write.
        let outputs: Vec<Tensor<1>> = (0..REPEATS).map(|_| x.clone() * 1.0).collect();
        let _ = device.sync();
        best = best.min(t.elapsed().as_secs_f64());
        let written = outputs[REPEATS - 1]
            .clone()
            .narrow(0, 0, 1)
            .try_into_data()
            .ok()
            .and_then(|d| d.try_to_vec::<f32>().ok());
        if written != Some(vec![1.0]) {
            return host_copy_bandwidth(bytes);
        }
    }
    2.0 * (REPEATS * values * 4) as f64 / best
}
