//! Beyond one GPU: per-GPU and CPU memory of data-parallel strategies, applied to the
//! inventory's step peak kind by kind.
//!
//! With G GPUs in a shard group (all N for the sharded strategies, the GPUs of one node for
//! HYBRID_SHARD):
//! - DDP replicates everything and by default copies the gradients into its all-reduce
//!   buckets (`gradient_as_bucket_view=False`): gradients twice.
//! - FSDP NO_SHARD replicates everything (DDP without the bucket copy).
//! - ZeRO-1 shards the optimizer state; ZeRO-2 and FSDP SHARD_GRAD_OP shard it and the
//!   gradients; ZeRO-3, FSDP FULL_SHARD and HYBRID_SHARD shard the parameters too, and gather
//!   one unit (a decoder block, or what lives outside the blocks: embedding, head, final norm)
//!   whole while it computes, with the next one prefetched: at most the two largest units'
//!   parameters, plus the largest unit's unsharded gradient before its reduce-scatter.
//! - CPU offload moves the (sharded) optimizer state, or the parameters, to host memory.
//!
//! Activations, logits and workspaces are per GPU and unchanged: each GPU runs its own
//! micro-batch.

use std::collections::BTreeMap;

use serde::Serialize;

use super::inventory::{Kind, Scenario, inventory};
use super::timeline::step_timeline;
use crate::config::spellings;

/// A data-parallel strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// PyTorch DistributedDataParallel.
    Ddp,
    /// FSDP NO_SHARD.
    NoShard,
    /// DeepSpeed ZeRO stage 1.
    Zero1,
    /// DeepSpeed ZeRO stage 2.
    Zero2,
    /// FSDP SHARD_GRAD_OP.
    ShardGradOp,
    /// DeepSpeed ZeRO stage 3.
    Zero3,
    /// FSDP FULL_SHARD.
    FullShard,
    /// FSDP HYBRID_SHARD: full sharding inside a node, replicas across nodes.
    HybridShard,
}

spellings! {
    Strategy, "sharding strategy", "shard";
    Ddp => "ddp" []: "PyTorch DistributedDataParallel: every GPU holds everything",
    NoShard => "none" ["no-shard", "no_shard"]: "FSDP NO_SHARD",
    Zero1 => "zero1" []: "DeepSpeed ZeRO stage 1: the optimizer state sharded",
    Zero2 => "zero2" []: "DeepSpeed ZeRO stage 2: optimizer state and gradients sharded",
    ShardGradOp => "grad-op" ["shard-grad-op", "shard_grad_op"]: "FSDP SHARD_GRAD_OP",
    Zero3 => "zero3" []: "DeepSpeed ZeRO stage 3: parameters too",
    FullShard => "full" ["full-shard", "full_shard"]: "FSDP FULL_SHARD",
    HybridShard => "hybrid" ["hybrid-shard", "hybrid_shard"]: "FSDP HYBRID_SHARD: full sharding inside a node, replicas across nodes",
}

impl Strategy {
    /// Parses any spelling `--shard` accepts (None: not a strategy).
    pub fn parse(s: &str) -> Option<Strategy> {
        s.parse().ok()
    }

    fn shards_optimizer(self) -> bool {
        !matches!(self, Strategy::Ddp | Strategy::NoShard)
    }

    fn shards_gradients(self) -> bool {
        self.shards_optimizer() && self != Strategy::Zero1
    }

    fn shards_parameters(self) -> bool {
        matches!(
            self,
            Strategy::Zero3 | Strategy::FullShard | Strategy::HybridShard
        )
    }
}

/// What goes to host memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Offload {
    /// The parameters (and adapters).
    pub parameters: bool,
    /// The optimizer state.
    pub optimizer: bool,
}

impl Offload {
    /// The optimizer state only (ZeRO-Offload, paged optimizer state).
    pub const OPTIMIZER: Offload = Offload {
        parameters: false,
        optimizer: true,
    };

    /// From a flag value naming what goes to the host: `optimizer`, `params`, or both
    /// (`params,optimizer`).
    pub fn from_flag(value: &str) -> Offload {
        Offload {
            parameters: value.contains("param"),
            optimizer: value.contains("optimizer"),
        }
    }
}

/// Memory of one GPU and of each node's host for a strategy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShardedMemory {
    /// The strategy.
    pub strategy: Strategy,
    /// GPUs in all.
    pub gpus: u64,
    /// GPUs that share one shard set.
    pub shard_group: u64,
    /// Bytes on each GPU at the step's peak, by kind.
    pub gpu_by_kind: BTreeMap<Kind, u64>,
    /// Parameters gathered whole at a time (two units) and one unit's unsharded gradient.
    pub gathered: u64,
    /// Bytes on each GPU at the step's peak.
    pub gpu_peak: u64,
    /// Bytes of host memory on each node (offloaded state of its GPUs).
    pub cpu_per_node: u64,
}

/// Whether `kind` holds parameter values (float weights, NF4 codes and scales, adapters).
pub(super) fn is_parameter(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::Weights | Kind::QuantCodes | Kind::QuantScales | Kind::Adapters
    )
}

/// Per-GPU memory of `s` run with `strategy` on `nodes` × `gpus_per_node` GPUs.
pub fn sharded_memory(
    s: &Scenario,
    strategy: Strategy,
    gpus_per_node: u64,
    nodes: u64,
    offload: Offload,
) -> ShardedMemory {
    let gpus_per_node = gpus_per_node.max(1);
    let gpus = gpus_per_node * nodes.max(1);
    let group = if strategy == Strategy::HybridShard {
        gpus_per_node
    } else {
        gpus
    };
    let timeline = step_timeline(s);
    let entries = inventory(s);
    // The largest FSDP unit: a decoder block's parameters, or what lives outside the blocks.
    let mut units: BTreeMap<Option<usize>, (u64, u64)> = BTreeMap::new();
    for e in &entries {
        let unit = units.entry(e.layer).or_default();
        if is_parameter(e.kind) {
            unit.0 += e.bytes;
        } else if e.kind == Kind::Gradients {
            unit.1 += e.bytes;
        }
    }
    let mut by_size: Vec<(u64, u64)> = units.values().copied().collect();
    by_size.sort_by_key(|entry| std::cmp::Reverse(entry.0));
    // The unit computing now and the one prefetched next: at most the two largest.
    let two_units: u64 = by_size.iter().take(2).map(|u| u.0).sum();
    let unit_grads = by_size.first().map_or(0, |u| u.1);

    let mut gpu_by_kind = BTreeMap::new();
    let mut cpu_per_gpu = 0u64;
    for (&kind, &bytes) in &timeline.peak.by_kind {
        let sharded = match kind {
            k if is_parameter(k) && strategy.shards_parameters() => bytes.div_ceil(group),
            Kind::Gradients if strategy.shards_gradients() => bytes.div_ceil(group),
            Kind::Gradients if strategy == Strategy::Ddp => 2 * bytes,
            Kind::OptimizerState if strategy.shards_optimizer() => bytes.div_ceil(group),
            _ => bytes,
        };
        let offloaded = match kind {
            Kind::OptimizerState => offload.optimizer,
            k if is_parameter(k) => offload.parameters,
            _ => false,
        };
        if offloaded {
            cpu_per_gpu += sharded;
        } else {
            gpu_by_kind.insert(kind, sharded);
        }
    }
    let gathered = if strategy.shards_parameters() && group > 1 {
        two_units + unit_grads
    } else if offload.parameters {
        // Offloaded but replicated parameters still come to the GPU one unit at a time.
        two_units
    } else {
        0
    };
    let gpu_peak = gpu_by_kind.values().sum::<u64>() + gathered;
    // Replicated offloaded state is one copy per GPU; sharded state one shard per GPU.
    ShardedMemory {
        strategy,
        gpus,
        shard_group: group,
        gpu_by_kind,
        gathered,
        gpu_peak,
        cpu_per_node: cpu_per_gpu * gpus_per_node,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LlamaConfig;

    fn scenario() -> Scenario {
        Scenario {
            checkpointing: true,
            ..Scenario::new(LlamaConfig::tiny_llama_1_1b(), 1, 512)
        }
    }

    fn kind(m: &ShardedMemory, k: Kind) -> u64 {
        m.gpu_by_kind.get(&k).copied().unwrap_or(0)
    }

    /// The stages remove state in order: ZeRO-1 the optimizer state, ZeRO-2 the gradients too,
    /// ZeRO-3 the parameters too; FSDP's names for the same things agree, and HYBRID on one
    /// node is FULL_SHARD.
    #[test]
    fn stages_shard_what_they_promise() {
        let s = scenario();
        let run = |st| sharded_memory(&s, st, 8, 1, Offload::default());
        let (none, z1, z2, z3) = (
            run(Strategy::NoShard),
            run(Strategy::Zero1),
            run(Strategy::Zero2),
            run(Strategy::Zero3),
        );
        assert_eq!(
            kind(&z1, Kind::OptimizerState),
            kind(&none, Kind::OptimizerState).div_ceil(8)
        );
        assert_eq!(kind(&z1, Kind::Gradients), kind(&none, Kind::Gradients));
        assert_eq!(
            kind(&z2, Kind::Gradients),
            kind(&none, Kind::Gradients).div_ceil(8)
        );
        assert_eq!(kind(&z2, Kind::Weights), kind(&none, Kind::Weights));
        assert_eq!(
            kind(&z3, Kind::Weights),
            kind(&none, Kind::Weights).div_ceil(8)
        );
        assert!(none.gpu_peak > z1.gpu_peak && z1.gpu_peak > z2.gpu_peak);
        assert!(z2.gpu_peak > z3.gpu_peak && z3.gathered > 0);
        assert_eq!(run(Strategy::ShardGradOp).gpu_peak, z2.gpu_peak);
        assert_eq!(run(Strategy::FullShard).gpu_peak, z3.gpu_peak);
        assert_eq!(run(Strategy::HybridShard).gpu_peak, z3.gpu_peak);
        // DDP's bucket copy: one more set of gradients than NO_SHARD.
        let ddp = run(Strategy::Ddp);
        assert_eq!(ddp.gpu_peak - none.gpu_peak, kind(&none, Kind::Gradients));
    }

    /// HYBRID_SHARD on 2 nodes × 4 GPUs shards over 4; optimizer offload moves the state to
    /// the host, one shard per GPU.
    #[test]
    fn hybrid_groups_and_offload() {
        let s = scenario();
        let hybrid = sharded_memory(&s, Strategy::HybridShard, 4, 2, Offload::default());
        assert_eq!(hybrid.shard_group, 4);
        let full = sharded_memory(&s, Strategy::FullShard, 4, 2, Offload::default());
        assert!(hybrid.gpu_peak > full.gpu_peak);
        let offloaded = sharded_memory(
            &s,
            Strategy::Zero3,
            4,
            2,
            Offload {
                optimizer: true,
                parameters: false,
            },
        );
        assert_eq!(kind(&offloaded, Kind::OptimizerState), 0);
        assert_eq!(
            offloaded.cpu_per_node,
            4 * kind(&full, Kind::OptimizerState)
        );
    }
}
