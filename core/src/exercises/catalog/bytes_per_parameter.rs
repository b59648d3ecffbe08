//! Bytes per parameter: weights in a dtype, full fine-tuning with AdamW, mixed precision and its
//! float32 master copy.

use super::{Drawn, Exercise, PRESETS, expected, gb, model, sandbox, with_mistakes};
use crate::exercises::answer::Dimension;
use crate::predict::rules::{
    OptimizerRule, Precision, full_training_bytes, optimizer_bytes_per_param,
};

/// The exercises of this topic, in teaching order.
pub(super) fn exercises() -> Vec<Exercise> {
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
                        "Full fine-tuning of {name} ({n} parameters) in float32 with AdamW: \
                            how much memory do the weights, the gradients and the optimizer \
                            state take together (no activations)?"
                    ),
                    expected: with_mistakes(
                        expected(Dimension::Bytes, bytes, gb(bytes)),
                        &[
                            ("forgot the gradients", 12.0 * nf),
                            ("forgot the optimizer state", 8.0 * nf),
                            ("counted only one of Adam's two moments", 12.0 * nf),
                            ("counted only the weights", 4.0 * nf),
                            (
                                "applied seed 002's \"20 GB per billion\", which adds \
                                    activations as a fifth parameter-sized set (activations \
                                    scale with batch × sequence, not parameters, and this \
                                    question leaves them out)",
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
                    question: format!(
                        "Mixed-precision full fine-tuning of {name} ({n} parameters): bf16 \
                        weights and gradients, a float32 master copy of the weights and AdamW's \
                        two float32 moments. Total bytes of these (no activations)?"
                    ),
                    expected: with_mistakes(
                        expected(Dimension::Bytes, bytes, gb(bytes)),
                        &[
                            ("forgot the float32 master copy", 12.0 * nf),
                            ("forgot the optimizer state", 4.0 * nf),
                            ("forgot the gradients", 14.0 * nf),
                            (
                                "used seed 003's 2 + 2 + 4 bytes (\"14 + 14 + 28 GB\"): 16-bit moments \
                        and no master copy, which is pure bf16, not this recipe",
                                8.0 * nf,
                            ),
                        ],
                    ),
                    hint: "2 (bf16 weights) + 2 (bf16 gradients) + 4 (master) + 8 (moments) bytes \
                        per parameter."
                        .into(),
                    explanation: format!(
                        "(2 + 2 + 4 + 8) × {n} = 16 × {n} = {}: mixed precision saves compute \
                        and activation memory, not model-state memory.",
                        gb(bytes)
                    ),
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
                        "In mixed-precision training of {name} ({n} parameters), how much \
                            memory does the float32 master copy of the weights take?"
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
    ]
}
