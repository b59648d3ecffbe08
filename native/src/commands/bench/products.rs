//! `napkin bench products`: the quantized products that generation runs, alone — one
//! `[5632, 2048]` weight (TinyLlama-1.1B's MLP projections, the largest of its layers) in each
//! block format, times one token (decoding) and 32 (a prompt), with 8- and 16-bit activations.
//!
//! Two timings per case: the same matrix again and again (its blocks in the cache after the
//! first run: the kernel's own speed), and twelve matrices in turn (more than the last-level
//! cache holds: the blocks stream from memory, as in decoding, where every layer's weights are
//! read once per token). Weight bytes per second against the machine's memory bandwidth says
//! whether a case is bound by memory or by instructions. Then the quantization of one token's
//! input, which one thread does before each product.

use std::hint::black_box;
use std::time::Instant;

use anyhow::Result;
use half::f16;
use napkin_core::kernels::cpu::quantized::{
    ActivationBits, BlockFormat, QuantizedActivations, QuantizedMatrix, SUPER_BLOCK,
};
use napkin_core::rng::SplitMix64;

use super::spread;
use crate::cli::BenchArgs;

const ROWS: usize = 5632;
const COLS: usize = 2048;
/// Matrices streamed in turn: 12 × 6.5 MB (Q4_K) or more, past a 32 MB last-level cache.
const STREAMED: usize = 12;

pub fn run(args: &BenchArgs) -> Result<()> {
    let runs = args.runs.max(3);
    println!(
        "quantized products, one [{ROWS}, {COLS}] weight (median µs of {runs} runs, min–max; \
         threads: {}; GB/s: weight bytes streamed per second)",
        rayon::current_num_threads()
    );
    println!(
        "{:<6} {:>4} {:>3} {:>24} {:>24} {:>8} {:>10}",
        "format", "bits", "T", "in cache µs", "streamed µs", "GB/s", "G MAC/s"
    );
    let chosen = |format: &BlockFormat| {
        args.only
            .as_deref()
            .is_none_or(|only| format!("{format:?}").contains(only))
    };
    for format in BlockFormat::BLOCKED.into_iter().filter(chosen) {
        let matrices: Vec<QuantizedMatrix> = (0..STREAMED as u64)
            .map(|seed| random_matrix(format, seed))
            .collect::<Result<_>>()?;
        for bits in [ActivationBits::Eight, ActivationBits::Sixteen] {
            for tokens in [1, 32] {
                let x = QuantizedActivations::with_bits(&activations(tokens, COLS), COLS, bits);
                let mut out = vec![0.0f32; tokens * ROWS];
                let mut time = |pick: &dyn Fn(usize) -> usize| -> Vec<f64> {
                    // Warm-up: every matrix once.
                    for m in &matrices {
                        m.matmul(&x, &mut out);
                    }
                    (0..runs * STREAMED)
                        .map(|i| {
                            let m = &matrices[pick(i)];
                            let start = Instant::now();
                            m.matmul(black_box(&x), &mut out);
                            black_box(&out);
                            start.elapsed().as_secs_f64() * 1e6
                        })
                        .collect()
                };
                let cached = time(&|_| 0);
                let streamed = time(&|i| i % STREAMED);
                let (Some(c), Some(s)) = (spread(&cached), spread(&streamed)) else {
                    continue;
                };
                let bytes = matrices[0].resident_bytes() as f64;
                let macs = (ROWS * COLS * tokens) as f64;
                println!(
                    "{:<6} {:>4} {:>3} {:>24} {:>24} {:>8.1} {:>10.1}",
                    format!("{format:?}"),
                    if bits == ActivationBits::Eight { 8 } else { 16 },
                    tokens,
                    format!("{:.0} ({:.0}–{:.0})", c.0, c.1, c.2),
                    format!("{:.0} ({:.0}–{:.0})", s.0, s.1, s.2),
                    bytes / s.0 / 1e3,
                    macs / c.0 / 1e3,
                );
            }
        }
    }
    quantization(runs);
    Ok(())
}

/// Each product's input quantized (one thread, while the others wait for the product): one
/// token's input of each size a 1.1B model's decode quantizes.
fn quantization(runs: usize) {
    println!("input quantization, one token (median µs of {runs} runs, min–max; one thread)");
    for cols in [COLS, ROWS] {
        let x = activations(1, cols);
        for bits in [ActivationBits::Eight, ActivationBits::Sixteen] {
            let times: Vec<f64> = (0..runs * 10)
                .map(|_| {
                    let start = Instant::now();
                    black_box(QuantizedActivations::with_bits(black_box(&x), cols, bits));
                    start.elapsed().as_secs_f64() * 1e6
                })
                .collect();
            if let Some((median, low, high)) = spread(&times) {
                println!(
                    "{cols:>6} values {:>3} bits {:>10}",
                    if bits == ActivationBits::Eight { 8 } else { 16 },
                    format!("{median:.2} ({low:.2}–{high:.2})")
                );
            }
        }
    }
}

/// Random blocks with scales like a real checkpoint's (|w| ≲ 0.1): every byte random, then
/// each (super-)block's f16 scales set (NF4's f32 absmax).
fn random_matrix(format: BlockFormat, seed: u64) -> Result<QuantizedMatrix> {
    let mut rng = SplitMix64(seed + 1);
    let mut bytes: Vec<u8> = (0..ROWS * format.row_bytes(COLS))
        .map(|_| rng.next_u64() as u8)
        .collect();
    let per = format.row_bytes(format.values_per_block());
    if format == BlockFormat::Nf4 {
        for unit in bytes.chunks_exact_mut(per) {
            let absmax = 0.1 * (0.5 + rng.next_f64() as f32);
            unit[..4].copy_from_slice(&absmax.to_le_bytes());
        }
        return QuantizedMatrix::new(format, ROWS, COLS, bytes).map_err(anyhow::Error::msg);
    }
    let (scales, at): (&[usize], f32) = match format {
        BlockFormat::Q4_0 | BlockFormat::Q8_0 => (&[0], 4e-3),
        BlockFormat::Q4_1 => (&[0, 2], 4e-3),
        BlockFormat::Q4K | BlockFormat::Q5K => (&[0, 2], 1e-4),
        BlockFormat::Q6K => (&[208], 2e-5),
        BlockFormat::Nf4 | BlockFormat::F32 => (&[], 0.0),
    };
    for block in bytes.chunks_exact_mut(per) {
        for &offset in scales {
            let d = f16::from_f32(at * (0.5 + rng.next_f64() as f32));
            block[offset..offset + 2].copy_from_slice(&d.to_le_bytes());
        }
    }
    debug_assert!(format.values_per_block() <= SUPER_BLOCK);
    QuantizedMatrix::new(format, ROWS, COLS, bytes).map_err(anyhow::Error::msg)
}

fn activations(tokens: usize, cols: usize) -> Vec<f32> {
    let mut rng = SplitMix64(99);
    (0..tokens * cols)
        .map(|_| rng.next_f64() as f32 * 2.0 - 1.0)
        .collect()
}
