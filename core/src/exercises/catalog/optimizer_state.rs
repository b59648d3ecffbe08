//! Optimizer state and precision recipes: 8-bit AdamW, FP8 (MS-AMP).

use super::{Drawn, Exercise, PRESETS, expected, gb, model, sandbox, with_mistakes};
use crate::exercises::answer::Dimension;
use crate::predict::precision::{PrecisionRecipe, precision_table};
use crate::predict::rules::{OptimizerRule, Precision, optimizer_bytes_per_param};

/// The exercises of this topic, in teaching order.
pub(super) fn exercises() -> Vec<Exercise> {
    vec![
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
                        "8-bit AdamW keeps both moments in one byte each. For full \
                            fine-tuning of {name} ({n:.0} parameters), how much optimizer \
                            state, ignoring the small per-block scales?"
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
                        "MS-AMP O2 keeps each weight once in FP16 (cast to FP8 for every \
                            GEMM), FP8 weight gradients, an FP8 first moment and an FP16 second \
                            moment. How much model state does full fine-tuning of {name} \
                            ({n:.0} parameters) with AdamW need on one GPU, scaling factors \
                            aside? (Predicted only: FP8 needs Hopper- or Ada-class tensor \
                            cores.)"
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
                        "(2 + 1 + 1 + 2) × {n:.0} = {} — the FP8-LM paper's 6 bytes a \
                            parameter, against {} with bf16 and an f32 master copy (2 + 2 + 4 + \
                            4 + 4).",
                        gb(o2),
                        gb(row(PrecisionRecipe::Bf16Master))
                    ),
                    sandbox: Some(sandbox(id, 0, false, 256)),
                }
            },
        },
    ]
}
