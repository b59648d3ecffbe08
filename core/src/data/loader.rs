//! A seeded, resumable stream of micro-batches over a data set.
//!
//! Each epoch shuffles the samples with a generator seeded by (seed, epoch), then packs them
//! into rows (or pads each to its own row) and hands out B rows at a time. The position in the
//! stream is two numbers ([`LoaderState`]), so a resumed run sees exactly the batches an
//! uninterrupted one would.

use serde::{Deserialize, Serialize};

use super::packing::{Row, micro_batch, pack, pad_each};
use super::sample::Sample;
use crate::error::{Error, Result};
use crate::model::generate::SplitMix64;
use crate::train::MicroBatch;

/// Where the loader is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LoaderState {
    /// Epochs completed.
    pub epoch: u64,
    /// Micro-batches handed out in this epoch.
    pub batch_in_epoch: u64,
}

/// Micro-batches of `B × T` tokens.
#[derive(Debug, Clone)]
pub struct DataLoader {
    samples: Vec<Sample>,
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
        let samples: Vec<Sample> = samples
            .into_iter()
            .filter(|s| {
                let mut s = s.clone();
                s.truncate(seq_len);
                s.label_tokens() > 0
            })
            .collect();
        if samples.is_empty() {
            return Err(Error::Input(
                "no sample has a token to learn within the sequence length".into(),
            ));
        }
        let mut loader = DataLoader {
            samples,
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
        let mut order: Vec<usize> = (0..self.samples.len()).collect();
        let mut rng = SplitMix64(self.seed ^ self.state.epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        for i in (1..order.len()).rev() {
            let j = (rng.next_u64() % (i as u64 + 1)) as usize;
            order.swap(i, j);
        }
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
