//! Will it fit: the step's peak against a device, and GB against GiB.

use super::{Drawn, Exercise, SandboxSettings, expected, gb, lora, model, sandbox};
use crate::config::Nf4Config;
use crate::exercises::answer::{Dimension, Expected};
use crate::predict::inventory::Scenario;
use crate::predict::time::{device_preset, device_presets};
use crate::predict::timeline::step_timeline;

/// The exercises of this topic, in teaching order.
pub(super) fn exercises() -> Vec<Exercise> {
    vec![
        Exercise {
            id: "will-it-fit",
            title: "Will it fit?",
            make: |d| {
                let (id, name, c) = model(
                    d,
                    &[
                        ("tinyllama-1.1b", "TinyLlama-1.1B"),
                        ("llama-3.2-1b", "Llama-3.2-1B"),
                        ("llama-2-7b", "Llama-2-7B"),
                    ],
                );
                let device = d.pick(&["t4", "rtx3090", "a100-40gb", "a100-80gb"]);
                let device = device_preset(device).unwrap_or_else(|| device_presets().remove(0));
                let (lora_r, nf4, ckpt) = d.pick(&[
                    (0usize, false, false),
                    (16, false, true),
                    (16, true, true),
                    (16, true, false),
                ]);
                let t = d.pick(&[512usize, 2048]);
                let s = Scenario {
                    lora: (lora_r > 0).then(|| lora(lora_r)),
                    nf4: nf4.then_some(Nf4Config {
                        block_size: 64,
                        double_quant: true,
                    }),
                    checkpointing: ckpt,
                    ..Scenario::new(c, 1, t)
                };
                let peak = step_timeline(&s).peak;
                let fits = peak.bytes as f64 <= device.memory;
                let what = match (lora_r, nf4) {
                    (0, _) => "full fine-tuning".to_string(),
                    (r, true) => format!("QLoRA r = {r}"),
                    (r, false) => format!("LoRA r = {r}"),
                };
                Drawn {
                    question: format!(
                        "napkin's float32 engine, {name}, {what}{}, AdamW, 1 × {t} tokens, on \
                        the {} ({:.0} GB). Does the step fit, yes or no? (Use `napkin estimate` \
                        for the peak.)",
                        if ckpt { " with checkpointing" } else { "" },
                        device.name,
                        device.memory / 1e9
                    ),
                    expected: Expected {
                        dimension: Dimension::Choice,
                        value: if fits { 0.0 } else { 1.0 },
                        display: format!(
                            "{} (peak {} at `{}`)",
                            if fits { "yes" } else { "no" },
                            gb(peak.bytes as f64),
                            peak.label
                        ),
                        tolerance: 0.0,
                        choices: vec!["yes".into(), "no".into()],
                        mistakes: vec![],
                        unit: None,
                    },
                    hint: "Weights + gradients + optimizer state + the activations alive at the \
                        peak, against the card's memory."
                        .into(),
                    explanation: format!(
                        "predicted peak {} at `{}` vs {:.0} GB.",
                        gb(peak.bytes as f64),
                        peak.label,
                        device.memory / 1e9
                    ),
                    sandbox: Some(SandboxSettings {
                        checkpointing: ckpt,
                        device: Some(device.id.clone()),
                        ..sandbox(id, lora_r, nf4, t)
                    }),
                }
            },
        },
        Exercise {
            id: "gb-vs-gib",
            title: "GB or GiB?",
            make: |d| {
                let gbs = d.pick(&[16.0, 24.0, 40.0, 80.0]);
                let bytes = gbs * 1e9;
                Drawn {
                    question: format!(
                        "A GPU is sold with {gbs} GB of memory (10⁹ bytes each). How many \
                            GiB (2³⁰ bytes) is that? Answer in GiB."
                    ),
                    expected: Expected {
                        unit: Some("gib".into()),
                        tolerance: 0.002,
                        ..expected(
                            Dimension::Bytes,
                            bytes,
                            format!("{:.3} GiB", bytes / (1u64 << 30) as f64),
                        )
                    },
                    hint: "Divide the bytes by 1,073,741,824.".into(),
                    explanation: format!(
                        "{gbs} × 10⁹ / 2³⁰ = {:.3} GiB: tools that print \"GB\" for 2³⁰ \
                            (accelerate, nvidia-smi's MiB) read 7 % lower than the box.",
                        bytes / (1u64 << 30) as f64
                    ),
                    sandbox: None,
                }
            },
        },
    ]
}
