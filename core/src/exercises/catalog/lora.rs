//! LoRA: how many parameters an adapter adds, their share of the model, the memory it saves.

use super::{Drawn, Exercise, PRESETS, expected, gb, lora, model, sandbox, with_mistakes};
use crate::exercises::answer::Dimension;

/// The exercises of this topic, in teaching order.
pub(super) fn exercises() -> Vec<Exercise> {
    vec![
        Exercise {
            id: "lora-count",
            title: "LoRA's trainable parameters",
            make: |d| {
                let (id, name, c) = model(d, &PRESETS);
                let r = d.pick(&[4usize, 8, 16, 32, 64]);
                let count = lora(r).trainable_parameters(&c) as f64;
                let per_layer = count / c.num_hidden_layers as f64;
                Drawn {
                    question: format!(
                        "LoRA with rank r = {r} on all seven linear layers of every block of \
                        {name} (hidden {}, intermediate {}, {} blocks, {} query and {} \
                        key/value heads of {}): how many trainable parameters?",
                        c.hidden_size,
                        c.intermediate_size,
                        c.num_hidden_layers,
                        c.num_attention_heads,
                        c.num_key_value_heads,
                        c.head_dim
                    ),
                    expected: with_mistakes(
                        expected(Dimension::Count, count, format!("{count:.0}")),
                        &[
                            ("counted one block only", per_layer),
                            ("counted only A (r × in) or only B", count / 2.0),
                        ],
                    ),
                    hint: "Each adapted linear [out, in] gets A [r, in] and B [out, r]: r·(in + \
                        out). Sum over the 7 linears, times the blocks."
                        .into(),
                    explanation: format!(
                        "per block: r·Σ(in + out) = {per_layer:.0}; × {} blocks = {count:.0}.",
                        c.num_hidden_layers
                    ),
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
                        "LoRA r = {r} on all linear layers of {name} trains {count:.0} \
                            values. What percentage of the model's {} parameters is that?",
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
                    question: format!(
                        "LoRA r = {r} (all linears, {a:.0} adapter values) on {name} ({n:.0} \
                        frozen float32 weights), AdamW in float32: weights + adapters + their \
                        gradients + their optimizer state, in bytes?"
                    ),
                    expected: with_mistakes(
                        expected(Dimension::Bytes, bytes, gb(bytes)),
                        &[
                            (
                                "gave the frozen base gradients and optimizer state too (full \
                        fine-tuning)",
                                16.0 * n + 16.0 * a,
                            ),
                            ("forgot the adapters' optimizer state", 4.0 * n + 8.0 * a),
                        ],
                    ),
                    hint: "The base: 4 bytes a weight, no gradient, no state. The adapters: 4 + 4 \
                        + 8."
                        .into(),
                    explanation: format!(
                        "4 × {n:.0} + 16 × {a:.0} = {} (full fine-tuning: {}).",
                        gb(bytes),
                        gb(16.0 * n)
                    ),
                    sandbox: Some(sandbox(id, r, false, 256)),
                }
            },
        },
    ]
}
