//! Time: arithmetic intensity, the roofline verdict, a step's time, LoRA's FLOPs.

use super::{
    Drawn, Exercise, PRESETS, SandboxSettings, expected, lora, model, sandbox, with_mistakes,
};
use crate::config::LlamaConfig;
use crate::exercises::answer::{Dimension, Expected};
use crate::predict::inventory::Scenario;
use crate::predict::time::{Bound, device_preset, device_presets, roofline, step_work};

/// The exercises of this topic, in teaching order.
pub(super) fn exercises() -> Vec<Exercise> {
    vec![
        Exercise {
            id: "matmul-intensity",
            title: "Arithmetic intensity of a matmul",
            make: |d| {
                let m = d.pick(&[1.0, 16.0, 256.0, 4096.0]);
                let k = d.pick(&[2048.0, 4096.0]);
                let n = d.pick(&[4096.0, 11008.0]);
                let flops = 2.0 * m * k * n;
                let bytes = 2.0 * (m * k + k * n + m * n);
                let ai = flops / bytes;
                Drawn {
                    question: format!(
                        "A bf16 matmul [{m} × {k}] · [{k} × {n}] reads both inputs once and \
                            writes the output once. How many FLOPs per byte?"
                    ),
                    expected: with_mistakes(
                        Expected {
                            dimension: Dimension::Ratio,
                            value: ai,
                            display: format!("{ai:.2} FLOP/byte"),
                            tolerance: 0.01,
                            choices: vec![],
                            mistakes: vec![],
                            unit: None,
                        },
                        &[
                            ("forgot the output write", flops / (2.0 * (m * k + k * n))),
                            ("counted one FLOP per multiply-add", ai / 2.0),
                        ],
                    ),
                    hint: "2·m·k·n FLOPs over 2 bytes × (m·k + k·n + m·n).".into(),
                    explanation: format!(
                        "{flops:.3e} / {bytes:.3e} = {ai:.2}: one row (m = 1) is always \
                            memory-bound."
                    ),
                    sandbox: None,
                }
            },
        },
        Exercise {
            id: "roofline-verdict",
            title: "Compute- or memory-bound?",
            make: |d| {
                let device = d.pick(&device_presets());
                let (b, t, lora_r) = d.pick(&[
                    (1usize, 2usize, 0usize),
                    (32, 128, 16),
                    (8, 512, 16),
                    (1, 256, 0),
                ]);
                let c = LlamaConfig::smollm2_135m();
                let s = Scenario {
                    lora: (lora_r > 0).then(|| lora(lora_r)),
                    ..Scenario::new(c, b, t)
                };
                let w = step_work(&s);
                let r = roofline(&w, (b * t) as f64, &device, false);
                let verdict = match r.bound {
                    Bound::Compute => 0.0,
                    Bound::Memory => 1.0,
                };
                let what = if lora_r > 0 {
                    format!("LoRA r = {lora_r}")
                } else {
                    "full fine-tuning".into()
                };
                Drawn {
                    question: format!(
                        "napkin's float32 step of SmolLM2-135M, {what}, {b} × {t} tokens: \
                            {:.3} TFLOP and {:.2} GB moved. On the {} ({:.1} TFLOP/s float32, \
                            {:.0} GB/s), is it compute-bound or memory-bound?",
                        w.flops() / 1e12,
                        w.bytes_moved / 1e9,
                        device.name,
                        device.f32_flops / 1e12,
                        device.bandwidth / 1e9
                    ),
                    expected: Expected {
                        dimension: Dimension::Choice,
                        value: verdict,
                        display: format!(
                            "{} ({:.0} FLOP/byte against a ridge of {:.0})",
                            if verdict == 0.0 { "compute" } else { "memory" },
                            r.arithmetic_intensity,
                            r.ridge_point
                        ),
                        tolerance: 0.0,
                        choices: vec!["compute".into(), "memory".into()],
                        mistakes: vec![],
                        unit: None,
                    },
                    hint: "Compare FLOPs / bytes with the device's FLOP/s / (bytes/s).".into(),
                    explanation: format!(
                        "intensity {:.1} FLOP/byte, ridge {:.1}: compute {:.2} ms vs memory \
                            {:.2} ms.",
                        r.arithmetic_intensity,
                        r.ridge_point,
                        1e3 * r.compute_seconds,
                        1e3 * r.memory_seconds
                    ),
                    sandbox: Some(SandboxSettings {
                        micro_batch: b,
                        device: Some(device.id.clone()),
                        ..sandbox("smollm2-135m", lora_r, false, t)
                    }),
                }
            },
        },
        Exercise {
            id: "step-time",
            title: "Step time from FLOPs",
            make: |d| {
                let (id, name, c) = model(d, &PRESETS);
                let device = d.pick(&["a100-80gb", "h100", "rtx4090"]);
                let device = device_preset(device).unwrap_or_else(|| device_presets().remove(0));
                let mfu = d.pick(&[0.3, 0.4, 0.5]);
                let tokens = d.pick(&[4096.0, 65536.0, 524288.0]);
                let n = c.num_parameters() as f64;
                let seconds = 6.0 * n * tokens / (device.half_flops * mfu);
                Drawn {
                    question: format!(
                        "Full fine-tuning costs about 6 FLOPs per parameter per token. \
                            {name} ({n:.0} parameters), {tokens} tokens per step, on the {} at \
                            {:.0} TFLOP/s bf16 with {:.0} % model FLOPs utilisation: seconds \
                            per step?",
                        device.name,
                        device.half_flops / 1e12,
                        100.0 * mfu
                    ),
                    expected: with_mistakes(
                        Expected {
                            tolerance: 0.01,
                            ..expected(Dimension::Seconds, seconds, format!("{seconds:.4} s"))
                        },
                        &[
                            ("counted the forward only (2 FLOPs)", seconds / 3.0),
                            ("forgot the utilisation", seconds * mfu),
                        ],
                    ),
                    hint: "6 · N · tokens / (peak FLOP/s × utilisation).".into(),
                    explanation: format!(
                        "6 × {n:.0} × {tokens} / ({:.0e} × {mfu}) = {seconds:.4} s.",
                        device.half_flops
                    ),
                    sandbox: Some(SandboxSettings {
                        device: Some(device.id.clone()),
                        ..sandbox(id, 0, false, 512)
                    }),
                }
            },
        },
        Exercise {
            id: "lora-flops",
            title: "What LoRA saves in compute",
            make: |d| {
                let (id, name, c) = model(d, &PRESETS);
                let r = d.pick(&[8usize, 16, 64]);
                let t = 512;
                let full = step_work(&Scenario::new(c.clone(), 1, t));
                let lo = step_work(&Scenario {
                    lora: Some(lora(r)),
                    ..Scenario::new(c, 1, t)
                });
                let share = 100.0 * lo.lora_saved_flops / full.flops();
                Drawn {
                    question: format!(
                        "{name}, 1 × {t} tokens: full fine-tuning computes input gradients and \
                        weight gradients for every linear; LoRA r = {r} computes no weight \
                        gradient for the frozen base (but adds its small adapters). What \
                        percentage of full fine-tuning's FLOPs does LoRA save?"
                    ),
                    expected: Expected {
                        tolerance: 0.02,
                        ..expected(Dimension::Percent, share, format!("{share:.1} %"))
                    },
                    hint: "A linear's backward is two products (input gradient, weight gradient), \
                        each as large as its forward."
                        .into(),
                    explanation: format!(
                        "saved {:.3} TFLOP of {:.3} TFLOP = {share:.1} % (the attention's \
                        backward is not saved).",
                        lo.lora_saved_flops / 1e12,
                        full.flops() / 1e12
                    ),
                    sandbox: Some(sandbox(id, r, false, t)),
                }
            },
        },
    ]
}
