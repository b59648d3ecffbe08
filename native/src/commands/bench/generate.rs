//! `napkin bench generate`: generation with a real checkpoint: the prompt pass (prefill) and
//! KV-cached decoding of a fixed number of greedy tokens, in tokens/s.

use std::time::Instant;

use anyhow::{Context, Result};
use napkin_core::device::DeviceKind;
use napkin_core::io::load_model;
use napkin_core::model::generate::{KvCache, Sampling, choose};
use napkin_core::rng::SplitMix64;
use napkin_core::tokenizer::tokenizer_for_model;

use super::spread;
use crate::cli::BenchArgs;

pub fn run(args: &BenchArgs) -> Result<()> {
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
    let threads = napkin_core::device::compute_thread_count();
    println!(
        "generation, {} on {} ({threads} threads), {} runs after a warm-up",
        args.model.display(),
        kind.backend_name(),
        runs.len()
    );
    for (name, tokens, values) in [
        (
            "prompt (prefill)",
            prompt.len(),
            runs.iter().map(|r| r.0).collect::<Vec<_>>(),
        ),
        (
            "decode (KV cache)",
            args.tokens,
            runs.iter().map(|r| r.1).collect::<Vec<_>>(),
        ),
    ] {
        let Some((median, min, max)) = spread(&values) else {
            continue;
        };
        println!(
            "{name:<20} {tokens:>5} tokens: {median:>8.1} tokens/s (min {min:.1}, max {max:.1})"
        );
    }
    Ok(())
}
