//! Many GPUs: ZeRO-2, ZeRO-3 and FSDP memory per GPU, and what DDP sends each step.

use super::{
    Drawn, Exercise, PRESETS, SandboxSettings, expected, gb, mb, model, sandbox, with_mistakes,
};
use crate::config::{LoraConfig, LoraTarget};
use crate::exercises::answer::Dimension;
use crate::predict::communication::communication;
use crate::predict::inventory::Scenario;
use crate::predict::sharding::Strategy;
use crate::predict::zero::{Cluster, Zero3Offload, zero2, zero3};

/// The exercises of this topic, in teaching order.
pub(super) fn exercises() -> Vec<Exercise> {
    vec![
        Exercise {
            id: "zero2-gpu",
            title: "ZeRO-2 per GPU",
            make: |d| {
                let (id, name, c) = model(d, &PRESETS);
                let gpus = d.pick(&[2u64, 4, 8, 16]);
                let n = c.num_parameters();
                let e = zero2(
                    n,
                    Cluster {
                        gpus_per_node: gpus,
                        nodes: 1,
                    },
                    false,
                );
                let bytes = e.gpu_bytes as f64;
                let nf = n as f64;
                Drawn {
                    question: format!(
                        "DeepSpeed ZeRO-2, mixed-precision Adam, {name} ({n} parameters) on \
                            {gpus} GPUs: fp16 weights and gradients (2 + 2 bytes) are whole on \
                            each GPU, the other 16 bytes per parameter (fp32 master, two \
                            moments, fp32 gradient buffer) are sharded. Bytes per GPU?"
                    ),
                    expected: with_mistakes(
                        expected(Dimension::Bytes, bytes, gb(bytes)),
                        &[
                            ("sharded everything", (4.0 * nf + 16.0 * nf) / gpus as f64),
                            ("sharded nothing", 20.0 * nf),
                        ],
                    ),
                    hint: "4·N + 16·N / GPUs.".into(),
                    explanation: format!("4 × {n} + 16 × {n} / {gpus} = {}.", gb(bytes)),
                    sandbox: Some(SandboxSettings {
                        gpus,
                        ..sandbox(id, 0, false, 512)
                    }),
                }
            },
        },
        Exercise {
            id: "zero3-gpu",
            title: "ZeRO-3 per GPU",
            make: |d| {
                let (_, name, c) = model(d, &PRESETS);
                let gpus = d.pick(&[4u64, 8, 16]);
                let n = c.num_parameters();
                let largest = c.embedding_parameters().max(c.block_parameters());
                let e = zero3(
                    n,
                    largest,
                    Cluster {
                        gpus_per_node: gpus,
                        nodes: 1,
                    },
                    Zero3Offload::None,
                    true,
                );
                let bytes = e.gpu_bytes as f64;
                Drawn {
                    question: format!(
                        "DeepSpeed ZeRO-3, {name} ({n} parameters, largest layer {largest}) \
                            on {gpus} GPUs of one node, no offload: DeepSpeed's estimate is 4 \
                            bytes × the largest layer (gathered) + 18 bytes per parameter \
                            sharded over the GPUs. Bytes per GPU?"
                    ),
                    expected: with_mistakes(
                        expected(Dimension::Bytes, bytes, gb(bytes)),
                        &[(
                            "forgot the gathered largest layer",
                            18.0 * n as f64 / gpus as f64,
                        )],
                    ),
                    hint: "4·largest + 18·N / GPUs.".into(),
                    explanation: format!("4 × {largest} + 18 × {n} / {gpus} = {}.", gb(bytes)),
                    sandbox: None,
                }
            },
        },
        Exercise {
            id: "fsdp-optimizer",
            title: "FSDP FULL_SHARD and the optimizer state",
            make: |d| {
                let (id, name, c) = model(d, &PRESETS);
                let gpus = d.pick(&[2u64, 4, 8]);
                let n = c.num_parameters() as f64;
                let bytes = 8.0 * n / gpus as f64;
                Drawn {
                    question: format!(
                        "Full fine-tuning of {name} ({n:.0} parameters) with float32 AdamW \
                            under FSDP FULL_SHARD on {gpus} GPUs: how many bytes of optimizer \
                            state does each GPU hold?"
                    ),
                    expected: with_mistakes(
                        expected(Dimension::Bytes, bytes, gb(bytes)),
                        &[
                            ("did not shard it", 8.0 * n),
                            ("counted one moment", bytes / 2.0),
                        ],
                    ),
                    hint: "Two float32 moments per parameter, split evenly.".into(),
                    explanation: format!("8 × {n:.0} / {gpus} = {}.", gb(bytes)),
                    sandbox: Some(SandboxSettings {
                        gpus,
                        ..sandbox(id, 0, false, 512)
                    }),
                }
            },
        },
        Exercise {
            id: "ddp-allreduce",
            title: "What DDP sends each step with LoRA",
            make: |d| {
                let (id, name, c) = model(d, &PRESETS);
                let gpus = d.pick(&[2u64, 4, 8]);
                let r = d.pick(&[8usize, 16, 64]);
                let (targets, which) = d.pick(&[
                    (vec![LoraTarget::QProj, LoraTarget::VProj], "q and v"),
                    (LoraTarget::ALL.to_vec(), "all seven projections"),
                ]);
                let s = Scenario {
                    lora: Some(LoraConfig {
                        r,
                        targets,
                        ..LoraConfig::default()
                    }),
                    ..Scenario::new(c, 1, 512)
                };
                let trainable = s.trainable_parameters();
                let payload = 4.0 * trainable as f64;
                let sent = communication(&s, Strategy::Ddp, gpus, 1).sent_per_rank as f64;
                let all = 4.0 * s.config.num_parameters() as f64;
                let ring = 2.0 * (gpus - 1) as f64 / gpus as f64;
                Drawn {
                    question: format!(
                        "LoRA r {r} on {which} of {name} ({trainable} trainable parameters), \
                            DDP on {gpus} GPUs: once per optimizer step a ring all-reduce sums \
                            the float32 gradients of the trainable parameters. How many bytes \
                            does each GPU send per step?"
                    ),
                    expected: with_mistakes(
                        expected(Dimension::Bytes, sent, mb(sent)),
                        &[
                            ("sent the gradients once", payload),
                            ("forgot the ring's (N − 1)/N", 2.0 * payload),
                            ("all-reduced the whole model's gradients", ring * all),
                        ],
                    ),
                    hint: "A ring all-reduce sends 2·(N − 1)/N of the payload from each GPU; the \
                        payload is 4 bytes per trainable parameter."
                        .into(),
                    explanation: format!(
                        "4 × {trainable} = {} of gradients; each GPU sends 2 × ({gpus} − 1) / \
                            {gpus} of them: {}. The frozen base sends nothing.",
                        mb(payload),
                        mb(sent)
                    ),
                    sandbox: Some(SandboxSettings {
                        gpus,
                        ..sandbox(id, r, false, 512)
                    }),
                }
            },
        },
    ]
}
