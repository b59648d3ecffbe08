//! The exercises: each draws its numbers from a seed, asks a question, and takes its answer
//! from the predictor's own functions (never typed in). The order walks the subject: bytes per
//! parameter, full fine-tuning, mixed precision, LoRA, NF4 and QLoRA, activations and
//! checkpointing, accumulation, 8-bit optimizers, logits, time and the roofline, many GPUs,
//! offload, and "will it fit".

use serde::Serialize;

use super::answer::{Dimension, Expected};
use crate::config::{AttentionKind, LlamaConfig, LoraConfig, Nf4Config};
use crate::predict::inventory::{Scenario, inventory, per_layer};
use crate::predict::offload::{host_links, host_transfer};
use crate::predict::precision::{PrecisionRecipe, precision_table};
use crate::predict::rules::{
    OptimizerRule, Precision, full_training_bytes, optimizer_bytes_per_param,
};
use crate::predict::seed::{ActivationShape, activation_bytes};
use crate::predict::sharding::Offload;
use crate::predict::time::{Bound, device_preset, device_presets, roofline, step_work};
use crate::predict::timeline::step_timeline;
use crate::predict::weights::{nf4_tensor_bytes, weight_bytes};
use crate::predict::zero::{Cluster, Zero3Offload, zero2, zero3};

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
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[(self.next() % items.len() as u64) as usize].clone()
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

/// Every exercise, in teaching order.
pub fn catalog() -> Vec<Exercise> {
    vec![
        Exercise {
            id: "dtype-bytes",
            title: "Weights in a dtype",
            make: |d| {
                let (id, name, c) = model(d, &PRESETS);
                let (dtype, per) = d.pick(&[
                    ("float32", 4.0),
                    ("bfloat16", 2.0),
                    ("float16", 2.0),
                    ("int8", 1.0),
                ]);
                let n = c.num_parameters() as f64;
                let bytes = n * per;
                Drawn {
                    question: format!(
                        "{name} has {} parameters. How much memory do its weights take in {dtype}?",
                        c.num_parameters()
                    ),
                    expected: with_mistakes(
                        expected(Dimension::Bytes, bytes, gb(bytes)),
                        &[
                            ("counted bits instead of bytes", bytes * 8.0),
                            (
                                "used the wrong bytes per value (a factor of 2)",
                                bytes * 2.0,
                            ),
                            (
                                "used the wrong bytes per value (a factor of 2)",
                                bytes / 2.0,
                            ),
                        ],
                    ),
                    hint: format!("Bytes per value of {dtype} × parameters."),
                    explanation: format!("{n:.0} × {per} bytes = {}.", gb(bytes)),
                    sandbox: Some(sandbox(id, 0, false, 256)),
                }
            },
        },
        Exercise {
            id: "full-ft-adamw",
            title: "Full fine-tuning with AdamW in float32",
            make: |d| {
                let (id, name, c) = model(d, &PRESETS);
                let n = c.num_parameters();
                let bytes = full_training_bytes(n, OptimizerRule::AdamW, Precision::Fp32);
                let nf = n as f64;
                Drawn {
                    question: format!(
                        "Full fine-tuning of {name} ({n} parameters) in float32 with AdamW: how much memory do the weights, the gradients and the optimizer state take together (no activations)?"
                    ),
                    expected: with_mistakes(
                        expected(Dimension::Bytes, bytes, gb(bytes)),
                        &[
                            ("forgot the gradients", 12.0 * nf),
                            ("forgot the optimizer state", 8.0 * nf),
                            ("counted only one of Adam's two moments", 12.0 * nf),
                            ("counted only the weights", 4.0 * nf),
                            (
                                "applied seed 002's \"20 GB per billion\", which adds activations as a fifth parameter-sized set (activations scale with batch × sequence, not parameters, and this question leaves them out)",
                                20.0 * nf,
                            ),
                        ],
                    ),
                    hint: "Weights 4, gradients 4, Adam's two moments 4 + 4 bytes per parameter."
                        .into(),
                    explanation: format!("(4 + 4 + 8) bytes × {n} = 16 × {n} = {}.", gb(bytes)),
                    sandbox: Some(sandbox(id, 0, false, 256)),
                }
            },
        },
        Exercise {
            id: "mixed-precision-adamw",
            title: "Mixed precision and the float32 master copy",
            make: |d| {
                let (id, name, c) = model(d, &PRESETS);
                let n = c.num_parameters();
                let nf = n as f64;
                let bytes = full_training_bytes(n, OptimizerRule::AdamW, Precision::Mixed);
                Drawn {
                    question: format!("Mixed-precision full fine-tuning of {name} ({n} parameters): bf16 weights and gradients, a float32 master copy of the weights and AdamW's two float32 moments. Total bytes of these (no activations)?"),
                    expected: with_mistakes(expected(Dimension::Bytes, bytes, gb(bytes)), &[("forgot the float32 master copy", 12.0 * nf), ("forgot the optimizer state", 4.0 * nf), ("forgot the gradients", 14.0 * nf), ("used seed 003's 2 + 2 + 4 bytes (\"14 + 14 + 28 GB\"): 16-bit moments and no master copy, which is pure bf16, not this recipe", 8.0 * nf)]),
                    hint: "2 (bf16 weights) + 2 (bf16 gradients) + 4 (master) + 8 (moments) bytes per parameter.".into(),
                    explanation: format!("(2 + 2 + 4 + 8) × {n} = 16 × {n} = {}: mixed precision saves compute and activation memory, not model-state memory.", gb(bytes)),
                    sandbox: Some(sandbox(id, 0, false, 256)),
                }
            },
        },
        Exercise {
            id: "master-copy",
            title: "The master copy alone",
            make: |d| {
                let (id, name, c) = model(d, &PRESETS);
                let n = c.num_parameters();
                let per = optimizer_bytes_per_param(OptimizerRule::AdamW, Precision::Mixed)
                    - optimizer_bytes_per_param(OptimizerRule::AdamW, Precision::Fp32);
                let bytes = per * n as f64;
                Drawn {
                    question: format!(
                        "In mixed-precision training of {name} ({n} parameters), how much memory does the float32 master copy of the weights take?"
                    ),
                    expected: with_mistakes(
                        expected(Dimension::Bytes, bytes, gb(bytes)),
                        &[("took the bf16 copy (2 bytes)", bytes / 2.0)],
                    ),
                    hint: "One float32 value per parameter.".into(),
                    explanation: format!("{per} bytes × {n} = {}.", gb(bytes)),
                    sandbox: Some(sandbox(id, 0, false, 256)),
                }
            },
        },
        Exercise {
            id: "lora-count",
            title: "LoRA's trainable parameters",
            make: |d| {
                let (id, name, c) = model(d, &PRESETS);
                let r = d.pick(&[4usize, 8, 16, 32, 64]);
                let count = lora(r).trainable_parameters(&c) as f64;
                let per_layer = count / c.num_hidden_layers as f64;
                Drawn {
                    question: format!("LoRA with rank r = {r} on all seven linear layers of every block of {name} (hidden {}, intermediate {}, {} blocks, {} query and {} key/value heads of {}): how many trainable parameters?", c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim),
                    expected: with_mistakes(expected(Dimension::Count, count, format!("{count:.0}")), &[("counted one block only", per_layer), ("counted only A (r × in) or only B", count / 2.0)]),
                    hint: "Each adapted linear [out, in] gets A [r, in] and B [out, r]: r·(in + out). Sum over the 7 linears, times the blocks.".into(),
                    explanation: format!("per block: r·Σ(in + out) = {per_layer:.0}; × {} blocks = {count:.0}.", c.num_hidden_layers),
                    sandbox: Some(sandbox(id, r, false, 256)),
                }
            },
        },
        Exercise {
            id: "lora-share",
            title: "LoRA's share of the model",
            make: |d| {
                let (id, name, c) = model(d, &PRESETS);
                let r = d.pick(&[8usize, 16, 64]);
                let count = lora(r).trainable_parameters(&c) as f64;
                let share = 100.0 * count / c.num_parameters() as f64;
                Drawn {
                    question: format!(
                        "LoRA r = {r} on all linear layers of {name} trains {count:.0} values. What percentage of the model's {} parameters is that?",
                        c.num_parameters()
                    ),
                    expected: with_mistakes(
                        expected(Dimension::Percent, share, format!("{share:.3} %")),
                        &[("gave a fraction, not a percentage", share / 100.0)],
                    ),
                    hint: "trainable / total × 100.".into(),
                    explanation: format!(
                        "{count:.0} / {} × 100 = {share:.3} %.",
                        c.num_parameters()
                    ),
                    sandbox: Some(sandbox(id, r, false, 256)),
                }
            },
        },
        Exercise {
            id: "lora-memory",
            title: "LoRA's memory against full fine-tuning",
            make: |d| {
                let (id, name, c) = model(d, &PRESETS);
                let r = d.pick(&[8usize, 16, 32]);
                let n = c.num_parameters() as f64;
                let a = lora(r).trainable_parameters(&c) as f64;
                let bytes = 4.0 * n + 16.0 * a;
                Drawn {
                    question: format!("LoRA r = {r} (all linears, {a:.0} adapter values) on {name} ({n:.0} frozen float32 weights), AdamW in float32: weights + adapters + their gradients + their optimizer state, in bytes?"),
                    expected: with_mistakes(expected(Dimension::Bytes, bytes, gb(bytes)), &[("gave the frozen base gradients and optimizer state too (full fine-tuning)", 16.0 * n + 16.0 * a), ("forgot the adapters' optimizer state", 4.0 * n + 8.0 * a)]),
                    hint: "The base: 4 bytes a weight, no gradient, no state. The adapters: 4 + 4 + 8.".into(),
                    explanation: format!("4 × {n:.0} + 16 × {a:.0} = {} (full fine-tuning: {}).", gb(bytes), gb(16.0 * n)),
                    sandbox: Some(sandbox(id, r, false, 256)),
                }
            },
        },
        Exercise {
            id: "nf4-bits",
            title: "NF4 bits per weight",
            make: |d| {
                let block = d.pick(&[32usize, 64, 128, 256]);
                let dq = d.pick(&[false, true]);
                let n = 4096u64 * 4096;
                let (codes, scales) = nf4_tensor_bytes(
                    n,
                    &Nf4Config {
                        block_size: block,
                        double_quant: dq,
                    },
                );
                let bits = 8.0 * (codes + scales) as f64 / n as f64;
                let dq_text = if dq {
                    "with double quantization (8-bit scales in blocks of 256, one float32 per 256 scales)"
                } else {
                    "without double quantization (one float32 scale per block)"
                };
                Drawn {
                    question: format!(
                        "NF4 with blocks of {block} weights, {dq_text}: how many bits per weight does a 4096 × 4096 matrix cost?"
                    ),
                    expected: with_mistakes(
                        Expected {
                            tolerance: 0.002,
                            ..expected(Dimension::Bits, bits, format!("{bits:.4} bits"))
                        },
                        &[
                            ("forgot the scales", 4.0),
                            ("forgot the second-level scales", 4.0 + 8.0 / block as f64),
                        ],
                    ),
                    hint: "4 bits of code, plus the scale's bits shared by the block.".into(),
                    explanation: if dq {
                        format!("4 + 8/{block} + 32/(256·{block}) = {bits:.4} bits.")
                    } else {
                        format!("4 + 32/{block} = {bits:.4} bits.")
                    },
                    sandbox: None,
                }
            },
        },
        Exercise {
            id: "nf4-model",
            title: "A quantized base",
            make: |d| {
                let (id, name, c) = model(d, &PRESETS);
                let nf4 = Nf4Config {
                    block_size: 64,
                    double_quant: true,
                };
                let w = weight_bytes(&c, 4, Some(&nf4));
                let quant = (w.codes + w.scales) as f64;
                let linears = c.num_hidden_layers as f64
                    * c.block_linears()
                        .iter()
                        .map(|&(_, o, i)| (o * i) as f64)
                        .sum::<f64>();
                Drawn {
                    question: format!(
                        "The block linears of {name} ({linears:.0} weights) are quantized to NF4, blocks of 64, with double quantization. How many bytes do codes and scales take?"
                    ),
                    expected: with_mistakes(
                        expected(Dimension::Bytes, quant, mb(quant)),
                        &[
                            ("counted 4 bits flat (no scales)", linears / 2.0),
                            ("forgot double quantization (4.5 bits)", linears * 4.5 / 8.0),
                        ],
                    ),
                    hint: "4.127 bits per weight with blocks of 64 and double quantization.".into(),
                    explanation: format!("{linears:.0} × 4.127 / 8 ≈ {}.", mb(quant)),
                    sandbox: Some(sandbox(id, 16, true, 256)),
                }
            },
        },
        Exercise {
            id: "qlora-7b",
            title: "QLoRA of a 7B model",
            make: |d| {
                let (id, name, c) = model(
                    d,
                    &[("llama-2-7b", "Llama-2-7B"), ("llama-3-8b", "Llama-3-8B")],
                );
                let r = d.pick(&[8usize, 16, 64]);
                let nf4 = Nf4Config {
                    block_size: 64,
                    double_quant: true,
                };
                let w = weight_bytes(&c, 4, Some(&nf4));
                let a = lora(r).trainable_parameters(&c) as f64;
                let base = w.total() as f64;
                let bytes = base + 16.0 * a;
                Drawn {
                    question: format!(
                        "QLoRA of {name}: block linears in NF4 (blocks of 64, double quantization), embedding, head and norms in float32, LoRA r = {r} on all linears ({a:.0} values) trained with float32 AdamW. Bytes of base + adapters + gradients + optimizer state?"
                    ),
                    expected: with_mistakes(
                        expected(Dimension::Bytes, bytes, gb(bytes)),
                        &[
                            (
                                "put the whole model in NF4 (embedding and head too)",
                                c.num_parameters() as f64 * 4.127 / 8.0 + 16.0 * a,
                            ),
                            ("forgot the adapters' optimizer state", base + 8.0 * a),
                        ],
                    ),
                    hint: "NF4 only replaces the block linears; the embedding and head stay float."
                        .into(),
                    explanation: format!(
                        "base {} (float parts {}, codes + scales {}) + 16 × {a:.0} = {}.",
                        gb(base),
                        gb(w.float as f64),
                        gb((w.codes + w.scales) as f64),
                        gb(bytes)
                    ),
                    sandbox: Some(sandbox(id, r, true, 512)),
                }
            },
        },
        Exercise {
            id: "activations-layer",
            title: "Activations of one layer",
            make: |d| {
                let (id, name, c) = model(d, &PRESETS);
                let s = d.pick(&[512.0, 1024.0, 2048.0]);
                let b = d.pick(&[1.0, 2.0, 4.0]);
                let shape = ActivationShape {
                    seq: s,
                    batch: b,
                    hidden: c.hidden_size as f64,
                    heads: c.num_attention_heads as f64,
                    layers: 1.0,
                };
                let bytes = activation_bytes(shape, Precision::Mixed, false);
                let h = c.hidden_size as f64;
                let a = c.num_attention_heads as f64;
                Drawn {
                    question: format!(
                        "Korthikanti et al.: one transformer layer keeps s·b·h·(34 + 5·a·s/h) bytes of 16-bit activations. For {name} (h = {h}, a = {a}) at s = {s}, b = {b}, how many bytes?"
                    ),
                    expected: with_mistakes(
                        expected(Dimension::Bytes, bytes, mb(bytes)),
                        &[
                            (
                                "left out the attention scores' 5·a·s/h term",
                                s * b * h * 34.0,
                            ),
                            ("doubled it for float32", 2.0 * bytes),
                        ],
                    ),
                    hint: "Plug in; the 5·a·s/h term is the attention matrices, quadratic in s."
                        .into(),
                    explanation: format!("{s}·{b}·{h}·(34 + 5·{a}·{s}/{h}) = {}.", mb(bytes)),
                    sandbox: Some(SandboxSettings {
                        micro_batch: b as usize,
                        ..sandbox(id, 16, false, s as usize)
                    }),
                }
            },
        },
        Exercise {
            id: "activations-double-seq",
            title: "Doubling the sequence",
            make: |d| {
                let (_, name, c) = model(d, &PRESETS);
                let s = d.pick(&[256.0, 1024.0, 4096.0]);
                let shape = |seq| ActivationShape {
                    seq,
                    batch: 1.0,
                    hidden: c.hidden_size as f64,
                    heads: c.num_attention_heads as f64,
                    layers: 1.0,
                };
                let ratio = activation_bytes(shape(2.0 * s), Precision::Mixed, false)
                    / activation_bytes(shape(s), Precision::Mixed, false);
                Drawn {
                    question: format!(
                        "With the same rule, by what factor do {name}'s per-layer activations grow when the sequence goes from {s} to {} tokens?",
                        2.0 * s
                    ),
                    expected: with_mistakes(
                        Expected {
                            dimension: Dimension::Ratio,
                            value: ratio,
                            display: format!("{ratio:.3}×"),
                            tolerance: 0.005,
                            choices: vec![],
                            mistakes: vec![],
                            unit: None,
                        },
                        &[
                            ("treated it as linear", 2.0),
                            ("treated it as quadratic", 4.0),
                        ],
                    ),
                    hint: "The 34 part grows like s, the attention part like s².".into(),
                    explanation: format!("(34 + 5·a·2s/h)·2s / ((34 + 5·a·s/h)·s) = {ratio:.3}."),
                    sandbox: None,
                }
            },
        },
        Exercise {
            id: "checkpointing-saving",
            title: "What checkpointing saves",
            make: |d| {
                let (id, name, c) = model(d, &PRESETS);
                let s = d.pick(&[1024.0, 2048.0]);
                let shape = ActivationShape {
                    seq: s,
                    batch: 1.0,
                    hidden: c.hidden_size as f64,
                    heads: c.num_attention_heads as f64,
                    layers: c.num_hidden_layers as f64,
                };
                let plain = activation_bytes(shape, Precision::Mixed, false);
                let ckpt = activation_bytes(shape, Precision::Mixed, true);
                let saved = plain - ckpt;
                Drawn {
                    question: format!(
                        "{name}, s = {s}, b = 1, 16-bit activations: with full recomputation each of the {} layers keeps only its input (2·s·b·h bytes) instead of s·b·h·(34 + 5·a·s/h). How many bytes does that save over all layers?",
                        c.num_hidden_layers
                    ),
                    expected: with_mistakes(
                        expected(Dimension::Bytes, saved, gb(saved)),
                        &[
                            (
                                "gave the activations with checkpointing, not the saving",
                                ckpt,
                            ),
                            ("gave the activations without checkpointing", plain),
                        ],
                    ),
                    hint: "Without − with, both over all layers.".into(),
                    explanation: format!("{} − {} = {}.", gb(plain), gb(ckpt), gb(saved)),
                    sandbox: Some(SandboxSettings {
                        checkpointing: true,
                        ..sandbox(id, 16, false, s as usize)
                    }),
                }
            },
        },
        Exercise {
            id: "efficient-attention",
            title: "Attention memory at long context",
            make: |d| {
                let (id, name, c) = model(d, &PRESETS);
                let t = d.pick(&[1024usize, 2048, 4096]);
                let block_activations = |attention| {
                    let s = Scenario {
                        lora: Some(lora(16)),
                        attention,
                        ..Scenario::new(c.clone(), 1, t)
                    };
                    // A middle block (the first one's frozen input path keeps less).
                    per_layer(&inventory(&s), c.num_hidden_layers)[1].activations as f64
                };
                let eager = block_activations(AttentionKind::Eager);
                let efficient = block_activations(AttentionKind::Efficient);
                let saved = eager - efficient;
                let (h, dh) = (c.num_attention_heads as f64, c.head_dim as f64);
                let tf = t as f64;
                let one_copy = 4.0 * h * tf * tf;
                Drawn {
                    question: format!(
                        "{name} with LoRA, B = 1, T = {t}, f32. napkin's eager attention keeps three [B, H, T, T] tensors per block for the backward (the exponentials, the probabilities and the softmax input the exponentials need) and one softmax sum per query row; the memory-efficient attention keeps none of them, but keeps its output [B, H, T, Dh] and one log-sum-exp per query row. How many bytes does switching to it save in one block (H = {h}, Dh = {dh})?"
                    ),
                    expected: with_mistakes(
                        expected(Dimension::Bytes, saved, mb(saved)),
                        &[
                            ("counted one T×T copy instead of three", one_copy),
                            ("counted 2-byte values", saved / 2.0),
                            ("gave the block's activations with eager attention", eager),
                        ],
                    ),
                    hint: "3 · 4 · H · T² bytes go; 4 · H · T · Dh (the output) comes; the per-row sums and log-sum-exps cancel.".into(),
                    explanation: format!(
                        "3·4·{h}·{t}² − 4·{t}·{h}·{dh} = {} per block (eager block {}, efficient {}); the T² term is gone, the activations grow only linearly in T.",
                        mb(saved),
                        mb(eager),
                        mb(efficient)
                    ),
                    sandbox: Some(SandboxSettings {
                        attention: AttentionKind::Efficient,
                        ..sandbox(id, 16, false, t)
                    }),
                }
            },
        },
        Exercise {
            id: "checkpointing-compute",
            title: "What checkpointing costs",
            make: |d| {
                let (id, name, c) = model(d, &PRESETS);
                let t = d.pick(&[256usize, 1024]);
                let plain = step_work(&Scenario::new(c.clone(), 1, t));
                let ckpt = step_work(&Scenario {
                    checkpointing: true,
                    ..Scenario::new(c, 1, t)
                });
                let extra = 100.0 * ckpt.recompute_flops / plain.flops();
                Drawn {
                    question: format!("Full fine-tuning of {name} on 1 × {t} tokens. Block checkpointing recomputes every block's forward in the backward. By what percentage do the step's FLOPs grow?"),
                    expected: with_mistakes(Expected { tolerance: 0.02, ..expected(Dimension::Percent, extra, format!("{extra:.1} %")) }, &[("recomputed the LM head too (a full extra forward)", 100.0 * plain.forward_flops / plain.flops())]),
                    hint: "The backward is about twice the forward; the recompute is one forward of the blocks (not the head).".into(),
                    explanation: format!("recompute {:.3} TFLOP / step {:.3} TFLOP = {extra:.1} %.", ckpt.recompute_flops / 1e12, plain.flops() / 1e12),
                    sandbox: Some(SandboxSettings { checkpointing: true, ..sandbox(id, 0, false, t) }),
                }
            },
        },
        Exercise {
            id: "effective-batch",
            title: "Effective batch with accumulation",
            make: |d| {
                let micro = d.pick(&[1u64, 2, 4, 8]);
                let accum = d.pick(&[4u64, 8, 16]);
                let gpus = d.pick(&[1u64, 2, 8]);
                let t = d.pick(&[512u64, 1024, 2048]);
                let tokens = (micro * accum * gpus * t) as f64;
                Drawn {
                    question: format!(
                        "Micro-batch {micro} sequences of {t} tokens, {accum} accumulation steps, {gpus} data-parallel GPU(s). How many tokens does one optimizer step see?"
                    ),
                    expected: with_mistakes(
                        expected(Dimension::Count, tokens, format!("{tokens:.0} tokens")),
                        &[
                            ("forgot the GPUs", tokens / gpus as f64),
                            ("forgot the accumulation", tokens / accum as f64),
                        ],
                    ),
                    hint: "micro-batch × accumulation × GPUs × sequence length.".into(),
                    explanation: format!("{micro} × {accum} × {gpus} × {t} = {tokens:.0}."),
                    sandbox: None,
                }
            },
        },
        Exercise {
            id: "adamw8bit-state",
            title: "An 8-bit optimizer",
            make: |d| {
                let (id, name, c) = model(d, &PRESETS);
                let n = c.num_parameters() as f64;
                let bytes =
                    n * optimizer_bytes_per_param(OptimizerRule::AdamW8bit, Precision::Fp32);
                Drawn {
                    question: format!(
                        "8-bit AdamW keeps both moments in one byte each. For full fine-tuning of {name} ({n:.0} parameters), how much optimizer state, ignoring the small per-block scales?"
                    ),
                    expected: with_mistakes(
                        expected(Dimension::Bytes, bytes, gb(bytes)),
                        &[
                            ("used float32 moments", 4.0 * bytes),
                            ("counted one moment", bytes / 2.0),
                        ],
                    ),
                    hint: "Two moments × 1 byte.".into(),
                    explanation: format!(
                        "2 × {n:.0} = {} (float32 AdamW: {}).",
                        gb(bytes),
                        gb(4.0 * bytes)
                    ),
                    sandbox: Some(sandbox(id, 0, false, 256)),
                }
            },
        },
        Exercise {
            id: "fp8-bytes",
            title: "FP8 bytes per parameter",
            make: |d| {
                let (id, name, c) = model(d, &PRESETS);
                let n = c.num_parameters() as f64;
                let row = |recipe| {
                    precision_table(c.num_parameters(), 1)
                        .into_iter()
                        .find(|r| r.recipe == recipe)
                        .map_or(0.0, |r| r.model_state_bytes)
                };
                let o2 = row(PrecisionRecipe::MsAmpO2);
                Drawn {
                    question: format!(
                        "MS-AMP O2 keeps each weight once in FP16 (cast to FP8 for every GEMM), FP8 weight gradients, an FP8 first moment and an FP16 second moment. How much model state does full fine-tuning of {name} ({n:.0} parameters) with AdamW need on one GPU, scaling factors aside? (Predicted only: FP8 needs Hopper- or Ada-class tensor cores.)"
                    ),
                    expected: with_mistakes(
                        expected(Dimension::Bytes, o2, gb(o2)),
                        &[
                            (
                                "used bf16 mixed precision's 16 bytes a parameter",
                                row(PrecisionRecipe::Bf16Master),
                            ),
                            (
                                "kept O1's f32 moments (11 bytes a parameter)",
                                row(PrecisionRecipe::MsAmpO1),
                            ),
                            (
                                "counted an FP8 weight copy besides the FP16 weights (O3's layout)",
                                o2 + n,
                            ),
                        ],
                    ),
                    hint: "2 + 1 + 1 + 2 bytes for every parameter.".into(),
                    explanation: format!(
                        "(2 + 1 + 1 + 2) × {n:.0} = {} — the FP8-LM paper's 6 bytes a parameter, against {} with bf16 and an f32 master copy (2 + 2 + 4 + 4 + 4).",
                        gb(o2),
                        gb(row(PrecisionRecipe::Bf16Master))
                    ),
                    sandbox: Some(sandbox(id, 0, false, 256)),
                }
            },
        },
        Exercise {
            id: "logits-memory",
            title: "Logits of a large vocabulary",
            make: |d| {
                let (id, name, c) = model(d, &PRESETS);
                let b = d.pick(&[1.0, 4.0, 8.0]);
                let t = d.pick(&[512.0, 2048.0, 4096.0]);
                let v = c.vocab_size as f64;
                let bytes = 4.0 * b * t * v;
                Drawn {
                    question: format!(
                        "{name} has a vocabulary of {v} tokens. How many bytes do the float32 logits of a batch of {b} × {t} tokens take?"
                    ),
                    expected: with_mistakes(
                        expected(Dimension::Bytes, bytes, gb(bytes)),
                        &[
                            ("used 2 bytes per value", bytes / 2.0),
                            ("forgot the batch", bytes / b),
                        ],
                    ),
                    hint: "B × T × V values, 4 bytes each.".into(),
                    explanation: format!(
                        "{b} × {t} × {v} × 4 = {}; the loss's softmax makes more copies of that size.",
                        gb(bytes)
                    ),
                    sandbox: Some(SandboxSettings {
                        micro_batch: b as usize,
                        ..sandbox(id, 16, false, t as usize)
                    }),
                }
            },
        },
        Exercise {
            id: "matmul-intensity",
            title: "Arithmetic intensity of a matmul",
            make: |d| {
                let m = d.pick(&[1.0, 16.0, 256.0, 4096.0]);
                let k = d.pick(&[2048.0, 4096.0]);
                let n = d.pick(&[4096.0, 11008.0]);
                let flops = 2.0 * m * k * n;
                let bytes = 2.0 * (m * k + k * n + m * n);
                let ai = flops / bytes;
                Drawn {
                    question: format!(
                        "A bf16 matmul [{m} × {k}] · [{k} × {n}] reads both inputs once and writes the output once. How many FLOPs per byte?"
                    ),
                    expected: with_mistakes(
                        Expected {
                            dimension: Dimension::Ratio,
                            value: ai,
                            display: format!("{ai:.2} FLOP/byte"),
                            tolerance: 0.01,
                            choices: vec![],
                            mistakes: vec![],
                            unit: None,
                        },
                        &[
                            ("forgot the output write", flops / (2.0 * (m * k + k * n))),
                            ("counted one FLOP per multiply-add", ai / 2.0),
                        ],
                    ),
                    hint: "2·m·k·n FLOPs over 2 bytes × (m·k + k·n + m·n).".into(),
                    explanation: format!(
                        "{flops:.3e} / {bytes:.3e} = {ai:.2}: one row (m = 1) is always memory-bound."
                    ),
                    sandbox: None,
                }
            },
        },
        Exercise {
            id: "roofline-verdict",
            title: "Compute- or memory-bound?",
            make: |d| {
                let device = d.pick(&device_presets());
                let (b, t, lora_r) = d.pick(&[
                    (1usize, 2usize, 0usize),
                    (32, 128, 16),
                    (8, 512, 16),
                    (1, 256, 0),
                ]);
                let c = LlamaConfig::smollm2_135m();
                let s = Scenario {
                    lora: (lora_r > 0).then(|| lora(lora_r)),
                    ..Scenario::new(c, b, t)
                };
                let w = step_work(&s);
                let r = roofline(&w, (b * t) as f64, &device, false);
                let verdict = match r.bound {
                    Bound::Compute => 0.0,
                    Bound::Memory => 1.0,
                };
                let what = if lora_r > 0 {
                    format!("LoRA r = {lora_r}")
                } else {
                    "full fine-tuning".into()
                };
                Drawn {
                    question: format!(
                        "napkin's float32 step of SmolLM2-135M, {what}, {b} × {t} tokens: {:.3} TFLOP and {:.2} GB moved. On the {} ({:.1} TFLOP/s float32, {:.0} GB/s), is it compute-bound or memory-bound?",
                        w.flops() / 1e12,
                        w.bytes_moved / 1e9,
                        device.name,
                        device.f32_flops / 1e12,
                        device.bandwidth / 1e9
                    ),
                    expected: Expected {
                        dimension: Dimension::Choice,
                        value: verdict,
                        display: format!(
                            "{} ({:.0} FLOP/byte against a ridge of {:.0})",
                            if verdict == 0.0 { "compute" } else { "memory" },
                            r.arithmetic_intensity,
                            r.ridge_point
                        ),
                        tolerance: 0.0,
                        choices: vec!["compute".into(), "memory".into()],
                        mistakes: vec![],
                        unit: None,
                    },
                    hint: "Compare FLOPs / bytes with the device's FLOP/s / (bytes/s).".into(),
                    explanation: format!(
                        "intensity {:.1} FLOP/byte, ridge {:.1}: compute {:.2} ms vs memory {:.2} ms.",
                        r.arithmetic_intensity,
                        r.ridge_point,
                        1e3 * r.compute_seconds,
                        1e3 * r.memory_seconds
                    ),
                    sandbox: Some(SandboxSettings {
                        micro_batch: b,
                        device: Some(device.id.clone()),
                        ..sandbox("smollm2-135m", lora_r, false, t)
                    }),
                }
            },
        },
        Exercise {
            id: "step-time",
            title: "Step time from FLOPs",
            make: |d| {
                let (id, name, c) = model(d, &PRESETS);
                let device = d.pick(&["a100-80gb", "h100", "rtx4090"]);
                let device = device_preset(device).unwrap_or_else(|| device_presets().remove(0));
                let mfu = d.pick(&[0.3, 0.4, 0.5]);
                let tokens = d.pick(&[4096.0, 65536.0, 524288.0]);
                let n = c.num_parameters() as f64;
                let seconds = 6.0 * n * tokens / (device.half_flops * mfu);
                Drawn {
                    question: format!(
                        "Full fine-tuning costs about 6 FLOPs per parameter per token. {name} ({n:.0} parameters), {tokens} tokens per step, on the {} at {:.0} TFLOP/s bf16 with {:.0} % model FLOPs utilisation: seconds per step?",
                        device.name,
                        device.half_flops / 1e12,
                        100.0 * mfu
                    ),
                    expected: with_mistakes(
                        Expected {
                            tolerance: 0.01,
                            ..expected(Dimension::Seconds, seconds, format!("{seconds:.4} s"))
                        },
                        &[
                            ("counted the forward only (2 FLOPs)", seconds / 3.0),
                            ("forgot the utilisation", seconds * mfu),
                        ],
                    ),
                    hint: "6 · N · tokens / (peak FLOP/s × utilisation).".into(),
                    explanation: format!(
                        "6 × {n:.0} × {tokens} / ({:.0e} × {mfu}) = {seconds:.4} s.",
                        device.half_flops
                    ),
                    sandbox: Some(SandboxSettings {
                        device: Some(device.id.clone()),
                        ..sandbox(id, 0, false, 512)
                    }),
                }
            },
        },
        Exercise {
            id: "lora-flops",
            title: "What LoRA saves in compute",
            make: |d| {
                let (id, name, c) = model(d, &PRESETS);
                let r = d.pick(&[8usize, 16, 64]);
                let t = 512;
                let full = step_work(&Scenario::new(c.clone(), 1, t));
                let lo = step_work(&Scenario {
                    lora: Some(lora(r)),
                    ..Scenario::new(c, 1, t)
                });
                let share = 100.0 * lo.lora_saved_flops / full.flops();
                Drawn {
                    question: format!("{name}, 1 × {t} tokens: full fine-tuning computes input gradients and weight gradients for every linear; LoRA r = {r} computes no weight gradient for the frozen base (but adds its small adapters). What percentage of full fine-tuning's FLOPs does LoRA save?"),
                    expected: Expected { tolerance: 0.02, ..expected(Dimension::Percent, share, format!("{share:.1} %")) },
                    hint: "A linear's backward is two products (input gradient, weight gradient), each as large as its forward.".into(),
                    explanation: format!("saved {:.3} TFLOP of {:.3} TFLOP = {share:.1} % (the attention's backward is not saved).", lo.lora_saved_flops / 1e12, full.flops() / 1e12),
                    sandbox: Some(sandbox(id, r, false, t)),
                }
            },
        },
        Exercise {
            id: "zero2-gpu",
            title: "ZeRO-2 per GPU",
            make: |d| {
                let (id, name, c) = model(d, &PRESETS);
                let gpus = d.pick(&[2u64, 4, 8, 16]);
                let n = c.num_parameters();
                let e = zero2(
                    n,
                    Cluster {
                        gpus_per_node: gpus,
                        nodes: 1,
                    },
                    false,
                );
                let bytes = e.gpu_bytes as f64;
                let nf = n as f64;
                Drawn {
                    question: format!(
                        "DeepSpeed ZeRO-2, mixed-precision Adam, {name} ({n} parameters) on {gpus} GPUs: fp16 weights and gradients (2 + 2 bytes) are whole on each GPU, the other 16 bytes per parameter (fp32 master, two moments, fp32 gradient buffer) are sharded. Bytes per GPU?"
                    ),
                    expected: with_mistakes(
                        expected(Dimension::Bytes, bytes, gb(bytes)),
                        &[
                            ("sharded everything", (4.0 * nf + 16.0 * nf) / gpus as f64),
                            ("sharded nothing", 20.0 * nf),
                        ],
                    ),
                    hint: "4·N + 16·N / GPUs.".into(),
                    explanation: format!("4 × {n} + 16 × {n} / {gpus} = {}.", gb(bytes)),
                    sandbox: Some(SandboxSettings {
                        gpus,
                        ..sandbox(id, 0, false, 512)
                    }),
                }
            },
        },
        Exercise {
            id: "zero3-gpu",
            title: "ZeRO-3 per GPU",
            make: |d| {
                let (_, name, c) = model(d, &PRESETS);
                let gpus = d.pick(&[4u64, 8, 16]);
                let n = c.num_parameters();
                let largest = c.embedding_parameters().max(c.block_parameters());
                let e = zero3(
                    n,
                    largest,
                    Cluster {
                        gpus_per_node: gpus,
                        nodes: 1,
                    },
                    Zero3Offload::None,
                    true,
                );
                let bytes = e.gpu_bytes as f64;
                Drawn {
                    question: format!(
                        "DeepSpeed ZeRO-3, {name} ({n} parameters, largest layer {largest}) on {gpus} GPUs of one node, no offload: DeepSpeed's estimate is 4 bytes × the largest layer (gathered) + 18 bytes per parameter sharded over the GPUs. Bytes per GPU?"
                    ),
                    expected: with_mistakes(
                        expected(Dimension::Bytes, bytes, gb(bytes)),
                        &[(
                            "forgot the gathered largest layer",
                            18.0 * n as f64 / gpus as f64,
                        )],
                    ),
                    hint: "4·largest + 18·N / GPUs.".into(),
                    explanation: format!("4 × {largest} + 18 × {n} / {gpus} = {}.", gb(bytes)),
                    sandbox: None,
                }
            },
        },
        Exercise {
            id: "fsdp-optimizer",
            title: "FSDP FULL_SHARD and the optimizer state",
            make: |d| {
                let (id, name, c) = model(d, &PRESETS);
                let gpus = d.pick(&[2u64, 4, 8]);
                let n = c.num_parameters() as f64;
                let bytes = 8.0 * n / gpus as f64;
                Drawn {
                    question: format!(
                        "Full fine-tuning of {name} ({n:.0} parameters) with float32 AdamW under FSDP FULL_SHARD on {gpus} GPUs: how many bytes of optimizer state does each GPU hold?"
                    ),
                    expected: with_mistakes(
                        expected(Dimension::Bytes, bytes, gb(bytes)),
                        &[
                            ("did not shard it", 8.0 * n),
                            ("counted one moment", bytes / 2.0),
                        ],
                    ),
                    hint: "Two float32 moments per parameter, split evenly.".into(),
                    explanation: format!("8 × {n:.0} / {gpus} = {}.", gb(bytes)),
                    sandbox: Some(SandboxSettings {
                        gpus,
                        ..sandbox(id, 0, false, 512)
                    }),
                }
            },
        },
        Exercise {
            id: "cpu-offload",
            title: "Offloading the optimizer",
            make: |d| {
                let (_, name, c) = model(d, &PRESETS);
                let gpus = d.pick(&[1u64, 4, 8]);
                let n = c.num_parameters();
                let e = zero2(
                    n,
                    Cluster {
                        gpus_per_node: gpus,
                        nodes: 1,
                    },
                    true,
                );
                let bytes = e.gpu_bytes as f64;
                Drawn {
                    question: format!(
                        "ZeRO-2 with the optimizer offloaded to the CPU, {name} ({n} parameters), {gpus} GPU(s): only the fp16 weights stay on each GPU. Bytes per GPU for the model states?"
                    ),
                    expected: with_mistakes(
                        expected(Dimension::Bytes, bytes, gb(bytes)),
                        &[("kept the fp16 gradients too", 2.0 * bytes)],
                    ),
                    hint: "2 bytes per parameter.".into(),
                    explanation: format!(
                        "2 × {n} = {}; the CPU holds the rest (DeepSpeed budgets {} per node).",
                        gb(bytes),
                        gb(e.cpu_bytes as f64)
                    ),
                    sandbox: None,
                }
            },
        },
        Exercise {
            id: "offload-link-time",
            title: "Offload: slower, but it fits",
            make: |d| {
                let (id, name, c) = model(d, &PRESETS[..3]);
                let link = d.pick(&host_links()[..3]);
                let s = Scenario::new(c.clone(), 1, 256);
                let n = s.trainable_parameters();
                let transfer = host_transfer(&s, &inventory(&s), Offload::OPTIMIZER);
                let seconds = transfer.seconds(&link);
                let rate = link.bytes_per_second.unwrap_or(f64::INFINITY);
                Drawn {
                    question: format!(
                        "Full fine-tuning of {name} ({n} parameters) on one GPU with the AdamW state offloaded to the CPU: each step sends the f32 gradients to the host, the CPU updates, and the f32 weights come back. Over {} ({:.2} GB/s each way, full duplex), how long do the transfers take per step, if nothing overlaps them?",
                        link.name,
                        rate / 1e9
                    ),
                    expected: with_mistakes(
                        expected(Dimension::Seconds, seconds, format!("{:.1} ms", 1e3 * seconds)),
                        &[
                            ("added both directions on a full-duplex link", 2.0 * seconds),
                            ("moved 2-byte values", seconds / 2.0),
                        ],
                    ),
                    hint: "4 bytes × parameters, each way at the same time; divide by the link's rate."
                        .into(),
                    explanation: format!(
                        "4 × {n} = {} each way; {} / {:.2} GB/s = {:.1} ms per step, and {} (the AdamW state and an f32 master copy) stays off the GPU.",
                        gb(transfer.to_host as f64),
                        gb(transfer.to_host as f64),
                        rate / 1e9,
                        1e3 * seconds,
                        gb(transfer.host_bytes as f64)
                    ),
                    sandbox: Some(SandboxSettings {
                        device: None,
                        ..sandbox(id, 0, false, 256)
                    }),
                }
            },
        },
        Exercise {
            id: "will-it-fit",
            title: "Will it fit?",
            make: |d| {
                let (id, name, c) = model(
                    d,
                    &[
                        ("tinyllama-1.1b", "TinyLlama-1.1B"),
                        ("llama-3.2-1b", "Llama-3.2-1B"),
                        ("llama-2-7b", "Llama-2-7B"),
                    ],
                );
                let device = d.pick(&["t4", "rtx3090", "a100-40gb", "a100-80gb"]);
                let device = device_preset(device).unwrap_or_else(|| device_presets().remove(0));
                let (lora_r, nf4, ckpt) = d.pick(&[
                    (0usize, false, false),
                    (16, false, true),
                    (16, true, true),
                    (16, true, false),
                ]);
                let t = d.pick(&[512usize, 2048]);
                let s = Scenario {
                    lora: (lora_r > 0).then(|| lora(lora_r)),
                    nf4: nf4.then_some(Nf4Config {
                        block_size: 64,
                        double_quant: true,
                    }),
                    checkpointing: ckpt,
                    ..Scenario::new(c, 1, t)
                };
                let peak = step_timeline(&s).peak;
                let fits = peak.bytes as f64 <= device.memory;
                let what = match (lora_r, nf4) {
                    (0, _) => "full fine-tuning".to_string(),
                    (r, true) => format!("QLoRA r = {r}"),
                    (r, false) => format!("LoRA r = {r}"),
                };
                Drawn {
                    question: format!("napkin's float32 engine, {name}, {what}{}, AdamW, 1 × {t} tokens, on the {} ({:.0} GB). Does the step fit, yes or no? (Use `napkin estimate` for the peak.)", if ckpt { " with checkpointing" } else { "" }, device.name, device.memory / 1e9),
                    expected: Expected { dimension: Dimension::Choice, value: if fits { 0.0 } else { 1.0 }, display: format!("{} (peak {} at `{}`)", if fits { "yes" } else { "no" }, gb(peak.bytes as f64), peak.label), tolerance: 0.0, choices: vec!["yes".into(), "no".into()], mistakes: vec![], unit: None },
                    hint: "Weights + gradients + optimizer state + the activations alive at the peak, against the card's memory.".into(),
                    explanation: format!("predicted peak {} at `{}` vs {:.0} GB.", gb(peak.bytes as f64), peak.label, device.memory / 1e9),
                    sandbox: Some(SandboxSettings { checkpointing: ckpt, device: Some(device.id.clone()), ..sandbox(id, lora_r, nf4, t) }),
                }
            },
        },
        Exercise {
            id: "gb-vs-gib",
            title: "GB or GiB?",
            make: |d| {
                let gbs = d.pick(&[16.0, 24.0, 40.0, 80.0]);
                let bytes = gbs * 1e9;
                Drawn {
                    question: format!(
                        "A GPU is sold with {gbs} GB of memory (10⁹ bytes each). How many GiB (2³⁰ bytes) is that? Answer in GiB."
                    ),
                    expected: Expected {
                        unit: Some("gib".into()),
                        tolerance: 0.002,
                        ..expected(
                            Dimension::Bytes,
                            bytes,
                            format!("{:.3} GiB", bytes / (1u64 << 30) as f64),
                        )
                    },
                    hint: "Divide the bytes by 1,073,741,824.".into(),
                    explanation: format!(
                        "{gbs} × 10⁹ / 2³⁰ = {:.3} GiB: tools that print \"GB\" for 2³⁰ (accelerate, nvidia-smi's MiB) read 7 % lower than the box.",
                        bytes / (1u64 << 30) as f64
                    ),
                    sandbox: None,
                }
            },
        },
    ]
}

/// Draws exercise `id` with `seed`.
pub fn instance(id: &str, seed: u64) -> Option<Instance> {
    let exercise = catalog().into_iter().find(|e| e.id == id)?;
    let hash = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    let mut draw = Draw(hash ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
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
