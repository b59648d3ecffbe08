//! A seeded, resumable stream of micro-batches over a data set.
//!
//! Each epoch shuffles the samples with a generator seeded by (seed, epoch), then packs them
//! into rows (or pads each to its own row) and hands out B rows at a time. The position in the
//! stream is two numbers ([`LoaderState`]), so a resumed run sees exactly the batches an
//! uninterrupted one would.

use serde::{Deserialize, Serialize};

use super::MicroBatch;
use super::packing::{Row, micro_batch, pack, pad_each};
use super::sample::Sample;
use crate::error::{Error, Result};
use crate::rng::SplitMix64;

/// Where the loader is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LoaderState {
    /// Epochs completed.
    pub epoch: u64,
    /// Micro-batches handed out in this epoch.
    pub batch_in_epoch: u64,
}

/// What the data set turned into, for the summary printed before training.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DataSummary {
    /// Samples trained on.
    pub samples: usize,
    /// Samples dropped: no token to learn within the sequence length.
    pub dropped: usize,
    /// Samples longer than the sequence length (cut to it).
    pub truncated: usize,
    /// Tokens of the kept samples after truncation.
    pub tokens: usize,
    /// Of those, tokens the loss learns.
    pub label_tokens: usize,
    /// Micro-batches per epoch.
    pub batches_per_epoch: usize,
    /// Real tokens over the token slots of an epoch's micro-batches (1 − padding).
    pub fill: f64,
}

/// Micro-batches of `B × T` tokens.
#[derive(Debug, Clone)]
pub struct DataLoader {
    samples: Vec<Sample>,
    dropped: usize,
    truncated: usize,
    seq_len: usize,
    micro_batch: usize,
    packing: bool,
    seed: u64,
    state: LoaderState,
    epoch_batches: Vec<Vec<Row>>,
}

impl DataLoader {
    /// A loader at the start of epoch 0. Samples without any label token are dropped.
    pub fn new(
        samples: Vec<Sample>,
        seq_len: usize,
        micro_batch: usize,
        packing: bool,
        seed: u64,
    ) -> Result<Self> {
        if seq_len < 2 || micro_batch == 0 {
            return Err(Error::Input(format!(
                "sequence length {seq_len} and micro-batch {micro_batch}: need T ≥ 2 and B ≥ 1"
            )));
        }
        let given = samples.len();
        let truncated = samples.iter().filter(|s| s.len() > seq_len).count();
        let samples = learnable(samples, seq_len);
        let dropped = given - samples.len();
        if samples.is_empty() {
            return Err(Error::Input(
                "no sample has a token to learn within the sequence length".into(),
            ));
        }
        let mut loader = DataLoader {
            samples,
            dropped,
            truncated,
            seq_len,
            micro_batch,
            packing,
            seed,
            state: LoaderState::default(),
            epoch_batches: Vec::new(),
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
        self.epoch_batches.len()
    }

    /// Samples in the data set.
    pub fn num_samples(&self) -> usize {
        self.samples.len()
    }

    /// Samples, tokens, truncation and padding of the data set as it is trained on.
    pub fn summary(&self) -> DataSummary {
        let tokens: usize = self.samples.iter().map(|s| s.len().min(self.seq_len)).sum();
        let slots: usize = self
            .epoch_batches
            .iter()
            .flatten()
            .map(|row| row.ids.len())
            .sum();
        DataSummary {
            samples: self.samples.len(),
            dropped: self.dropped,
            truncated: self.truncated,
            tokens,
            label_tokens: self
                .samples
                .iter()
                .map(|s| s.label_tokens_within(self.seq_len))
                .sum(),
            batches_per_epoch: self.epoch_batches.len(),
            fill: tokens as f64 / slots.max(1) as f64,
        }
    }

    /// The next micro-batch (a new epoch starts when one is used up).
    pub fn next_batch(&mut self) -> MicroBatch {
        if self.state.batch_in_epoch as usize >= self.epoch_batches.len() {
            self.state = LoaderState {
                epoch: self.state.epoch + 1,
                batch_in_epoch: 0,
            };
            self.build_epoch();
        }
        let rows = &self.epoch_batches[self.state.batch_in_epoch as usize];
        self.state.batch_in_epoch += 1;
        micro_batch(rows)
    }

    fn build_epoch(&mut self) {
        let order = seeded_order(
            self.samples.len(),
            self.seed ^ self.state.epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        );
        let shuffled: Vec<Sample> = order.iter().map(|&i| self.samples[i].clone()).collect();
        self.epoch_batches = if self.packing {
            pack(&shuffled, self.seq_len)
                .chunks(self.micro_batch)
                .map(<[Row]>::to_vec)
                .collect()
        } else {
            shuffled
                .chunks(self.micro_batch)
                .map(|group| pad_each(group, self.seq_len))
                .collect()
        };
    }
}

/// `0..n` shuffled by a Fisher–Yates pass drawing from `SplitMix64(seed)`: the data order of
/// an epoch, and the held-out split.
pub(crate) fn seeded_order(n: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = SplitMix64(seed);
    for i in (1..n).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

/// The samples with a token to learn within `seq_len` (the others would add nothing).
fn learnable(samples: Vec<Sample>, seq_len: usize) -> Vec<Sample> {
    samples
        .into_iter()
        .filter(|s| s.label_tokens_within(seq_len) > 0)
        .collect()
}

/// Micro-batches of `samples` in their order, by the same rules as training (packed or one
/// per row, truncated to `seq_len`): the held-out set, read the same way at every evaluation.
/// Samples with nothing to learn are left out.
pub fn ordered_batches(
    samples: Vec<Sample>,
    seq_len: usize,
    rows_per_batch: usize,
    packing: bool,
) -> Vec<MicroBatch> {
    let samples = learnable(samples, seq_len);
    let rows: Vec<Vec<Row>> = if packing {
        pack(&samples, seq_len)
            .chunks(rows_per_batch.max(1))
            .map(<[Row]>::to_vec)
            .collect()
    } else {
        samples
            .chunks(rows_per_batch.max(1))
            .map(|group| pad_each(group, seq_len))
            .collect()
    };
    rows.iter().map(|r| micro_batch(r)).collect()
}
