//! `napkin bench generate`: generation with a real GGUF checkpoint, prompt pass (prefill) and
//! KV-cached greedy decoding in tokens/s, for both of napkin's engines — the weights kept in
//! their GGUF blocks (`QuantizedLlama`: 8-bit activations, integer SIMD products) and the float
//! model (every weight dequantized to f32) — and, with `--reference PYTHON`, llama.cpp
//! (llama-cpp-python) on the same file, the same token ids, threads and token counts.
//!
//! Resident size of each engine: the process's `VmRSS` growth while it loads (the file is
//! memory-mapped and read; what stays is the engine's own copy).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use napkin_core::device::DeviceKind;
use napkin_core::io::gguf::{GgufFile, load_gguf_quantized};
use napkin_core::io::load_model;
use napkin_core::model::generate::{NextToken, Sampling, choose};
use napkin_core::rng::SplitMix64;
use napkin_core::tokenizer::tokenizer_for_model;
use serde_json::Value;

use super::process_memory::{resident_bytes, restart_peak};
use super::spread;
use crate::cli::BenchArgs;

/// The prompt: 32 tokens with SmolLM2's tokenizer.
const PROMPT: &str = "The quick brown fox jumps over the lazy dog. Once upon a time, in a small \
                      village by the sea, there lived an old fisherman who";

/// Prompt and decode tokens/s of each timed run.
struct Speeds {
    prefill: Vec<f64>,
    decode: Vec<f64>,
}

pub fn run(args: &BenchArgs) -> Result<()> {
    let path = &args.model;
    let is_gguf = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    let tokenizer = tokenizer_for_model(path, None)?;
    let prompt = tokenizer.encode(PROMPT)?;
    let threads = napkin_core::device::compute_thread_count();
    println!(
        "generation, {}: {} prompt tokens, {} greedy new tokens, {threads} threads, {} timed runs \
         after a warm-up (median, min–max)",
        path.display(),
        prompt.len(),
        args.tokens,
        args.runs.max(1)
    );

    let mut rows: Vec<(String, Speeds, Option<u64>)> = Vec::new();
    // llama.cpp first, while this process has not yet started a compute thread (its idle
    // threads halved llama.cpp's figures on two cores when it ran last).
    if let Some(python) = &args.reference {
        let (speeds, resident, settings) = llama_cpp(python, path, &prompt, threads, args)?;
        println!("llama.cpp settings: {settings}");
        rows.push(("llama.cpp".into(), speeds, resident));
    }

    if is_gguf {
        restart_peak();
        let before = resident_bytes();
        let gguf = GgufFile::open(path)?;
        let model = load_gguf_quantized(&gguf)
            .with_context(|| format!("loading {} with its blocks kept", path.display()))?;
        drop(gguf);
        let grown = resident_bytes()
            .zip(before)
            .map(|(a, b)| a.saturating_sub(b));
        rows.push((
            "napkin, GGUF blocks".into(),
            time_engine(&model, &prompt, args)?,
            grown,
        ));
    }
    {
        restart_peak();
        let before = resident_bytes();
        let model = load_model(path, &DeviceKind::Cpu.open()?)
            .with_context(|| format!("loading {}", path.display()))?;
        let grown = resident_bytes()
            .zip(before)
            .map(|(a, b)| a.saturating_sub(b));
        rows.push((
            "napkin, f32 weights".into(),
            time_engine(&model, &prompt, args)?,
            grown,
        ));
    }
    println!(
        "{:<22} {:>26} {:>26} {:>12}",
        "engine", "prompt tokens/s", "decode tokens/s", "resident MB"
    );
    let show = |v: &[f64]| match spread(v) {
        Some((median, min, max)) => format!("{median:.1} ({min:.1}–{max:.1})"),
        None => "-".into(),
    };
    for (name, speeds, resident) in &rows {
        println!(
            "{name:<22} {:>26} {:>26} {:>12}",
            show(&speeds.prefill),
            show(&speeds.decode),
            resident.map_or("-".into(), |b| format!("{:.0}", b as f64 / 1e6))
        );
    }
    if let (Some((_, theirs, _)), Some((_, ours, _))) = (rows.first(), rows.get(1))
        && args.reference.is_some()
        && is_gguf
    {
        let ratio = |a: &[f64], b: &[f64]| match (spread(a), spread(b)) {
            (Some((a, ..)), Some((b, ..))) => format!("{:.2}×", a / b),
            _ => "-".into(),
        };
        println!(
            "napkin (blocks) ÷ llama.cpp, medians: prompt {}, decode {}",
            ratio(&ours.prefill, &theirs.prefill),
            ratio(&ours.decode, &theirs.decode)
        );
    }
    Ok(())
}

/// Warm-up, then `args.runs` timed runs of prefill + `args.tokens` greedy decode steps.
fn time_engine(model: &impl NextToken, prompt: &[u32], args: &BenchArgs) -> Result<Speeds> {
    let once = || -> Result<(f64, f64)> {
        let start = Instant::now();
        let mut cache = Default::default();
        let mut logits = model.next_token_logits(prompt, &mut cache)?;
        let prefill = start.elapsed().as_secs_f64();
        let mut rng = SplitMix64(0);
        let start = Instant::now();
        for _ in 0..args.tokens {
            let next = choose(&logits, &Sampling::default(), &mut rng);
            logits = model.next_token_logits(&[next], &mut cache)?;
        }
        let decode = start.elapsed().as_secs_f64();
        Ok((
            prompt.len() as f64 / prefill.max(1e-9),
            args.tokens as f64 / decode.max(1e-9),
        ))
    };
    once()?;
    let runs: Vec<(f64, f64)> = (0..args.runs.max(1))
        .map(|_| once())
        .collect::<Result<_>>()?;
    Ok(Speeds {
        prefill: runs.iter().map(|r| r.0).collect(),
        decode: runs.iter().map(|r| r.1).collect(),
    })
}

/// llama.cpp's figures from `scripts/bench_generate_reference.py`: speeds, resident growth
/// while loading, and its settings as it reports them.
fn llama_cpp(
    python: &Path,
    model: &Path,
    prompt: &[u32],
    threads: usize,
    args: &BenchArgs,
) -> Result<(Speeds, Option<u64>, String)> {
    // Started with the whole process's CPUs, not this pinned compute thread's one (a child
    // inherits the mask: on one CPU llama.cpp ran at ~55 % of its speed).
    let child = napkin_core::device::spawn_unpinned(
        Command::new(python)
            .arg("scripts/bench_generate_reference.py")
            .arg(model)
            .args(["--threads", &threads.to_string()])
            .args(["--tokens", &args.tokens.to_string()])
            .args(["--runs", &args.runs.max(1).to_string()])
            .args(["--prompt-ids", &serde_json::to_string(prompt)?])
            .env("OMP_NUM_THREADS", threads.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )
    .with_context(|| format!("starting {}", python.display()))?;
    let output = child.wait_with_output()?;
    if !output.status.success() {
        bail!(
            "the llama.cpp reference failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let report: Value = serde_json::from_slice(&output.stdout)
        .context("the llama.cpp reference printed no JSON report")?;
    let figures = |key: &str| -> Vec<f64> {
        report[key]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_default()
    };
    Ok((
        Speeds {
            prefill: figures("prefill"),
            decode: figures("decode"),
        },
        report["resident_bytes"].as_u64(),
        report["settings"].to_string(),
    ))
}
