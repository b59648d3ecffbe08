//! The logits: the largest activation of a small model.

use super::{
    Drawn, Exercise, PRESETS, SandboxSettings, expected, gb, model, sandbox, with_mistakes,
};
use crate::exercises::answer::Dimension;

/// The exercises of this topic, in teaching order.
pub(super) fn exercises() -> Vec<Exercise> {
    vec![Exercise {
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
                    "{name} has a vocabulary of {v} tokens. How many bytes do the float32 \
                        logits of a batch of {b} × {t} tokens take?"
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
    }]
}
