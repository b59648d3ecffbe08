//! `napkin bench`: benchmarks that decide engineering choices. Figures are printed, never
//! asserted (speed targets live in benchmarks, not in tests).
//!
//! - `matmul`: f32 GEMM throughput on every CPU backend compiled in (`matmul.rs`).
//! - `generate`: prefill and KV-cached decoding of a real checkpoint (`generate.rs`).
//! - `products`: the quantized products of generation alone, per block format (`products.rs`).
//! - `suite`: the performance suite, each case beside PyTorch in the same run (`suite.rs`).
//! - `gpu`: QLoRA and LoRA training steps on the first GPU found (`gpu.rs`).

mod cases;
mod generate;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod gpu;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod gpu_capture;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod gpu_dequant;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod gpu_launch;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod gpu_rows;
mod matmul;
mod process_memory;
mod products;
mod reference;
mod runner;
mod suite;

use anyhow::Result;

use crate::cli::{BenchArgs, BenchCase};

pub fn run(args: &BenchArgs) -> Result<()> {
    match args.what {
        BenchCase::Matmul => matmul::run(args),
        BenchCase::Generate => generate::run(args),
        BenchCase::Products => products::run(args),
        BenchCase::Suite => suite::run(args),
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        BenchCase::Gpu => gpu::run(args),
        #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
        BenchCase::Gpu => anyhow::bail!(
            "this build has no GPU backend; rebuild with `--features wgpu` or `--features cuda` \
             (scripts/bench/gpu.sh does)"
        ),
    }
}

/// Median, min and max of a set of figures (`None` when there are none).
fn spread(values: &[f64]) -> Option<(f64, f64, f64)> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    Some((
        *sorted.get(sorted.len() / 2)?,
        *sorted.first()?,
        *sorted.last()?,
    ))
}

/// The median of a set of figures with a distribution-free 95 % interval for it: the order
/// statistics `x₍ₖ₎ … x₍ₙ₊₁₋ₖ₎` with the largest k for which `P(Binomial(n, ½) < k) ≤ 2.5 %`
/// (n = 15: the 4th and 12th of 15). `None` below 6 figures, where no such interval exists.
fn median_interval(values: &[f64]) -> Option<(f64, f64, f64)> {
    let n = values.len();
    if n < 6 {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    // P(X < k) for X ~ Binomial(n, ½), accumulated term by term.
    let mut k = 0;
    let mut below = 0.0f64;
    let mut term = 0.5f64.powi(n as i32); // P(X = 0)
    while below + term <= 0.025 {
        below += term;
        term *= (n - k) as f64 / (k + 1) as f64;
        k += 1;
    }
    // k is now the largest count with P(X < k) ≤ 2.5 %; 1-based x₍ₖ₎ is sorted[k − 1].
    let k = k.max(1);
    Some((sorted[n / 2], sorted[k - 1], sorted[n - k]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_interval_takes_the_binomial_order_statistics() {
        let values: Vec<f64> = (1..=15).map(f64::from).collect();
        // n = 15: P(X ≤ 3) = 1.76 % ≤ 2.5 % < P(X ≤ 4) = 5.9 % → the 4th and the 12th.
        assert_eq!(median_interval(&values), Some((8.0, 4.0, 12.0)));
        let values: Vec<f64> = (1..=6).map(f64::from).collect();
        assert_eq!(median_interval(&values), Some((4.0, 1.0, 6.0)));
        assert_eq!(median_interval(&[1.0, 2.0, 3.0]), None);
    }
}
