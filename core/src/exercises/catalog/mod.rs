//! The exercises: each draws its numbers from a seed, asks a question, and takes its answer
//! from the predictor's own functions (never typed in). One file per topic, in the order the
//! course walks them: `bytes_per_parameter` (a dtype, full fine-tuning, mixed precision),
//! `lora`, `quantization` (NF4 and QLoRA), `activations` (and checkpointing, efficient
//! attention), `accumulation`, `optimizer_state` (8-bit AdamW, FP8), `logits`, `time` (the
//! roofline), `many_gpus` (ZeRO, FSDP, DDP's all-reduce), `offload`, `will_it_fit`, `preference` (DPO's
//! reference, DPO against ORPO). This file holds what they
//! share: the drawn instance, the seeded draw, the presets and the answer helpers.

mod accumulation;
mod activations;
mod bytes_per_parameter;
mod logits;
mod lora;
mod many_gpus;
mod offload;
mod optimizer_state;
mod preference;
mod quantization;
mod time;
mod will_it_fit;

use serde::Serialize;

use super::answer::{Dimension, Expected};
use crate::config::{AttentionKind, LlamaConfig, LoraConfig};
use crate::rng::SplitMix64;

/// The sandbox settings an exercise's scenario corresponds to (the browser app loads them
/// after a correct answer).
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct SandboxSettings {
    /// Model preset name.
    pub preset: String,
    /// LoRA rank (0: full fine-tuning).
    pub lora_r: usize,
    /// NF4 base.
    pub nf4: bool,
    /// Double quantization.
    pub double_quant: bool,
    /// Gradient checkpointing.
    pub checkpointing: bool,
    /// Eager or memory-efficient attention.
    pub attention: AttentionKind,
    /// Micro-batch.
    pub micro_batch: usize,
    /// Sequence length.
    pub seq_len: usize,
    /// Accumulation steps.
    pub accumulation: usize,
    /// What the step minimises (with a preference objective `micro_batch` counts pairs and
    /// `seq_len` each of their sequences).
    pub objective: crate::config::ObjectiveKind,
    /// GPUs.
    pub gpus: u64,
    /// Device preset id, when the question names one.
    pub device: Option<String>,
}

/// One drawn exercise.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Instance {
    /// Stable id (`full-ft-adamw`).
    pub id: &'static str,
    /// Title.
    pub title: &'static str,
    /// The seed it was drawn with.
    pub seed: u64,
    /// The question, numbers filled in.
    pub question: String,
    /// The predictor's answer.
    pub expected: Expected,
    /// A nudge.
    pub hint: String,
    /// The napkin working, with the numbers.
    pub explanation: String,
    /// The sandbox scenario to show after a correct answer.
    pub sandbox: Option<SandboxSettings>,
}

/// An exercise: an id, a title and how to draw an instance.
pub struct Exercise {
    /// Stable id.
    pub id: &'static str,
    /// Title.
    pub title: &'static str,
    make: fn(&mut Draw) -> Drawn,
}

/// What an exercise's generator returns.
struct Drawn {
    question: String,
    expected: Expected,
    hint: String,
    explanation: String,
    sandbox: Option<SandboxSettings>,
}

/// A deterministic draw (splitmix64) from the exercise id and the seed.
struct Draw(SplitMix64);

impl Draw {
    fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[(self.0.next_u64() % items.len() as u64) as usize].clone()
    }
}

const PRESETS: [(&str, &str); 5] = [
    ("smollm2-135m", "SmolLM2-135M"),
    ("tinyllama-1.1b", "TinyLlama-1.1B"),
    ("llama-3.2-1b", "Llama-3.2-1B"),
    ("llama-2-7b", "Llama-2-7B"),
    ("llama-3-8b", "Llama-3-8B"),
];

fn model(
    d: &mut Draw,
    presets: &[(&'static str, &'static str)],
) -> (&'static str, &'static str, LlamaConfig) {
    let (id, name) = d.pick(presets);
    let config = LlamaConfig::preset(id).unwrap_or_else(|_| LlamaConfig::smollm2_135m());
    (id, name, config)
}

fn gb(bytes: f64) -> String {
    format!(
        "{:.3} GB ({:.3} GiB)",
        bytes / 1e9,
        bytes / (1u64 << 30) as f64
    )
}

fn mb(bytes: f64) -> String {
    format!(
        "{:.2} MB ({:.2} MiB)",
        bytes / 1e6,
        bytes / (1u64 << 20) as f64
    )
}

fn expected(dimension: Dimension, value: f64, display: String) -> Expected {
    Expected {
        dimension,
        value,
        display,
        tolerance: 0.01,
        choices: vec![],
        mistakes: vec![],
        unit: None,
    }
}

fn with_mistakes(mut e: Expected, mistakes: &[(&str, f64)]) -> Expected {
    e.mistakes = mistakes.iter().map(|(m, v)| (m.to_string(), *v)).collect();
    e
}

fn sandbox(preset: &str, lora_r: usize, nf4: bool, seq_len: usize) -> SandboxSettings {
    SandboxSettings {
        preset: preset.into(),
        lora_r,
        nf4,
        double_quant: nf4,
        micro_batch: 1,
        seq_len,
        accumulation: 1,
        gpus: 1,
        ..SandboxSettings::default()
    }
}

fn lora(r: usize) -> LoraConfig {
    LoraConfig {
        r,
        alpha: 2.0 * r as f64,
        ..LoraConfig::default()
    }
}

/// Every exercise, in teaching order (the topics in the order the course walks them).
pub fn catalog() -> Vec<Exercise> {
    [
        bytes_per_parameter::exercises(),
        lora::exercises(),
        quantization::exercises(),
        activations::exercises(),
        accumulation::exercises(),
        optimizer_state::exercises(),
        logits::exercises(),
        time::exercises(),
        many_gpus::exercises(),
        offload::exercises(),
        will_it_fit::exercises(),
        preference::exercises(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Draws exercise `id` with `seed`.
pub fn instance(id: &str, seed: u64) -> Option<Instance> {
    let exercise = catalog().into_iter().find(|e| e.id == id)?;
    let hash = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    let mut draw = Draw(SplitMix64(hash ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
    let drawn = (exercise.make)(&mut draw);
    Some(Instance {
        id: exercise.id,
        title: exercise.title,
        seed,
        question: drawn.question,
        expected: drawn.expected,
        hint: drawn.hint,
        explanation: drawn.explanation,
        sandbox: drawn.sandbox,
    })
}
