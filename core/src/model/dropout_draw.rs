//! Where LoRA's dropout masks come from in training: a numbered stream of draws, so that a
//! recomputation draws the masks its first forward drew.
//!
//! Gradient checkpointing runs each block's forward twice: once without a graph (keeping only
//! the block's input) and once in the backward, with a graph. With dropout, both must drop the
//! same values, or the gradients belong to a forward that never happened. PyTorch's checkpoint
//! saves and restores the RNG state per block; burn exposes no generator state, so napkin
//! numbers the draws instead. Inside [`drawing`] every LoRA dropout that draws a mask takes the
//! next draw of the stream `key`, seeds the device with `(key, draw)` and draws its mask. A
//! block recomputed from the draw it started at draws the same masks, on the CPU backends and
//! the GPU ones alike (their generators are seeded from the host). A plain (non-checkpointed)
//! forward of the same micro-batch numbers its draws the same way, so both paths drop the same
//! values and their gradients agree.
//!
//! Outside [`drawing`] a LoRA dropout behaves as burn's `Dropout`: a mask from the device's
//! generator when a backward is possible, none otherwise (evaluation, generation).
//!
//! The stream lives in a thread-local: a forward runs on the thread that calls it, and the
//! block forwards keep their signatures.

use std::cell::Cell;

use crate::rng::SplitMix64;

thread_local! {
    /// The stream being drawn from: its key and the next draw's number.
    static STREAM: Cell<Option<(u64, u64)>> = const { Cell::new(None) };
}

/// Restores the stream that was current before a [`drawing`] scope, also on unwinding.
struct Restore(Option<(u64, u64)>);

impl Drop for Restore {
    fn drop(&mut self) {
        STREAM.with(|s| s.set(self.0));
    }
}

/// Runs `f` with LoRA dropout drawing from stream `key`, starting at draw `first`. Returns
/// `f`'s value and the number of the next draw (`first` plus the masks `f` drew).
pub fn drawing<R>(key: u64, first: u64, f: impl FnOnce() -> R) -> (R, u64) {
    let restore = Restore(STREAM.with(|s| s.replace(Some((key, first)))));
    let value = f();
    let next = STREAM.with(|s| s.get()).map_or(first, |(_, next)| next);
    drop(restore);
    (value, next)
}

/// The seed of the next mask, when a stream is being drawn from (and counts the draw).
pub(crate) fn next_seed() -> Option<u64> {
    STREAM.with(|s| {
        let (key, draw) = s.get()?;
        s.set(Some((key, draw + 1)));
        Some(mix(key, draw))
    })
}

/// The key of micro-batch `index` in a step whose key is `step`.
pub fn micro_batch_key(step: u64, index: usize) -> u64 {
    mix(step, index as u64)
}

/// A seed from `a` and `b` through napkin's generator (`rng.rs`): nearby inputs give
/// unrelated seeds.
fn mix(a: u64, b: u64) -> u64 {
    SplitMix64(a ^ b.wrapping_mul(0xBF58_476D_1CE4_E5B9)).next_u64()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Draws are numbered from `first`; a scope started at a recorded draw replays the same
    /// seeds; nesting restores the outer stream; outside a scope nothing is drawn.
    #[test]
    fn a_scope_numbers_its_draws_and_replays_from_a_draw() {
        assert_eq!(next_seed(), None);
        let (seeds, next) = drawing(7, 0, || (0..5).map(|_| next_seed()).collect::<Vec<_>>());
        assert_eq!(next, 5);
        let (replayed, next) = drawing(7, 3, || [next_seed(), next_seed()]);
        assert_eq!((replayed.to_vec(), next), (seeds[3..5].to_vec(), 5));
        let ((outer, inner), _) = drawing(7, 0, || {
            let (inner, _) = drawing(8, 0, next_seed);
            (next_seed(), inner)
        });
        assert_eq!(outer, seeds[0]);
        assert_ne!(inner, seeds[0]);
        assert_eq!(next_seed(), None);
        let distinct: std::collections::BTreeSet<_> = seeds.iter().collect();
        assert_eq!(distinct.len(), 5);
    }
}
