//! Data-parallel communication per optimizer step: the collectives each strategy runs, the bytes
//! each carries, what one rank sends on a ring, and the time that takes on common links.
//!
//! On N ranks the bandwidth-optimal (ring) algorithms send, per rank, `(N−1)/N` of the payload
//! for an all-gather or a reduce-scatter and `2(N−1)/N` for an all-reduce (a reduce-scatter
//! then an all-gather); "payload" is the whole tensor's bytes, on each rank. With A micro-batches
//! per optimizer step:
//! - DDP and FSDP NO_SHARD: one all-reduce of the trainable parameters' f32 gradients per
//!   optimizer step (the micro-batches before the last run under `no_sync`).
//! - ZeRO-1: the gradients reduce-scattered once per optimizer step (each rank updates its
//!   shard of the state), the updated trainable parameters all-gathered: the same bytes as DDP.
//! - ZeRO-2 and FSDP SHARD_GRAD_OP: the gradients are kept sharded, so they are reduce-scattered
//!   in every micro-batch's backward; the updated parameters all-gathered once per step.
//! - ZeRO-3, FSDP FULL_SHARD: every parameter unit (a decoder block; what lives outside the
//!   blocks) is all-gathered for its forward and again for its backward, in every micro-batch
//!   (a checkpointed block recomputes inside its backward, on the parameters gathered for it),
//!   and the trainable gradients are reduce-scattered in every backward. The parameters stay
//!   sharded after the update.
//! - HYBRID_SHARD: FULL_SHARD inside each node's G GPUs, and an all-reduce of each gradient
//!   shard across the nodes, in every backward.
//!
//! The parameters gathered are the resident values (NF4 codes and scales as stored, float
//! weights, adapters; not the host's bookkeeping of the tensors); the gradients are f32, as the
//! engine's.

use serde::Serialize;

use super::inventory::{PARAMETER_BOOKKEEPING, Scenario, inventory};
use super::sharding::{Strategy, is_parameter};

/// Bytes of an f32 gradient or master parameter.
const F32: u64 = 4;

/// A collective operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Collective {
    /// Every rank ends with the sum.
    AllReduce,
    /// Every rank ends with every rank's shard.
    AllGather,
    /// Every rank ends with its shard of the sum.
    ReduceScatter,
}

impl Collective {
    /// The name NCCL and MPI give it.
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all-reduce",
            Collective::AllGather => "all-gather",
            Collective::ReduceScatter => "reduce-scatter",
        }
    }

    /// Bytes one rank sends on a ring of `ranks` for a payload of `bytes` (whole tensor).
    pub fn sent_per_rank(self, bytes: u64, ranks: u64) -> u64 {
        if ranks <= 1 {
            return 0;
        }
        let steps = match self {
            Collective::AllReduce => 2 * (ranks - 1),
            Collective::AllGather | Collective::ReduceScatter => ranks - 1,
        };
        // Each ring step moves one of the N chunks (the last chunk may be shorter).
        steps * bytes.div_ceil(ranks)
    }
}

/// One kind of collective call of a step, repeated `calls` times per optimizer step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CollectiveCall {
    /// What it carries (`gradients`, `parameters for the forward`).
    pub what: &'static str,
    /// The operation.
    pub op: Collective,
    /// The whole tensor's bytes, per call.
    pub payload: u64,
    /// The ranks taking part.
    pub ranks: u64,
    /// Calls per optimizer step.
    pub calls: u64,
    /// Whether it crosses nodes (HYBRID_SHARD's replicas).
    pub across_nodes: bool,
}

impl CollectiveCall {
    /// Bytes one rank sends for all of this call's repetitions in a step.
    pub fn sent_per_rank(&self) -> u64 {
        self.calls * self.op.sent_per_rank(self.payload, self.ranks)
    }
}

/// An inter-GPU link: one direction's rate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuLink {
    /// Short id (`nvlink4`).
    pub id: &'static str,
    /// What it is.
    pub name: &'static str,
    /// Bytes per second a GPU sends (nominal, one direction).
    pub bytes_per_second: f64,
}

/// The links the roofline knows between GPUs (nominal, per direction, per GPU): NVLink 4 on an
/// H100 SXM (450 GB/s), NVLink 3 on an A100 SXM (300 GB/s), PCIe 5.0 / 4.0 x16 (63 / 31.5 GB/s,
/// GPU to GPU through the host bridge or a switch), 100 and 10 Gigabit Ethernet between nodes
/// (12.5 / 1.25 GB/s).
pub fn gpu_links() -> Vec<GpuLink> {
    vec![
        GpuLink {
            id: "nvlink4",
            name: "NVLink 4 (H100 SXM)",
            bytes_per_second: 450e9,
        },
        GpuLink {
            id: "nvlink3",
            name: "NVLink 3 (A100 SXM)",
            bytes_per_second: 300e9,
        },
        GpuLink {
            id: "pcie5",
            name: "PCIe 5.0 x16",
            bytes_per_second: 63e9,
        },
        GpuLink {
            id: "pcie4",
            name: "PCIe 4.0 x16",
            bytes_per_second: 31.5e9,
        },
        GpuLink {
            id: "100gbe",
            name: "100 Gigabit Ethernet",
            bytes_per_second: 12.5e9,
        },
        GpuLink {
            id: "10gbe",
            name: "10 Gigabit Ethernet",
            bytes_per_second: 1.25e9,
        },
    ]
}

/// A step's communication on one link.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LinkSeconds {
    /// The link's id.
    pub id: &'static str,
    /// What it is.
    pub name: &'static str,
    /// Seconds per optimizer step when nothing overlaps the transfers and every call runs on
    /// this link.
    pub seconds_per_step: f64,
}

/// What one optimizer step sends between the GPUs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Communication {
    /// The strategy.
    pub strategy: Strategy,
    /// GPUs in all.
    pub gpus: u64,
    /// The calls, by kind.
    pub calls: Vec<CollectiveCall>,
    /// Bytes one rank sends per optimizer step, all calls.
    pub sent_per_rank: u64,
    /// Of those, the bytes that cross nodes.
    pub sent_across_nodes_per_rank: u64,
    /// The time on each link.
    pub links: Vec<LinkSeconds>,
}

/// The communication of `s` run with `strategy` on `nodes` × `gpus_per_node` GPUs.
pub fn communication(
    s: &Scenario,
    strategy: Strategy,
    gpus_per_node: u64,
    nodes: u64,
) -> Communication {
    let gpus_per_node = gpus_per_node.max(1);
    let nodes = nodes.max(1);
    let gpus = gpus_per_node * nodes;
    let micro_batches = s.accumulation.max(1) as u64;
    let gradients = F32 * s.trainable_parameters();
    let parameters: u64 = inventory(s)
        .iter()
        .filter(|e| e.name != PARAMETER_BOOKKEEPING && is_parameter(e.kind))
        .map(|e| e.bytes)
        .sum();
    let call = |what, op, payload, ranks, calls| CollectiveCall {
        what,
        op,
        payload,
        ranks,
        calls,
        across_nodes: false,
    };
    let calls = match strategy {
        Strategy::Ddp | Strategy::NoShard => {
            vec![call("gradients", Collective::AllReduce, gradients, gpus, 1)]
        }
        Strategy::Zero1 => vec![
            call("gradients", Collective::ReduceScatter, gradients, gpus, 1),
            call(
                "updated parameters",
                Collective::AllGather,
                gradients,
                gpus,
                1,
            ),
        ],
        Strategy::Zero2 | Strategy::ShardGradOp => vec![
            call(
                "gradients",
                Collective::ReduceScatter,
                gradients,
                gpus,
                micro_batches,
            ),
            call(
                "updated parameters",
                Collective::AllGather,
                gradients,
                gpus,
                1,
            ),
        ],
        Strategy::Zero3 | Strategy::FullShard | Strategy::HybridShard => {
            let group = if strategy == Strategy::HybridShard {
                gpus_per_node
            } else {
                gpus
            };
            let mut calls = vec![
                call(
                    "parameters for the forward",
                    Collective::AllGather,
                    parameters,
                    group,
                    micro_batches,
                ),
                call(
                    "parameters for the backward",
                    Collective::AllGather,
                    parameters,
                    group,
                    micro_batches,
                ),
                call(
                    "gradients",
                    Collective::ReduceScatter,
                    gradients,
                    group,
                    micro_batches,
                ),
            ];
            if strategy == Strategy::HybridShard && nodes > 1 {
                calls.push(CollectiveCall {
                    across_nodes: true,
                    ..call(
                        "gradient shards across the nodes",
                        Collective::AllReduce,
                        gradients.div_ceil(group),
                        nodes,
                        micro_batches,
                    )
                });
            }
            calls
        }
    };
    let sent_per_rank = calls.iter().map(CollectiveCall::sent_per_rank).sum();
    let sent_across_nodes_per_rank = calls
        .iter()
        .filter(|c| c.across_nodes)
        .map(CollectiveCall::sent_per_rank)
        .sum();
    let links = gpu_links()
        .into_iter()
        .map(|l| LinkSeconds {
            id: l.id,
            name: l.name,
            seconds_per_step: sent_per_rank as f64 / l.bytes_per_second,
        })
        .collect();
    Communication {
        strategy,
        gpus,
        calls,
        sent_per_rank,
        sent_across_nodes_per_rank,
        links,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{LlamaConfig, LoraConfig, LoraTarget, Nf4Config};

    /// TinyLlama-1.1B with peft's default adapter (r 8 on q and v): 1,126,400 trainable
    /// parameters, as peft's `print_trainable_parameters` reports them.
    fn tiny_llama_qv(accumulation: usize) -> Scenario {
        Scenario {
            lora: Some(LoraConfig {
                r: 8,
                targets: vec![LoraTarget::QProj, LoraTarget::VProj],
                ..LoraConfig::default()
            }),
            accumulation,
            ..Scenario::new(LlamaConfig::tiny_llama_1_1b(), 1, 512)
        }
    }

    #[test]
    fn ring_collectives_send_their_share() {
        // 4 ranks, 1,000 bytes: an all-reduce sends 6 chunks of 250, a gather 3.
        assert_eq!(Collective::AllReduce.sent_per_rank(1000, 4), 1500);
        assert_eq!(Collective::AllGather.sent_per_rank(1000, 4), 750);
        assert_eq!(Collective::ReduceScatter.sent_per_rank(1000, 4), 750);
        // One rank sends nothing; a payload that does not split evenly rounds its chunks up.
        assert_eq!(Collective::AllReduce.sent_per_rank(1000, 1), 0);
        assert_eq!(Collective::AllGather.sent_per_rank(10, 3), 8);
    }

    #[test]
    fn ddp_all_reduces_the_adapters_gradients_once_a_step() {
        let s = tiny_llama_qv(4);
        assert_eq!(s.trainable_parameters(), 1_126_400);
        let c = communication(&s, Strategy::Ddp, 4, 1);
        assert_eq!(c.calls.len(), 1);
        assert_eq!(c.calls[0].payload, 4_505_600);
        assert_eq!(c.calls[0].calls, 1);
        // 2·3/4 of 4,505,600 bytes.
        assert_eq!(c.sent_per_rank, 6_758_400);
        assert_eq!(c.sent_across_nodes_per_rank, 0);
        // PCIe 4.0 x16 at 31.5 GB/s: 0.215 ms.
        let pcie4 = c.links.iter().find(|l| l.id == "pcie4").unwrap();
        assert!((pcie4.seconds_per_step - 6_758_400.0 / 31.5e9).abs() < 1e-12);
        // ZeRO-1 moves the same bytes, split into its two halves.
        assert_eq!(
            communication(&s, Strategy::Zero1, 4, 1).sent_per_rank,
            6_758_400
        );
    }

    #[test]
    fn sharded_gradients_are_reduced_every_micro_batch() {
        let s = tiny_llama_qv(4);
        let z2 = communication(&s, Strategy::Zero2, 4, 1);
        // Four reduce-scatters of 3/4 · 4,505,600, one all-gather of the same.
        assert_eq!(z2.sent_per_rank, 4 * 3_379_200 + 3_379_200);
        assert_eq!(
            communication(&s, Strategy::ShardGradOp, 4, 1).sent_per_rank,
            z2.sent_per_rank
        );
    }

    /// QLoRA under FULL_SHARD gathers the NF4 codes and scales as stored: TinyLlama's
    /// 968,884,224 block-linear weights as 4-bit codes (484,442,112 B) and one f32 absmax per 64
    /// (60,555,264 B), its embedding, head and norms in f32 (131,164,160 values), the adapter.
    #[test]
    fn fsdp_qlora_gathers_the_codes_as_stored() {
        let s = Scenario {
            nf4: Some(Nf4Config {
                block_size: 64,
                double_quant: false,
            }),
            ..tiny_llama_qv(1)
        };
        let c = communication(&s, Strategy::FullShard, 2, 1);
        assert_eq!(
            c.calls[0].payload,
            484_442_112 + 60_555_264 + 4 * 131_164_160 + 4_505_600
        );
    }

    #[test]
    fn full_sharding_gathers_the_parameters_twice_a_micro_batch() {
        let s = tiny_llama_qv(2);
        let z3 = communication(&s, Strategy::Zero3, 8, 1);
        let gathers: Vec<&CollectiveCall> = z3
            .calls
            .iter()
            .filter(|c| c.op == Collective::AllGather)
            .collect();
        assert_eq!(gathers.len(), 2);
        // TinyLlama's 1,100,048,384 f32 weights plus the adapter's 1,126,400: every byte.
        assert_eq!(gathers[0].payload, 4 * (1_100_048_384 + 1_126_400));
        assert!(gathers.iter().all(|g| g.calls == 2 && g.ranks == 8));
        assert_eq!(
            communication(&s, Strategy::FullShard, 8, 1).sent_per_rank,
            z3.sent_per_rank
        );
        // HYBRID on one node is FULL_SHARD; on two nodes of four, its gathers span four GPUs
        // and each gradient shard (a quarter) is all-reduced over the two nodes.
        assert_eq!(
            communication(&s, Strategy::HybridShard, 8, 1).sent_per_rank,
            z3.sent_per_rank
        );
        let hybrid = communication(&s, Strategy::HybridShard, 4, 2);
        assert_eq!(hybrid.gpus, 8);
        assert_eq!(
            hybrid.sent_across_nodes_per_rank,
            2 * Collective::AllReduce.sent_per_rank(4_505_600 / 4, 2)
        );
    }
}
