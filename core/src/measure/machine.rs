//! This machine measured for the roofline: its f32 GEMM rate and its memory bandwidth.

use web_time::Instant;

use burn::tensor::{Device, Distribution, Tensor};

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

/// Measures this machine's attainable f32 GEMM rate (best of 4) on `device` and its memory
/// bandwidth (a copy, best of 3), for the roofline.
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
    let src = vec![1u8; probe.copy_bytes];
    let mut dst = vec![0u8; probe.copy_bytes];
    let mut best_copy = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&dst);
        best_copy = best_copy.min(t.elapsed().as_secs_f64());
    }
    let bandwidth = 2.0 * src.len() as f64 / best_copy; // read + write
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
