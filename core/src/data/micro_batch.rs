//! One micro-batch of a training step: a token batch and its labels.

use crate::model::{IGNORE_INDEX, TokenBatch};

/// One micro-batch: token ids and their labels (`-100` where no loss is taken).
#[derive(Debug, Clone)]
pub struct MicroBatch {
    /// `[B, T]` tokens.
    pub batch: TokenBatch,
    /// `[B, T]` labels, row-major.
    pub labels: Vec<i64>,
}

impl MicroBatch {
    /// Causal-LM micro-batch whose labels are its own tokens.
    pub fn causal(batch: TokenBatch) -> Self {
        let labels = batch.input_ids.iter().map(|&i| i as i64).collect();
        MicroBatch { batch, labels }
    }

    /// How many labels count in the shifted loss (positions 1.. of each row, not ignored).
    pub fn label_tokens(&self) -> usize {
        self.labels
            .chunks(self.batch.seq.max(1))
            .map(|row| row.iter().skip(1).filter(|&&l| l != IGNORE_INDEX).count())
            .sum()
    }
}
