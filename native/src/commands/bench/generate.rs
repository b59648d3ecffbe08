//! `napkin bench generate`: generation with a real GGUF checkpoint, prompt pass (prefill) and
//! KV-cached greedy decoding in tokens/s, for napkin's engines — the weights kept in their GGUF
//! blocks (`QuantizedLlama`, integer SIMD products on 16-bit activations, napkin's default, and
//! on 8-bit ones, llama.cpp's choice) and the float model (every weight dequantized to f32) —
//! and, with `--reference PYTHON`, llama.cpp
//! (llama-cpp-python) on the same file, the same token ids, threads and token counts. With
//! `--nf4`, a QLoRA base instead of the f32 model: the block linears quantized to NF4 as
//! training does, run on their codes (`Nf4` products) and by the float model that dequantizes
//! them (what `generate` ran under an NF4-trained adapter before the codes were kept).
//!
//! The engines' timed runs alternate (llama.cpp, napkin's three, llama.cpp, …) so that a slow
//! spell of the machine falls on all of them; each ratio is taken per round and reported as
//! the median with a distribution-free 95 % interval. Resident size of each engine: the
//! process's `VmRSS` growth through its load and one run, freed heap handed back first
//! (`VmRSS` counts the file's mapped pages an engine reads as well as its own copies; llama.cpp's
//! side is measured the same way in its process).

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use napkin_core::config::Nf4Config;
use napkin_core::device::DeviceKind;
use napkin_core::io::gguf::{GgufFile, load_gguf_quantized_with};
use napkin_core::io::load_model_with;
use napkin_core::kernels::cpu::quantized::ActivationBits;
use napkin_core::model::generate::{NextToken, Sampling, choose};
use napkin_core::rng::SplitMix64;
use napkin_core::tokenizer::tokenizer_for_model;
use serde_json::Value;

use super::process_memory::{resident_bytes, restart_peak};
use super::{median_interval, spread};
use crate::cli::BenchArgs;

/// The prompt: 29 tokens with SmolLM2's tokenizer.
const PROMPT: &str = "The quick brown fox jumps over the lazy dog. Once upon a time, in a small \
                      village by the sea, there lived an old fisherman who";

/// One timed run: prompt and decode tokens/s.
type Speed = (f64, f64);

/// Something that runs once when asked.
trait Engine {
    fn run_once(&mut self) -> Result<Speed>;
}

/// One of napkin's engines with its prompt.
struct Napkin<'a, M: NextToken> {
    model: &'a M,
    prompt: &'a [u32],
    new_tokens: usize,
}

impl<M: NextToken> Engine for Napkin<'_, M> {
    fn run_once(&mut self) -> Result<Speed> {
        let start = Instant::now();
        let mut cache = M::Cache::default();
        let mut logits = self.model.next_token_logits(self.prompt, &mut cache)?;
        let prefill = start.elapsed().as_secs_f64();
        let mut rng = SplitMix64(0);
        let start = Instant::now();
        for _ in 0..self.new_tokens {
            let next = choose(&logits, &Sampling::default(), &mut rng);
            logits = self.model.next_token_logits(&[next], &mut cache)?;
        }
        let decode = start.elapsed().as_secs_f64();
        Ok((
            self.prompt.len() as f64 / prefill.max(1e-9),
            self.new_tokens as f64 / decode.max(1e-9),
        ))
    }
}

/// llama.cpp in `scripts/reference/generate.py`, answering `run` lines.
struct LlamaCpp {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl LlamaCpp {
    /// Starts the reference; returns it with its resident growth and settings.
    fn start(
        python: &Path,
        model: &Path,
        prompt: &[u32],
        threads: usize,
        tokens: usize,
    ) -> Result<(Self, Option<u64>, String)> {
        // Started with the whole process's CPUs, not this pinned compute thread's one (a child
        // inherits the mask: on one CPU llama.cpp ran at ~55 % of its speed).
        let mut child = napkin_core::device::spawn_unpinned(
            Command::new(python)
                .arg("scripts/reference/generate.py")
                .arg(model)
                .args(["--threads", &threads.to_string()])
                .args(["--tokens", &tokens.to_string()])
                .args(["--prompt-ids", &serde_json::to_string(prompt)?])
                .env("OMP_NUM_THREADS", threads.to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit()),
        )
        .with_context(|| format!("starting {}", python.display()))?;
        let stdin = child.stdin.take().context("the reference's stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("the reference's stdout")?);
        let mut reference = LlamaCpp {
            child,
            stdin,
            stdout,
        };
        let hello = reference.read_line()?;
        Ok((
            reference,
            hello["resident_bytes"].as_u64(),
            hello["settings"].to_string(),
        ))
    }

    fn read_line(&mut self) -> Result<Value> {
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            bail!(
                "the llama.cpp reference stopped (is llama-cpp-python installed in that Python?)"
            );
        }
        serde_json::from_str(&line).with_context(|| format!("the reference said: {line}"))
    }
}

impl Engine for LlamaCpp {
    fn run_once(&mut self) -> Result<Speed> {
        writeln!(self.stdin, "run")?;
        self.stdin.flush()?;
        let answer = self.read_line()?;
        match (answer["prefill"].as_f64(), answer["decode"].as_f64()) {
            (Some(p), Some(d)) => Ok((p, d)),
            _ => bail!("the llama.cpp reference answered {answer}"),
        }
    }
}

impl Drop for LlamaCpp {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        let _ = self.child.wait();
    }
}

pub fn run(args: &BenchArgs) -> Result<()> {
    let path = &args.model;
    let is_gguf = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    let tokenizer = tokenizer_for_model(path, None)?;
    let prompt = tokenizer.encode(PROMPT)?;
    let threads = napkin_core::device::compute_thread_count();
    let runs = args.runs.max(1);
    println!(
        "generation, {}: {} prompt tokens, {} greedy new tokens, {threads} threads; a warm-up \
         each, then {runs} rounds with the engines' runs alternating",
        path.display(),
        prompt.len(),
        args.tokens,
    );

    // Load everything first, measuring each load's resident growth.
    let mut reference = match &args.reference {
        Some(python) => {
            let (r, resident, settings) =
                LlamaCpp::start(python, path, &prompt, threads, args.tokens)?;
            println!("llama.cpp settings: {settings}");
            Some((r, resident))
        }
        None => None,
    };
    // Each engine's resident growth through its load and one run: a memory-mapped file's pages
    // become resident when a product first reads them, not at load.
    let grown_while = |load: &mut dyn FnMut() -> Result<()>| -> Result<Option<u64>> {
        restart_peak();
        let before = resident_bytes();
        load()?;
        restart_peak();
        Ok(resident_bytes()
            .zip(before)
            .map(|(a, b)| a.saturating_sub(b)))
    };
    // With `--nf4`: QLoRA's base (`train --nf4 --double-quant`).
    let nf4 = args.nf4.then_some(Nf4Config {
        block_size: 64,
        double_quant: true,
    });
    let mut blocks = None;
    let blocks_resident = if is_gguf {
        grown_while(&mut || {
            let gguf = GgufFile::open(path)?;
            let model = load_gguf_quantized_with(&gguf, nf4.as_ref())
                .with_context(|| format!("loading {} with its blocks kept", path.display()))?;
            drop(gguf);
            Napkin {
                model: &model,
                prompt: &prompt,
                new_tokens: args.tokens,
            }
            .run_once()?;
            blocks = Some(model);
            Ok(())
        })?
    } else {
        None
    };
    let mut float = None;
    let float_resident = if args.no_float {
        None
    } else {
        grown_while(&mut || {
            let model = load_model_with(path, &DeviceKind::Cpu.open()?, nf4.as_ref())
                .with_context(|| format!("loading {}", path.display()))?;
            Napkin {
                model: &model,
                prompt: &prompt,
                new_tokens: args.tokens,
            }
            .run_once()?;
            float = Some(model);
            Ok(())
        })?
    };

    let narrow = blocks
        .clone()
        .map(|m| m.with_activation_bits(ActivationBits::Eight));
    let mut engines: Vec<(&str, Box<dyn Engine + '_>, Option<u64>)> = Vec::new();
    if let Some((r, resident)) = reference.take() {
        engines.push(("llama.cpp", Box::new(r), resident));
    }
    let names = if nf4.is_some() {
        [
            "napkin, NF4 codes, 16-bit",
            "napkin, NF4 codes, 8-bit",
            "napkin, NF4 → f32",
        ]
    } else {
        [
            "napkin, blocks, 16-bit",
            "napkin, blocks, 8-bit",
            "napkin, f32 weights",
        ]
    };
    for (name, model) in [(names[0], &blocks), (names[1], &narrow)] {
        if let Some(model) = model {
            let engine = Napkin {
                model,
                prompt: &prompt,
                new_tokens: args.tokens,
            };
            engines.push((name, Box::new(engine), blocks_resident));
        }
    }
    if let Some(model) = &float {
        let engine = Napkin {
            model,
            prompt: &prompt,
            new_tokens: args.tokens,
        };
        engines.push((names[2], Box::new(engine), float_resident));
    }
    for (_, engine, _) in &mut engines {
        engine.run_once()?; // warm-up
    }
    let mut speeds: Vec<Vec<Speed>> = vec![Vec::new(); engines.len()];
    for _ in 0..runs {
        for ((_, engine, _), figures) in engines.iter_mut().zip(&mut speeds) {
            figures.push(engine.run_once()?);
        }
    }

    println!(
        "{:<25} {:>26} {:>26} {:>12}",
        "engine", "prompt tokens/s", "decode tokens/s", "resident MB"
    );
    let show = |v: Vec<f64>| match spread(&v) {
        Some((median, min, max)) => format!("{median:.1} ({min:.1}–{max:.1})"),
        None => "-".into(),
    };
    for ((name, _, resident), figures) in engines.iter().zip(&speeds) {
        println!(
            "{name:<25} {:>26} {:>26} {:>12}",
            show(figures.iter().map(|s| s.0).collect()),
            show(figures.iter().map(|s| s.1).collect()),
            resident.map_or("-".into(), |b| format!("{:.0}", b as f64 / 1e6))
        );
    }
    println!("(median, min–max of the rounds)");
    if args.reference.is_some() {
        for i in 1..engines.len() {
            let name = engines[i].0;
            let ratio = |pick: fn(&Speed) -> f64| {
                let per_round: Vec<f64> = speeds[i]
                    .iter()
                    .zip(&speeds[0])
                    .map(|(ours, theirs)| pick(ours) / pick(theirs))
                    .collect();
                match median_interval(&per_round) {
                    Some((m, lo, hi)) => format!("{m:.2}× (95 % interval {lo:.2}–{hi:.2})"),
                    None => spread(&per_round).map_or("-".into(), |(m, lo, hi)| {
                        format!(
                            "{m:.2}× (min–max {lo:.2}–{hi:.2}; 6 runs or more give an interval)"
                        )
                    }),
                }
            };
            println!(
                "{name} ÷ llama.cpp per round: prompt {}, decode {}",
                ratio(|s| s.0),
                ratio(|s| s.1)
            );
        }
    }
    Ok(())
}
