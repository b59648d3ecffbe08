//! The order in which one training step allocates and frees on the device, read off the tape:
//! what the caching allocator replay (`caching_allocator.rs`) needs to say what the step leaves
//! reserved, beside what it allocates at most.
//!
//! The forward runs op by op: an op's scratch (bitsandbytes' dequantized weight) is allocated,
//! then its outputs, then the scratch is freed, then every storage the op was the last to read
//! that nothing saves and the caller does not hold — a Python temporary dies when the op that
//! consumed it returns, and a named variable at its last use (HF's layers rebind `hidden_states`
//! as they go). The backward follows as [`Tape::backward`] tells it.
//!
//! Not on the tape, so not in the order: allocations inside a kernel (sdpa's and cuBLAS's own
//! workspaces; cuBLAS takes its 32 MiB per thread once, before any step), and a checkpointed
//! block's rerun, which is one block of its peak here where PyTorch makes it tensor by tensor.

use super::tape::{Allocation, Tape, Val};

/// The id of the forward's one scratch block at a time.
const FORWARD_SCRATCH_ID: usize = usize::MAX;
/// Storage `s` of a checkpointed block's forward (under `no_grad`) has id `RERUN_IDS + s`;
/// all of them but the output are freed before the next op.
const RERUN_IDS: usize = usize::MAX / 2;

/// A step's allocations and frees in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepAllocations {
    /// The forward's.
    pub forward: Vec<Allocation>,
    /// The backward's, after it.
    pub backward: Vec<Allocation>,
}

impl StepAllocations {
    /// Both, in order.
    pub fn all(&self) -> impl Iterator<Item = Allocation> + '_ {
        self.forward.iter().chain(&self.backward).copied()
    }
}

impl Tape {
    /// The step's allocations and frees in order: the forward of the recorded ops, then the
    /// backward from `loss`, checkpointed blocks told tensor by tensor. Tensors made before the
    /// step (the token ids) are not in it, and what the caller holds at the end (the logits,
    /// the loss, the `.grad`s) is not freed.
    pub fn step_allocations(&self, loss: Val) -> StepAllocations {
        let mut forward = vec![];
        self.forward_allocations(0, true, &[], None, &mut |e| forward.push(e));
        let mut backward = vec![];
        self.backward_from(loss, true, &mut |e| backward.push(e));
        StepAllocations { forward, backward }
    }

    /// The forward's highest allocation above the weights: its own temporaries and scratch
    /// (a no-grad reference forward, a fused head's tiles) on top of what it has kept so far.
    pub fn forward_peak(&self) -> u64 {
        let (mut live, mut peak) = (0u64, 0u64);
        self.forward_allocations(0, true, &[], None, &mut |event| match event {
            Allocation::Malloc { bytes, .. } => {
                live += bytes;
                peak = peak.max(live);
            }
            Allocation::Free { bytes, .. } => live -= bytes,
        });
        peak
    }

    /// The forward's allocations, storage `s` as id `base + s`. `grad`: whether autograd keeps
    /// what ops save (off under `no_grad`); `held`: storages someone else frees; `output`: a
    /// storage that is someone else's tensor under another id (a checkpointed block's output).
    pub(super) fn forward_allocations(
        &self,
        base: usize,
        grad: bool,
        held: &[usize],
        output: Option<(usize, usize)>,
        emit: &mut dyn FnMut(Allocation),
    ) {
        let id = |storage: usize| match output {
            Some((s, id)) if s == storage => id,
            _ => base + storage,
        };
        let kept = |storage: usize| {
            (grad && self.saved_by.contains_key(&storage))
                || self.retained.contains(&storage)
                || self.external.contains(&storage)
                || held.contains(&storage)
                || output.is_some_and(|(s, _)| s == storage)
        };
        // The storages each op makes, and those it is the last to read (or makes unread).
        let mut made: Vec<Vec<usize>> = vec![vec![]; self.ops_begun];
        let mut dies_after: Vec<Vec<usize>> = vec![vec![]; self.ops_begun];
        for (storage, &op) in self.made_by.iter().enumerate() {
            made[op].push(storage);
            if !kept(storage) {
                dies_after[self.last_read[storage].unwrap_or(op).max(op)].push(storage);
            }
        }
        for op in 0..self.ops_begun {
            if let Some(rerun) = self.reruns.get(&op) {
                // The block runs under `no_grad`; its output is this op's.
                let out = made[op][0];
                rerun.tape.forward_allocations(
                    RERUN_IDS,
                    false,
                    &[],
                    Some((rerun.output.storage, id(out))),
                    emit,
                );
            } else {
                let scratch = self.forward_scratch.get(&op).copied();
                if let Some(bytes) = scratch {
                    emit(Allocation::Malloc {
                        id: FORWARD_SCRATCH_ID,
                        bytes,
                    });
                }
                for &storage in made[op].iter().filter(|s| !self.external.contains(s)) {
                    emit(Allocation::Malloc {
                        id: id(storage),
                        bytes: self.storage_bytes[storage],
                    });
                }
                if let Some(bytes) = scratch {
                    emit(Allocation::Free {
                        id: FORWARD_SCRATCH_ID,
                        bytes,
                    });
                }
            }
            for &storage in &dies_after[op] {
                emit(Allocation::Free {
                    id: id(storage),
                    bytes: self.storage_bytes[storage],
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tape::{FreshGrad, Param};
    use super::*;

    fn live_after(events: &[Allocation]) -> Vec<u64> {
        let mut live = 0;
        events
            .iter()
            .map(|e| {
                match *e {
                    Allocation::Malloc { bytes, .. } => live += bytes,
                    Allocation::Free { bytes, .. } => live -= bytes,
                }
                live
            })
            .collect()
    }

    #[test]
    fn a_temporary_dies_after_its_last_reader_and_a_saved_tensor_in_the_backward() {
        let mut tape = Tape::default();
        let ids = tape.external(8, false);
        let frozen_table = Param {
            id: 0,
            bytes: 800,
            trainable: false,
        };
        let weight = Param {
            id: 1,
            bytes: 400,
            trainable: true,
        };
        // x (100 B, hooked to need a gradient) → y = x·Wᵀ (saves x) → z = 2y → loss.
        let x = tape.embedding(ids, frozen_table, 100, true);
        let y = tape.linear(x, weight, 60);
        let z = tape.fresh(&[y], 60, FreshGrad::Allocates);
        let loss = tape.fresh(&[z], 4, FreshGrad::Allocates);
        tape.retain(loss);
        let events: Vec<Allocation> = tape.step_allocations(loss).all().collect();
        let live = live_after(&events);
        // Forward: x, y, z (then y dies: z was its last reader), the loss (then z dies); x
        // (saved) and the loss (held) stay for the backward.
        assert_eq!(&live[..6], &[100, 160, 220, 160, 164, 104]);
        assert_eq!(live[5], tape.alive_after_forward());
        // The ids were made before the step and are never allocated or freed by it.
        assert!(!events.iter().any(|e| match *e {
            Allocation::Malloc { id, .. } | Allocation::Free { id, .. } => id == ids.storage,
        }));
        // The backward frees x once the product's backward has run, and keeps W's `.grad`.
        let x_freed = events
            .iter()
            .position(|e| {
                *e == Allocation::Free {
                    id: x.storage,
                    bytes: 100,
                }
            })
            .expect("x is freed in the backward");
        assert!(x_freed > 5);
        assert!(
            events[..x_freed].contains(&Allocation::Malloc {
                id: events
                    .iter()
                    .find_map(|e| match *e {
                        Allocation::Malloc { id, bytes: 400 } => Some(id),
                        _ => None,
                    })
                    .expect("W's .grad"),
                bytes: 400
            })
        );
        // The stream's highest point is the backward's peak above the weights.
        assert_eq!(*live.iter().max().unwrap(), tape.backward_peak(loss));
    }
}
