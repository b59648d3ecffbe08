//! `napkin bench matmul`: f32 GEMM throughput on the shapes that dominate training a
//! SmolLM2-sized model (256 tokens × 576 → 1536 for the MLP, × 49152 for the LM head) and a
//! square 1024³ one, on every CPU backend compiled in.

use std::time::Instant;

use anyhow::Result;
use burn::tensor::{Device, Distribution, Tensor};
use napkin_core::device::DeviceKind;
use napkin_core::model::matmul_wt::matmul_wt;

use crate::cli::BenchArgs;

pub fn run(args: &BenchArgs) -> Result<()> {
    let shapes = [
        (256usize, 576usize, 1536usize),
        (256, 576, 49_152),
        (1024, 1024, 1024),
    ];
    let backends = DeviceKind::cpu_backends();
    println!(
        "f32 matmul, GFLOP/s (median of {} runs after a warm-up; threads: rayon default)",
        args.runs
    );
    print!("{:<34}", "backend");
    for (m, k, n) in shapes {
        print!("{:>18}", format!("{m}x{k}x{n}"));
    }
    println!();
    for kind in backends {
        let device = kind.open()?;
        let products: [(&str, GflopsOf); 2] = [("a·b", matmul_gflops), ("x·Wᵀ", x_wt_gflops)];
        for (name, gflops) in products {
            print!("{:<34}", format!("{} {name}", kind.backend_name()));
            for (m, k, n) in shapes {
                print!("{:>18.1}", gflops(&device, m, k, n, args.runs));
            }
            println!();
        }
    }
    Ok(())
}

/// A product's median GFLOP/s at `(device, m, k, n, runs)`.
type GflopsOf = fn(&Device, usize, usize, usize, usize) -> f64;

/// Median GFLOP/s of burn's `[m, k] × [k, n]`.
pub fn matmul_gflops(device: &Device, m: usize, k: usize, n: usize, runs: usize) -> f64 {
    let a: Tensor<2> = Tensor::random([m, k], Distribution::Normal(0.0, 1.0), device);
    let b: Tensor<2> = Tensor::random([k, n], Distribution::Normal(0.0, 1.0), device);
    median_gflops(device, m, k, n, runs, || a.clone().matmul(b.clone()))
}

/// Median GFLOP/s of napkin's linear-layer product `x · Wᵀ`, `x: [m, k]`, `W: [n, k]`.
pub fn x_wt_gflops(device: &Device, m: usize, k: usize, n: usize, runs: usize) -> f64 {
    let x: Tensor<2> = Tensor::random([m, k], Distribution::Normal(0.0, 1.0), device);
    let w: Tensor<2> = Tensor::random([n, k], Distribution::Normal(0.0, 1.0), device);
    median_gflops(device, m, k, n, runs, || matmul_wt(x.clone(), w.clone()))
}

fn median_gflops(
    device: &Device,
    m: usize,
    k: usize,
    n: usize,
    runs: usize,
    product: impl Fn() -> Tensor<2>,
) -> f64 {
    let flops = 2.0 * (m * k * n) as f64;
    let once = || {
        let start = Instant::now();
        let c = product();
        let _ = device.sync();
        drop(c);
        start.elapsed().as_secs_f64()
    };
    once(); // warm-up: thread pool start, first-touch of buffers
    let mut times: Vec<f64> = (0..runs.max(1)).map(|_| once()).collect();
    times.sort_by(f64::total_cmp);
    flops / times[times.len() / 2] / 1e9
}
