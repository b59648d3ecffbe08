//! Activations: what a layer keeps for the backward, how it grows with the sequence, what
//! checkpointing and memory-efficient attention save, and what checkpointing costs in compute.

use super::{
    Drawn, Exercise, PRESETS, SandboxSettings, expected, gb, lora, mb, model, sandbox,
    with_mistakes,
};
use crate::config::AttentionKind;
use crate::exercises::answer::{Dimension, Expected};
use crate::predict::inventory::{Scenario, inventory, per_layer};
use crate::predict::recompute::activation_split;
use crate::predict::rules::Precision;
use crate::predict::seed::{ActivationShape, activation_bytes};
use crate::predict::time::step_work;

/// The exercises of this topic, in teaching order.
pub(super) fn exercises() -> Vec<Exercise> {
    vec![
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
                        "Korthikanti et al.: one transformer layer keeps s·b·h·(34 + \
                            5·a·s/h) bytes of 16-bit activations. For {name} (h = {h}, a = {a}) \
                            at s = {s}, b = {b}, how many bytes?"
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
                        "With the same rule, by what factor do {name}'s per-layer \
                            activations grow when the sequence goes from {s} to {} tokens?",
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
                        "{name}, s = {s}, b = 1, 16-bit activations: with full recomputation \
                            each of the {} layers keeps only its input (2·s·b·h bytes) instead \
                            of s·b·h·(34 + 5·a·s/h). How many bytes does that save over all \
                            layers?",
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
            id: "checkpointing-recompute-sum",
            title: "One recomputed block, not all of them",
            make: |d| {
                let (id, name, c) = model(d, &PRESETS);
                let t = d.pick(&[512usize, 1024, 2048]);
                let layers = c.num_hidden_layers;
                let s = Scenario {
                    lora: Some(lora(16)),
                    checkpointing: true,
                    ..Scenario::new(c, 1, t)
                };
                let split = activation_split(&inventory(&s));
                let sum = split.recomputed_per_micro_batch as f64;
                let block = split.recomputed_block.map_or(0.0, |b| b.bytes as f64);
                let overstated = sum - block;
                Drawn {
                    question: format!(
                        "{name} with LoRA r = 16, B = 1, T = {t}, f32, gradient checkpointing. \
                            napkin's inventory lists every tensor that exists at some moment: \
                            summed over the {layers} blocks, the activations the backward \
                            recomputes come to {} per micro-batch, and the largest block's \
                            come to {}. Each block's exist only while its own backward runs. A \
                            learner who counts the sum as memory the step holds overstates \
                            what is ever alive of them at once. By how many bytes?",
                        mb(sum),
                        mb(block)
                    ),
                    expected: with_mistakes(
                        expected(Dimension::Bytes, overstated, mb(overstated)),
                        &[
                            ("gave the sum over the blocks", sum),
                            ("gave one block's recompute", block),
                        ],
                    ),
                    hint: "One block is recomputed at a time: what the sum has beyond one block \
                        is never alive together with it."
                        .into(),
                    explanation: format!(
                        "{} − {} = {}: the step holds one block's recompute at its peak; the \
                            sum is the bytes the backward computes a second time, not memory.",
                        mb(sum),
                        mb(block),
                        mb(overstated)
                    ),
                    sandbox: Some(SandboxSettings {
                        checkpointing: true,
                        ..sandbox(id, 16, false, t)
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
                        "{name} with LoRA, B = 1, T = {t}, f32. napkin's eager attention \
                            keeps three [B, H, T, T] tensors per block for the backward (the \
                            exponentials, the probabilities and the softmax input the \
                            exponentials need) and one softmax sum per query row; the \
                            memory-efficient attention keeps none of them, but keeps its output \
                            [B, H, T, Dh] and one log-sum-exp per query row. How many bytes \
                            does switching to it save in one block (H = {h}, Dh = {dh})?"
                    ),
                    expected: with_mistakes(
                        expected(Dimension::Bytes, saved, mb(saved)),
                        &[
                            ("counted one T×T copy instead of three", one_copy),
                            ("counted 2-byte values", saved / 2.0),
                            ("gave the block's activations with eager attention", eager),
                        ],
                    ),
                    hint:
                        "3 · 4 · H · T² bytes go; 4 · H · T · Dh (the output) comes; the per-row \
                        sums and log-sum-exps cancel."
                            .into(),
                    explanation: format!(
                        "3·4·{h}·{t}² − 4·{t}·{h}·{dh} = {} per block (eager block {}, \
                            efficient {}); the T² term is gone, the activations grow only \
                            linearly in T.",
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
                    question: format!(
                        "Full fine-tuning of {name} on 1 × {t} tokens. Block checkpointing \
                        recomputes every block's forward in the backward. By what percentage do \
                        the step's FLOPs grow?"
                    ),
                    expected: with_mistakes(
                        Expected {
                            tolerance: 0.02,
                            ..expected(Dimension::Percent, extra, format!("{extra:.1} %"))
                        },
                        &[(
                            "recomputed the LM head too (a full extra forward)",
                            100.0 * plain.forward_flops / plain.flops(),
                        )],
                    ),
                    hint: "The backward is about twice the forward; the recompute is one forward \
                        of the blocks (not the head)."
                        .into(),
                    explanation: format!(
                        "recompute {:.3} TFLOP / step {:.3} TFLOP = {extra:.1} %.",
                        ckpt.recompute_flops / 1e12,
                        plain.flops() / 1e12
                    ),
                    sandbox: Some(SandboxSettings {
                        checkpointing: true,
                        ..sandbox(id, 0, false, t)
                    }),
                }
            },
        },
    ]
}
