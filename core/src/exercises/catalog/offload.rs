//! Offload: host memory and the link time of CPU offload.

use super::{
    Drawn, Exercise, PRESETS, SandboxSettings, expected, gb, model, sandbox, with_mistakes,
};
use crate::exercises::answer::Dimension;
use crate::predict::inventory::{Scenario, inventory};
use crate::predict::offload::{host_links, host_transfer};
use crate::predict::sharding::Offload;
use crate::predict::zero::{Cluster, zero2};

/// The exercises of this topic, in teaching order.
pub(super) fn exercises() -> Vec<Exercise> {
    vec![
        Exercise {
            id: "cpu-offload",
            title: "Offloading the optimizer",
            make: |d| {
                let (_, name, c) = model(d, &PRESETS);
                let gpus = d.pick(&[1u64, 4, 8]);
                let n = c.num_parameters();
                let e = zero2(
                    n,
                    Cluster {
                        gpus_per_node: gpus,
                        nodes: 1,
                    },
                    true,
                );
                let bytes = e.gpu_bytes as f64;
                Drawn {
                    question: format!(
                        "ZeRO-2 with the optimizer offloaded to the CPU, {name} ({n} \
                            parameters), {gpus} GPU(s): only the fp16 weights stay on each GPU. \
                            Bytes per GPU for the model states?"
                    ),
                    expected: with_mistakes(
                        expected(Dimension::Bytes, bytes, gb(bytes)),
                        &[("kept the fp16 gradients too", 2.0 * bytes)],
                    ),
                    hint: "2 bytes per parameter.".into(),
                    explanation: format!(
                        "2 × {n} = {}; the CPU holds the rest (DeepSpeed budgets {} per node).",
                        gb(bytes),
                        gb(e.cpu_bytes as f64)
                    ),
                    sandbox: None,
                }
            },
        },
        Exercise {
            id: "offload-link-time",
            title: "Offload: slower, but it fits",
            make: |d| {
                let (id, name, c) = model(d, &PRESETS[..3]);
                let link = d.pick(&host_links()[..3]);
                let s = Scenario::new(c.clone(), 1, 256);
                let n = s.trainable_parameters();
                let transfer = host_transfer(&s, &inventory(&s), Offload::OPTIMIZER);
                let seconds = transfer.seconds(&link);
                let rate = link.bytes_per_second.unwrap_or(f64::INFINITY);
                Drawn {
                    question: format!(
                        "Full fine-tuning of {name} ({n} parameters) on one GPU with the \
                            AdamW state offloaded to the CPU: each step sends the f32 gradients \
                            to the host, the CPU updates, and the f32 weights come back. Over \
                            {} ({:.2} GB/s each way, full duplex), how long do the transfers \
                            take per step, if nothing overlaps them?",
                        link.name,
                        rate / 1e9
                    ),
                    expected: with_mistakes(
                        expected(
                            Dimension::Seconds,
                            seconds,
                            format!("{:.1} ms", 1e3 * seconds),
                        ),
                        &[
                            ("added both directions on a full-duplex link", 2.0 * seconds),
                            ("moved 2-byte values", seconds / 2.0),
                        ],
                    ),
                    hint: "4 bytes × parameters, each way at the same time; divide by the link's \
                        rate."
                        .into(),
                    explanation: format!(
                        "4 × {n} = {} each way; {} / {:.2} GB/s = {:.1} ms per step, and {} \
                            (the AdamW state and an f32 master copy) stays off the GPU.",
                        gb(transfer.to_host as f64),
                        gb(transfer.to_host as f64),
                        rate / 1e9,
                        1e3 * seconds,
                        gb(transfer.host_bytes as f64)
                    ),
                    sandbox: Some(SandboxSettings {
                        device: None,
                        ..sandbox(id, 0, false, 256)
                    }),
                }
            },
        },
    ]
}
