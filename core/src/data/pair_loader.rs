//! A seeded, resumable stream of preference micro-batches: the loader of supervised data
//! ([`super::DataLoader`]) for pairs. Each epoch shuffles the pairs with a generator seeded by
//! (seed, epoch) and hands out `B` pairs at a time, each pair one row of its two sequences
//! ([`PairBatch`]). The position in the stream is the same [`LoaderState`].

use super::DataSummary;
use super::loader::{LoaderState, seeded_order};
use super::pair_batch::PairBatch;
use super::preference::PairTokens;
use crate::error::{Error, Result};

/// Micro-batches of `B` pairs, each sequence at most `T` tokens.
#[derive(Debug, Clone)]
pub struct PairLoader {
    pairs: Vec<PairTokens>,
    dropped: usize,
    truncated: usize,
    seq_len: usize,
    micro_batch: usize,
    seed: u64,
    state: LoaderState,
    order: Vec<usize>,
}

/// The pairs with a reply token within `seq_len` on both sides (the others teach nothing:
/// their prompt fills the sequence), and how many were left out.
fn learnable(pairs: Vec<PairTokens>, seq_len: usize) -> (Vec<PairTokens>, usize) {
    let given = pairs.len();
    let kept: Vec<PairTokens> = pairs
        .into_iter()
        .filter(|p| p.prompt.len() < seq_len && !p.chosen.is_empty() && !p.rejected.is_empty())
        .collect();
    let dropped = given - kept.len();
    (kept, dropped)
}

impl PairLoader {
    /// A loader at the start of epoch 0.
    pub fn new(
        pairs: Vec<PairTokens>,
        seq_len: usize,
        micro_batch: usize,
        seed: u64,
    ) -> Result<Self> {
        if seq_len < 2 || micro_batch == 0 {
            return Err(Error::Input(format!(
                "sequence length {seq_len} and micro-batch {micro_batch}: need T ≥ 2 and B ≥ 1"
            )));
        }
        let truncated = pairs.iter().filter(|p| p.longest() > seq_len).count();
        let (pairs, dropped) = learnable(pairs, seq_len);
        if pairs.is_empty() {
            return Err(Error::Input(
                "no preference pair has a reply token within the sequence length".into(),
            ));
        }
        let mut loader = PairLoader {
            pairs,
            dropped,
            truncated,
            seq_len,
            micro_batch,
            seed,
            state: LoaderState::default(),
            order: Vec::new(),
        };
        loader.build_epoch();
        Ok(loader)
    }

    /// Continues from a saved position.
    pub fn resume(&mut self, state: LoaderState) {
        self.state = state;
        self.build_epoch();
    }

    /// The current position.
    pub fn state(&self) -> LoaderState {
        self.state
    }

    /// Micro-batches per epoch.
    pub fn batches_per_epoch(&self) -> usize {
        self.pairs.len().div_ceil(self.micro_batch)
    }

    /// Pairs, tokens and padding as trained on (a "sample" is a pair; its label tokens are
    /// both replies').
    pub fn summary(&self) -> DataSummary {
        let len = |prompt: usize, reply: usize| (prompt + reply).min(self.seq_len);
        let sequences = |p: &PairTokens| {
            (
                len(p.prompt.len(), p.chosen.len()),
                len(p.prompt.len(), p.rejected.len()),
            )
        };
        let tokens: usize = self
            .pairs
            .iter()
            .map(|p| sequences(p).0 + sequences(p).1)
            .sum();
        let label_tokens: usize = self
            .pairs
            .iter()
            .map(|p| {
                let (c, r) = sequences(p);
                c + r - 2 * p.prompt.len()
            })
            .sum();
        // Rows are as wide as the widest pair of their micro-batch.
        let slots: usize = self
            .order
            .chunks(self.micro_batch)
            .map(|group| {
                let widest = group
                    .iter()
                    .map(|&i| sequences(&self.pairs[i]).0 + sequences(&self.pairs[i]).1)
                    .max()
                    .unwrap_or(0);
                widest * group.len()
            })
            .sum();
        DataSummary {
            samples: self.pairs.len(),
            dropped: self.dropped,
            truncated: self.truncated,
            tokens,
            label_tokens,
            batches_per_epoch: self.batches_per_epoch(),
            fill: tokens as f64 / slots.max(1) as f64,
        }
    }

    /// The next micro-batch (a new epoch starts when one is used up).
    pub fn next_batch(&mut self) -> PairBatch {
        if self.state.batch_in_epoch as usize >= self.batches_per_epoch() {
            self.state = LoaderState {
                epoch: self.state.epoch + 1,
                batch_in_epoch: 0,
            };
            self.build_epoch();
        }
        let start = self.state.batch_in_epoch as usize * self.micro_batch;
        let end = (start + self.micro_batch).min(self.pairs.len());
        self.state.batch_in_epoch += 1;
        let pairs: Vec<PairTokens> = self.order[start..end]
            .iter()
            .map(|&i| self.pairs[i].clone())
            .collect();
        PairBatch::new(&pairs, self.seq_len)
    }

    fn build_epoch(&mut self) {
        self.order = seeded_order(
            self.pairs.len(),
            self.seed ^ self.state.epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        );
    }
}

/// Micro-batches of `pairs` in their order, `B` at a time (the held-out pairs, read the same
/// way at every evaluation); pairs with no reply token within `seq_len` are left out.
pub fn ordered_pair_batches(
    pairs: Vec<PairTokens>,
    seq_len: usize,
    micro_batch: usize,
) -> Vec<PairBatch> {
    let (pairs, _) = learnable(pairs, seq_len);
    pairs
        .chunks(micro_batch.max(1))
        .map(|group| PairBatch::new(group, seq_len))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(prompt: usize, reply: usize) -> PairTokens {
        PairTokens {
            prompt: vec![3; prompt],
            chosen: vec![4; reply],
            rejected: vec![5; reply + 1],
        }
    }

    #[test]
    fn every_pair_once_an_epoch_and_a_resumed_stream_is_the_same() {
        let pairs: Vec<PairTokens> = (1..=7).map(|n| pair(n, n)).collect();
        let mut loader = PairLoader::new(pairs.clone(), 64, 3, 11).unwrap();
        assert_eq!(loader.batches_per_epoch(), 3);
        let epoch: Vec<usize> = (0..3).map(|_| loader.next_batch().pairs()).collect();
        assert_eq!(epoch, vec![3, 3, 1]);
        let saved = loader.state();
        let next = loader.next_batch();
        let mut resumed = PairLoader::new(pairs, 64, 3, 11).unwrap();
        resumed.resume(saved);
        assert_eq!(resumed.next_batch().micro.batch, next.micro.batch);
    }

    #[test]
    fn a_pair_whose_prompt_fills_the_sequence_is_left_out() {
        let loader = PairLoader::new(vec![pair(2, 3), pair(8, 3)], 8, 1, 0).unwrap();
        let summary = loader.summary();
        assert_eq!(
            (summary.samples, summary.dropped, summary.truncated),
            (1, 1, 1)
        );
        assert!(PairLoader::new(vec![pair(8, 3)], 8, 1, 0).is_err());
    }
}
