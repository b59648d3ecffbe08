//! `napkin bench`: micro-benchmarks that decide engineering choices. Figures are printed, never
//! asserted (speed targets live in benchmarks, not in tests).
//!
//! `napkin bench matmul` measures f32 GEMM throughput on the shapes that dominate training a
//! SmolLM2-sized model (256 tokens × 576 → 1536 for the MLP, × 49152 for the LM head) and a
//! square 1024³ one, on every CPU backend compiled in.
//!
//! `napkin bench generate` measures generation: the prompt pass (prefill) and KV-cached
//! decoding of a fixed number of greedy tokens, in tokens/s.

use std::time::Instant;

use anyhow::{Context, Result};
use burn::tensor::{Device, Distribution, Tensor};
use napkin_core::device::DeviceKind;
use napkin_core::io::load_model;
use napkin_core::model::generate::{KvCache, Sampling, SplitMix64, choose};
use napkin_core::tokenizer::tokenizer_for_model;

use crate::cli::{BenchArgs, BenchCase};

pub fn run(args: &BenchArgs) -> Result<()> {
    match args.what {
        BenchCase::Matmul => matmul(args),
        BenchCase::Generate => generate(args),
    }
}

fn matmul(args: &BenchArgs) -> Result<()> {
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
        print!("{:<34}", kind.backend_name());
        for (m, k, n) in shapes {
            print!("{:>18.1}", matmul_gflops(&device, m, k, n, args.runs));
        }
        println!();
    }
    Ok(())
}

/// Median GFLOP/s of `[m, k] × [k, n]`.
pub fn matmul_gflops(device: &Device, m: usize, k: usize, n: usize, runs: usize) -> f64 {
    let a: Tensor<2> = Tensor::random([m, k], Distribution::Normal(0.0, 1.0), device);
    let b: Tensor<2> = Tensor::random([k, n], Distribution::Normal(0.0, 1.0), device);
    let flops = 2.0 * (m * k * n) as f64;
    let once = || {
        let start = Instant::now();
        let c = a.clone().matmul(b.clone());
        let _ = device.sync();
        drop(c);
        start.elapsed().as_secs_f64()
    };
    once(); // warm-up: thread pool start, first-touch of buffers
    let mut times: Vec<f64> = (0..runs.max(1)).map(|_| once()).collect();
    times.sort_by(f64::total_cmp);
    flops / times[times.len() / 2] / 1e9
}

/// Median, min and max of a set of figures.
fn spread(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    (
        values[values.len() / 2],
        values[0],
        values[values.len() - 1],
    )
}

fn generate(args: &BenchArgs) -> Result<()> {
    let kind = DeviceKind::Cpu;
    let device = kind.open()?;
    let model = load_model(&args.model, &device)
        .with_context(|| format!("loading {}", args.model.display()))?;
    let tokenizer = tokenizer_for_model(&args.model, None)?;
    let prompt =
        tokenizer.encode("The quick brown fox jumps over the lazy dog. Once upon a time")?;
    let sampling = Sampling::default();
    let once = || -> Result<(f64, f64)> {
        let start = Instant::now();
        let mut cache = KvCache::default();
        let mut logits = model.next_token_logits(&prompt, &mut cache)?;
        let prefill = start.elapsed().as_secs_f64();
        let mut rng = SplitMix64(0);
        let start = Instant::now();
        for _ in 0..args.tokens {
            let next = choose(&logits, &sampling, &mut rng);
            logits = model.next_token_logits(&[next], &mut cache)?;
        }
        let decode = start.elapsed().as_secs_f64();
        Ok((
            prompt.len() as f64 / prefill.max(1e-9),
            args.tokens as f64 / decode.max(1e-9),
        ))
    };
    once()?; // warm-up
    let runs: Vec<(f64, f64)> = (0..args.runs.max(1))
        .map(|_| once())
        .collect::<Result<_>>()?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "generation, {} on {} ({threads} hardware threads), {} runs after a warm-up",
        args.model.display(),
        kind.backend_name(),
        runs.len()
    );
    for (name, tokens, values) in [
        (
            "prompt (prefill)",
            prompt.len(),
            runs.iter().map(|r| r.0).collect(),
        ),
        (
            "decode (KV cache)",
            args.tokens,
            runs.iter().map(|r| r.1).collect(),
        ),
    ] {
        let (median, min, max) = spread(values);
        println!(
            "{name:<20} {tokens:>5} tokens: {median:>8.1} tokens/s (min {min:.1}, max {max:.1})"
        );
    }
    Ok(())
}
