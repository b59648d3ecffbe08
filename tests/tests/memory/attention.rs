//! The memory-efficient attention at long context: the `T × T` term vanishes from the
//! prediction, and the measured bytes drop by what the predictor says.

use super::*;
use napkin_core::config::AttentionKind;
use napkin_core::data::MicroBatch;
use napkin_core::predict::timeline::step_timeline;

/// Saved activations of one forward and the step peak, measured and predicted, for LoRA and
/// full fine-tuning with and without checkpointing, at T = 1024 on the small config.
#[test]
fn efficient_attention_removes_the_t_squared_bytes_as_predicted() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let config = LlamaConfig::small();
    let t = 1024;
    let lora = LoraConfig {
        r: 8,
        ..Default::default()
    };
    let ids: Vec<u32> = (0..t)
        .map(|i| (i * 31 % config.vocab_size) as u32)
        .collect();
    let micro = [MicroBatch::causal(TokenBatch::from_rows(&[ids]).unwrap())];
    let mut worst: f64 = 0.0;
    for with_lora in [true, false] {
        let mut model = build(&config, None, true);
        if with_lora {
            model = model.with_lora(&lora).unwrap();
        }
        let mut saved = Vec::new();
        for attention in [AttentionKind::Eager, AttentionKind::Efficient] {
            model.attention = attention;
            let scenario = |checkpointing| Scenario {
                lora: with_lora.then(|| lora.clone()),
                checkpointing,
                attention,
                ..Scenario::new(config.clone(), 1, t)
            };
            let label = format!("lora={with_lora} {attention}");
            // The loss keeps the logits for its backward too (their own kind).
            let totals = totals_by_kind(&inventory(&scenario(false)));
            let predicted_saved = (totals[&Kind::SavedActivations] + totals[&Kind::Logits]) as f64;
            let start = live_bytes();
            let loss = causal_lm_loss(model.forward(&micro[0].batch), &micro[0].labels).unwrap();
            let measured_saved = (live_bytes() - start) as f64;
            drop(loss);
            eprintln!(
                "{label:<28} saved activations: measured {} predicted {} ratio {:.4}",
                mib(measured_saved),
                mib(predicted_saved),
                measured_saved / predicted_saved
            );
            worst = worst.max((measured_saved / predicted_saved - 1.0).abs());
            saved.push((measured_saved, predicted_saved));
            for checkpointing in [false, true] {
                let step = || one_step(&model, &micro, checkpointing);
                drop(step()); // warm-up
                let start = reset_peak();
                let out = step();
                let measured = (peak_bytes() - start) as f64;
                drop(out);
                let timeline = step_timeline(&scenario(checkpointing));
                let predicted = (timeline.peak.bytes - timeline.persistent) as f64;
                eprintln!(
                    "{label:<28} ckpt={checkpointing:<5} step peak: measured {} predicted {} ratio {:.4}",
                    mib(measured),
                    mib(predicted),
                    measured / predicted
                );
                worst = worst.max((measured / predicted - 1.0).abs());
            }
        }
        let (eager, efficient) = (saved[0], saved[1]);
        let (measured_drop, predicted_drop) = (eager.0 - efficient.0, eager.1 - efficient.1);
        eprintln!(
            "lora={with_lora}: the efficient attention saves {} measured, {} predicted",
            mib(measured_drop),
            mib(predicted_drop)
        );
        assert!(
            (measured_drop / predicted_drop - 1.0).abs() <= 0.05,
            "lora={with_lora}: measured drop {measured_drop} vs predicted {predicted_drop}"
        );
    }
    assert!(worst <= 0.05, "worst |measured/predicted − 1| = {worst:.4}");
}
