//! NF4 and QLoRA: bits per weight with the block scales (and double quantization), a quantized
//! model, a 7B QLoRA run.

use super::{Drawn, Exercise, PRESETS, expected, gb, lora, mb, model, sandbox, with_mistakes};
use crate::config::Nf4Config;
use crate::exercises::answer::{Dimension, Expected};
use crate::predict::weights::{nf4_tensor_bytes, weight_bytes};

/// The exercises of this topic, in teaching order.
pub(super) fn exercises() -> Vec<Exercise> {
    vec![
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
                    "with double quantization (8-bit scales in blocks of 256, one float32 \
                        per 256 scales)"
                } else {
                    "without double quantization (one float32 scale per block)"
                };
                Drawn {
                    question: format!(
                        "NF4 with blocks of {block} weights, {dq_text}: how many bits per \
                            weight does a 4096 × 4096 matrix cost?"
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
                        "The block linears of {name} ({linears:.0} weights) are quantized to \
                            NF4, blocks of 64, with double quantization. How many bytes do \
                            codes and scales take?"
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
                        "QLoRA of {name}: block linears in NF4 (blocks of 64, double \
                            quantization), embedding, head and norms in float32, LoRA r = {r} \
                            on all linears ({a:.0} values) trained with float32 AdamW. Bytes of \
                            base + adapters + gradients + optimizer state?"
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
    ]
}
