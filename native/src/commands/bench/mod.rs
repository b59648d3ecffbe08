//! `napkin bench`: benchmarks that decide engineering choices. Figures are printed, never
//! asserted (speed targets live in benchmarks, not in tests).
//!
//! - `matmul`: f32 GEMM throughput on every CPU backend compiled in (`matmul.rs`).
//! - `generate`: prefill and KV-cached decoding of a real checkpoint (`generate.rs`).
//! - `suite`: the performance suite, each case beside PyTorch in the same run (`suite.rs`).
//! - `gpu`: QLoRA and LoRA training steps on the first GPU found (`gpu.rs`).

mod cases;
mod generate;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod gpu;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod gpu_dequant;
mod matmul;
mod process_memory;
mod reference;
mod runner;
mod suite;

use anyhow::Result;

use crate::cli::{BenchArgs, BenchCase};

pub fn run(args: &BenchArgs) -> Result<()> {
    match args.what {
        BenchCase::Matmul => matmul::run(args),
        BenchCase::Generate => generate::run(args),
        BenchCase::Suite => suite::run(args),
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        BenchCase::Gpu => gpu::run(args),
        #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
        BenchCase::Gpu => anyhow::bail!(
            "this build has no GPU backend; rebuild with `--features wgpu` or `--features cuda` \
             (scripts/bench-gpu.sh does)"
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
