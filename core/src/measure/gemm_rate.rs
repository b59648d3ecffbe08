//! f32 GEMM throughput of one product shape on a device: the figure `napkin bench matmul`
//! prints natively and the page measures in the browser, from the same code, so the two can be
//! put side by side (the browser's WebAssembly against the native build on one machine).

use web_time::Instant;

use burn::tensor::{Device, Distribution, Tensor};
use serde::{Deserialize, Serialize};

use crate::model::matmul_wt::matmul_wt;

/// Which product is timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Product {
    /// burn's plain `a · b`, `a: [m, k]`, `b: [k, n]`.
    AB,
    /// napkin's linear-layer product `x · Wᵀ`, `x: [m, k]`, `W: [n, k]` (the training step's).
    XWt,
}

impl Product {
    /// The product in words, as the benchmarks print it.
    pub fn label(self) -> &'static str {
        match self {
            Product::AB => "a·b",
            Product::XWt => "x·Wᵀ",
        }
    }
}

/// `(m, k, n)` of a product.
pub type GemmShape = (usize, usize, usize);

/// The shapes the page times and `napkin bench matmul --page-shapes` times natively: the page's
/// own training run (tiny-smol, B·T = 64 tokens: the MLP's 144 → 384 and the tied head's
/// 144 → 512), SmolLM2-135M's MLP on 256 tokens (576 → 1536) and a square 512³.
pub const PAGE_GEMM_SHAPES: [GemmShape; 4] = [
    (64, 144, 384),
    (64, 144, 512),
    (256, 576, 1536),
    (512, 512, 512),
];

/// Shortest timed run: a browser's clock is coarse (Chromium rounds `performance.now()` to
/// 0.1 ms without cross-origin isolation), so a small product is repeated until one timed run
/// lasts this long.
const MIN_TIMED_SECONDS: f64 = 0.02;

/// Median GFLOP/s of `product` at `(m, k, n)` on `device` over `runs` timed runs after one
/// warm-up (thread-pool start, first touch of the buffers), each run repeating the product
/// enough times to last [`MIN_TIMED_SECONDS`]. Each product waits for the device.
pub fn gemm_gflops(device: &Device, product: Product, (m, k, n): GemmShape, runs: usize) -> f64 {
    let left: Tensor<2> = Tensor::random([m, k], Distribution::Normal(0.0, 1.0), device);
    let right: Tensor<2> = match product {
        Product::AB => Tensor::random([k, n], Distribution::Normal(0.0, 1.0), device),
        Product::XWt => Tensor::random([n, k], Distribution::Normal(0.0, 1.0), device),
    };
    let timed = |repeats: usize| {
        let start = Instant::now();
        for _ in 0..repeats {
            let c = match product {
                Product::AB => left.clone().matmul(right.clone()),
                Product::XWt => matmul_wt(left.clone(), right.clone()),
            };
            let _ = device.sync();
            drop(c);
        }
        start.elapsed().as_secs_f64() / repeats as f64
    };
    let first = timed(1);
    // From the warm-up's time (at least a clock tick), capped so a slow clock cannot ask for
    // an endless run.
    let repeats = (MIN_TIMED_SECONDS / first.max(1e-4))
        .ceil()
        .clamp(1.0, 10_000.0) as usize;
    let mut times: Vec<f64> = (0..runs.max(1)).map(|_| timed(repeats)).collect();
    times.sort_by(f64::total_cmp);
    2.0 * (m * k * n) as f64 / times[times.len() / 2] / 1e9
}

/// One product's rate at one shape, as the page and `bench matmul --page-shapes` report it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GemmFigure {
    /// [`Product::label`].
    pub product: String,
    /// Rows of the left operand.
    pub m: usize,
    /// The contracted dimension.
    pub k: usize,
    /// Columns of the result.
    pub n: usize,
    /// Median GFLOP/s.
    pub gflops: f64,
}

/// Both products at every [`PAGE_GEMM_SHAPES`] shape on `device`, on the calling thread's
/// rayon pool (`runs` as in [`gemm_gflops`]).
pub fn page_gemm_figures(device: &Device, runs: usize) -> Vec<GemmFigure> {
    let mut figures = Vec::new();
    for product in [Product::AB, Product::XWt] {
        for shape @ (m, k, n) in PAGE_GEMM_SHAPES {
            figures.push(GemmFigure {
                product: product.label().to_string(),
                m,
                k,
                n,
                gflops: gemm_gflops(device, product, shape, runs),
            });
        }
    }
    figures
}
