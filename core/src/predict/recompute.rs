//! What gradient checkpointing keeps and what it recomputes, as the report shows the
//! activations.
//!
//! The inventory lists every tensor that exists at some moment of the step, so with
//! checkpointing it still lists every block's saved activations: each exists, but only while
//! its own block's backward recomputes it, one block at a time. Summed, they are the bytes the
//! backward computes a second time, not memory the step holds. This view splits them:
//! - **kept through the step**: from the forward to the backward — every saved tensor without
//!   checkpointing; with it, the block inputs and what the layers outside the blocks keep;
//! - **one recomputed block**: the largest block's recomputed tensors, what the backward holds
//!   of them at once;
//! - **recomputed per micro-batch**: their sum over the blocks.
//!
//! A tensor is recomputed when it is a saved activation that is not alive in the forward
//! (`Phases::forward` false): the inventory's own record, not a second rule.

use serde::Serialize;

use super::inventory::{Entry, Kind};

/// A checkpointed block's recomputed activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RecomputedBlock {
    /// The block (the last of the largest: the first whose backward runs).
    pub layer: usize,
    /// Its saved activations, alive only while its backward runs.
    pub bytes: u64,
}

/// The activations of one step, split by how long they live (the logits are their own kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ActivationSplit {
    /// Alive from the forward to the backward: the saved tensors that are not recomputed and
    /// the checkpointed block inputs.
    pub kept_through_step: u64,
    /// Of which the block inputs gradient checkpointing keeps (0 without it).
    pub checkpoint_inputs: u64,
    /// The largest recomputed block (None without checkpointing).
    pub recomputed_block: Option<RecomputedBlock>,
    /// The recomputed tensors summed over the blocks: what each micro-batch's backward
    /// computes and holds a second time, one block at a time (0 without checkpointing).
    pub recomputed_per_micro_batch: u64,
}

/// A saved activation that exists only while its block's backward recomputes it.
pub fn is_recomputed(e: &Entry) -> bool {
    e.kind == Kind::SavedActivations && !e.phases.forward
}

/// The split of `entries` (an inventory).
pub fn activation_split(entries: &[Entry]) -> ActivationSplit {
    let sum = |keep: &dyn Fn(&Entry) -> bool| -> u64 {
        entries.iter().filter(|e| keep(e)).map(|e| e.bytes).sum()
    };
    let checkpoint_inputs = sum(&|e| e.kind == Kind::CheckpointInputs);
    let kept_saved = sum(&|e| e.kind == Kind::SavedActivations && e.phases.forward);
    let mut by_block = std::collections::BTreeMap::<usize, u64>::new();
    for e in entries.iter().filter(|e| is_recomputed(e)) {
        // Recomputation is per block; a recomputed tensor outside the blocks would be a bug
        // of the inventory, and is counted with block 0 rather than lost.
        *by_block.entry(e.layer.unwrap_or(0)).or_insert(0) += e.bytes;
    }
    let recomputed_block = by_block
        .iter()
        .max_by_key(|&(&layer, &bytes)| (bytes, layer))
        .map(|(&layer, &bytes)| RecomputedBlock { layer, bytes });
    ActivationSplit {
        kept_through_step: kept_saved + checkpoint_inputs,
        checkpoint_inputs,
        recomputed_block,
        recomputed_per_micro_batch: by_block.values().sum(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{LlamaConfig, LoraConfig, Nf4Config};
    use crate::predict::inventory::{Scenario, inventory, per_layer, totals_by_kind};

    fn tinyllama_qlora(checkpointing: bool) -> Scenario {
        Scenario {
            lora: Some(LoraConfig::default()),
            nf4: Some(Nf4Config {
                block_size: 64,
                double_quant: true,
            }),
            checkpointing,
            ..Scenario::new(LlamaConfig::tiny_llama_1_1b(), 1, 1024)
        }
    }

    /// Without checkpointing everything saved is kept and nothing is recomputed; with it the
    /// kept bytes are the block inputs plus what is saved outside the blocks, one block's
    /// recompute is a 22nd of the saved sum (every TinyLlama block keeps the same), and the
    /// sum over the blocks is the inventory's saved bytes minus the kept ones. The inventory
    /// itself is the same either way but for the block inputs.
    #[test]
    fn checkpointing_keeps_the_inputs_and_recomputes_one_block_at_a_time() {
        let plain = inventory(&tinyllama_qlora(false));
        let ckpt = inventory(&tinyllama_qlora(true));
        let saved = |entries: &[Entry]| totals_by_kind(entries)[&Kind::SavedActivations];
        assert_eq!(saved(&plain), saved(&ckpt));

        let p = activation_split(&plain);
        assert_eq!(p.kept_through_step, saved(&plain));
        assert_eq!(
            (
                p.checkpoint_inputs,
                p.recomputed_block,
                p.recomputed_per_micro_batch
            ),
            (0, None, 0)
        );

        let c = activation_split(&ckpt);
        // 22 blocks × T·d f32 inputs: 22 · 1024 · 2048 · 4.
        assert_eq!(c.checkpoint_inputs, 22 * 1024 * 2048 * 4);
        let outside: u64 = ckpt
            .iter()
            .filter(|e| e.kind == Kind::SavedActivations && e.layer.is_none())
            .map(|e| e.bytes)
            .sum();
        assert_eq!(c.kept_through_step, c.checkpoint_inputs + outside);
        assert_eq!(c.recomputed_per_micro_batch + outside, saved(&ckpt));
        let block = c.recomputed_block.expect("a recomputed block");
        assert_eq!(
            block.layer, 21,
            "the last of equal blocks: the first recomputed"
        );
        // The per-layer rows: each block keeps its 8 MiB input and recomputes the rest;
        // block 0 a little less (its input needs no gradient), every other one the largest.
        let rows = per_layer(&ckpt, 22);
        assert_eq!(
            rows.iter().map(|r| r.recomputed).sum::<u64>(),
            c.recomputed_per_micro_batch
        );
        for (l, row) in rows[..22].iter().enumerate() {
            assert_eq!(row.activations, 1024 * 2048 * 4, "layers.{l}");
            if l == 0 {
                assert!(row.recomputed < block.bytes);
            } else {
                assert_eq!(row.recomputed, block.bytes, "layers.{l}");
            }
        }
        let plain_rows = per_layer(&plain, 22);
        assert!(plain_rows.iter().all(|r| r.recomputed == 0));
        assert_eq!(plain_rows[21].activations, block.bytes);
    }
}
