//! One LoRA case of the memory tests (`dora.rs`, `outer_lora.rs`): its settings, and its step
//! peak, gradients and kept activations measured by the counting allocator beside the
//! predictor's.

use super::*;
use napkin_core::config::AttentionKind;
use napkin_core::data::MicroBatch;
use napkin_core::predict::timeline::step_timeline;

/// A case: the model, the adapters and the step's shape.
pub(crate) struct Case {
    pub(crate) label: String,
    pub(crate) config: LlamaConfig,
    pub(crate) lora: LoraConfig,
    pub(crate) nf4: Option<Nf4Config>,
    pub(crate) batch: usize,
    pub(crate) seq: usize,
    pub(crate) checkpointing: bool,
    pub(crate) accumulation: usize,
    pub(crate) attention: AttentionKind,
    pub(crate) held_out: bool,
}

/// (what, measured, predicted) of one case: the step peak, the gradients, the kept activations.
pub(crate) fn measure(case: &Case) -> [(&'static str, f64, f64); 3] {
    let mut model = build(&case.config, case.nf4.as_ref(), true)
        .with_lora(&case.lora)
        .unwrap();
    model.attention = case.attention;
    let scenario = Scenario {
        lora: Some(case.lora.clone()),
        nf4: case.nf4,
        checkpointing: case.checkpointing,
        accumulation: case.accumulation,
        attention: case.attention,
        ..Scenario::new(case.config.clone(), case.batch, case.seq)
    };
    let rows = |seed: usize| {
        let rows: Vec<Vec<u32>> = (0..case.batch)
            .map(|b| {
                (0..case.seq)
                    .map(|i| ((i * 31 + b * 17 + seed * 7) % case.config.vocab_size) as u32)
                    .collect()
            })
            .collect();
        MicroBatch::causal(TokenBatch::from_rows(&rows).unwrap())
    };
    let micro: Vec<MicroBatch> = (0..case.accumulation).map(rows).collect();
    drop(one_step(&model, &micro, case.checkpointing));
    let start = reset_peak();
    let out = one_step(&model, &micro, case.checkpointing);
    let peak = (peak_bytes() - start) as f64;
    let held = live_bytes().saturating_sub(start) as f64;
    drop(out);
    let start = live_bytes();
    let loss = causal_lm_loss(model.forward(&micro[0].batch), &micro[0].labels).unwrap();
    let kept = (live_bytes() - start) as f64;
    drop(loss);
    let timeline = step_timeline(&scenario);
    let totals = totals_by_kind(&inventory(&scenario));
    [
        (
            "step peak",
            peak,
            (timeline.peak.bytes - timeline.persistent) as f64,
        ),
        ("gradients", held, totals[&Kind::Gradients] as f64),
        (
            "kept activations",
            kept,
            (totals[&Kind::SavedActivations] + totals[&Kind::Logits]) as f64,
        ),
    ]
}

/// Checks every case within 5 % (printing each figure) and returns the worst gap of the fit
/// and of the held-out cases.
pub(crate) fn check_within_5_percent(cases: &[Case]) -> [f64; 2] {
    let mut worst = [0f64; 2];
    for case in cases {
        let k = usize::from(case.held_out);
        for (what, measured, predicted) in measure(case) {
            let ratio = measured / predicted;
            eprintln!(
                "{:<9} {:<64} {what:<16} measured {measured:>11.0} predicted {predicted:>11.0} \
                 ratio {ratio:.4}",
                if case.held_out { "held out" } else { "fit" },
                case.label
            );
            worst[k] = worst[k].max((ratio - 1.0).abs());
            assert!(
                (ratio - 1.0).abs() <= 0.05,
                "{} {what}: measured {measured} vs predicted {predicted}",
                case.label
            );
        }
    }
    eprintln!(
        "worst |measured/predicted − 1|: fit {:.4}, held out {:.4}",
        worst[0], worst[1]
    );
    worst
}
