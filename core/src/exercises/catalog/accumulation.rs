//! Gradient accumulation: the effective batch.

use super::{Drawn, Exercise, expected, with_mistakes};
use crate::exercises::answer::Dimension;

/// The exercises of this topic, in teaching order.
pub(super) fn exercises() -> Vec<Exercise> {
    vec![Exercise {
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
                    "Micro-batch {micro} sequences of {t} tokens, {accum} accumulation \
                        steps, {gpus} data-parallel GPU(s). How many tokens does one optimizer \
                        step see?"
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
    }]
}
