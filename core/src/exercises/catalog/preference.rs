//! Preference tuning: what DPO's reference model costs with LoRA (a forward, no weights), and
//! DPO against ORPO at the same budget.

use super::{Drawn, Exercise, SandboxSettings, expected, gb, lora, model, sandbox, with_mistakes};
use crate::config::{Nf4Config, ObjectiveKind};
use crate::exercises::answer::{Dimension, Expected};
use crate::predict::inventory::Scenario;
use crate::predict::settings::StepSettings;
use crate::predict::time::{device_preset, device_presets, roofline, step_work};
use crate::predict::timeline::step_timeline;

/// A preference step of `objective`: QLoRA or LoRA r = 16 on every linear, `pairs` pairs of
/// two `seq`-token sequences each, as the trainer runs it.
fn step(
    config: &crate::config::LlamaConfig,
    objective: ObjectiveKind,
    nf4: bool,
    pairs: usize,
    seq: usize,
    checkpointing: bool,
) -> Scenario {
    let r = lora(16);
    StepSettings {
        objective,
        micro_batch: pairs,
        seq_len: seq,
        lora_r: r.r,
        lora_alpha: Some(r.alpha),
        nf4: nf4.then_some(Nf4Config {
            block_size: 64,
            double_quant: true,
        }),
        checkpointing,
        ..StepSettings::default()
    }
    .build(config.clone())
}

/// The exercises of this topic, in teaching order.
pub(super) fn exercises() -> Vec<Exercise> {
    vec![
        Exercise {
            id: "dpo-reference-cost",
            title: "What does DPO's reference model cost with LoRA?",
            make: |d| {
                let (id, name, c) = model(
                    d,
                    &[
                        ("smollm2-135m", "SmolLM2-135M"),
                        ("tinyllama-1.1b", "TinyLlama-1.1B"),
                        ("llama-3.2-1b", "Llama-3.2-1B"),
                    ],
                );
                let (pairs, seq) = d.pick(&[(1usize, 256usize), (2, 512), (4, 256)]);
                let nf4 = d.pick(&[true, false]);
                let dpo = step(&c, ObjectiveKind::Dpo, nf4, pairs, seq, true);
                let orpo = step(&c, ObjectiveKind::Orpo, nf4, pairs, seq, true);
                let flops = step_work(&dpo).forward_flops - step_work(&orpo).forward_flops;
                let (dpo_peak, orpo_peak) = (step_timeline(&dpo), step_timeline(&orpo));
                let tokens = 2 * pairs * seq;
                Drawn {
                    question: format!(
                        "DPO on {name} with {} r = 16 on every linear and checkpointing: {pairs} \
                         pair(s) a step, chosen and rejected {seq} tokens each. The reference \
                         policy is the same base with the adapters switched off, run without a \
                         graph on each micro-batch. How many FLOPs does it add to each step? \
                         (Use `napkin estimate --objective dpo` beside `--objective orpo`.)",
                        if nf4 { "QLoRA" } else { "LoRA" }
                    ),
                    expected: with_mistakes(
                        expected(
                            Dimension::Flops,
                            flops,
                            format!("{:.3} TFLOP", flops / 1e12),
                        ),
                        &[
                            ("a forward and a backward", 3.0 * flops),
                            ("the chosen sequences only", flops / 2.0),
                        ],
                    ),
                    hint: "One forward of the base over both sequences of every pair: about \
                        2 × parameters × tokens, plus the attention's products. No backward: \
                        the reference takes no gradient."
                        .into(),
                    explanation: format!(
                        "one forward of {tokens} tokens: {:.3} TFLOP (the policy's step: {:.3} \
                         TFLOP). Its weights cost nothing: they are the base the policy already \
                         holds. Its memory is a transient, the residual stream, one block and \
                         the logits ({}); the step's peak stays at `{}`, {} (ORPO's {}).",
                        flops / 1e12,
                        step_work(&orpo).flops() / 1e12,
                        gb(dpo
                            .config
                            .vocab_size
                            .saturating_mul(dpo.micro_batch * dpo.seq_len)
                            as f64
                            * 4.0),
                        dpo_peak.peak.label,
                        gb(dpo_peak.peak.bytes as f64),
                        gb(orpo_peak.peak.bytes as f64)
                    ),
                    sandbox: Some(SandboxSettings {
                        objective: ObjectiveKind::Dpo,
                        micro_batch: pairs,
                        checkpointing: true,
                        ..sandbox(id, 16, nf4, seq)
                    }),
                }
            },
        },
        Exercise {
            id: "dpo-vs-orpo-time",
            title: "DPO or ORPO at the same budget",
            make: |d| {
                let (id, name, c) = model(
                    d,
                    &[
                        ("smollm2-135m", "SmolLM2-135M"),
                        ("tinyllama-1.1b", "TinyLlama-1.1B"),
                        ("llama-3.2-1b", "Llama-3.2-1B"),
                    ],
                );
                let device = d.pick(&["t4", "rtx3090", "a100-40gb"]);
                let device = device_preset(device).unwrap_or_else(|| device_presets().remove(0));
                let checkpointing = d.pick(&[true, false]);
                let seq = d.pick(&[256usize, 512]);
                let time = |objective| {
                    let s = step(&c, objective, true, 2, seq, checkpointing);
                    roofline(&step_work(&s), s.tokens() as f64, &device, false).step_seconds
                };
                let (dpo, orpo) = (time(ObjectiveKind::Dpo), time(ObjectiveKind::Orpo));
                let ratio = dpo / orpo;
                Drawn {
                    question: format!(
                        "QLoRA r = 16 on {name}, 2 pairs a step of {seq}-token sequences{}, \
                         float32, on the {}. At the same settings, how many times longer is a \
                         DPO step than an ORPO step? Answer as a ratio.",
                        if checkpointing {
                            ", with checkpointing"
                        } else {
                            ""
                        },
                        device.name
                    ),
                    expected: with_mistakes(
                        Expected {
                            tolerance: 0.01,
                            ..expected(Dimension::Ratio, ratio, format!("{ratio:.3}"))
                        },
                        &[("the reference costs nothing", 1.0)],
                    ),
                    hint: "Both run the policy's forward and backward (and recompute with \
                        checkpointing) over both sequences; DPO adds the reference's forward, \
                        ORPO nothing. Compare the roofline times."
                        .into(),
                    explanation: format!(
                        "DPO {:.1} ms against ORPO {:.1} ms on the roofline: {ratio:.3}×. \
                         ORPO needs no reference (its odds ratio compares the policy with \
                         itself); DPO's reference is one more forward, no memory beyond a \
                         transient.",
                        1e3 * dpo,
                        1e3 * orpo
                    ),
                    sandbox: Some(SandboxSettings {
                        objective: ObjectiveKind::Orpo,
                        micro_batch: 2,
                        checkpointing,
                        device: Some(device.id.clone()),
                        ..sandbox(id, 16, true, seq)
                    }),
                }
            },
        },
    ]
}
