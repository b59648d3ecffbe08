//! One training sample: tokens and the labels the loss reads.

use crate::model::IGNORE_INDEX;

/// Token ids and labels of one sample, aligned (`labels[t]` is `ids[t]` where the loss counts
/// it, [`IGNORE_INDEX`] elsewhere; the loss compares the prediction at `t − 1` with it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// Token ids.
    pub ids: Vec<u32>,
    /// Labels, one per id.
    pub labels: Vec<i64>,
}

impl Sample {
    /// A sample whose every token is a label (plain causal language modelling).
    pub fn causal(ids: Vec<u32>) -> Self {
        let labels = ids.iter().map(|&i| i64::from(i)).collect();
        Sample { ids, labels }
    }

    /// Tokens.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether it has no tokens.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Labels that count in the shifted loss (not ignored, not the first token).
    pub fn label_tokens(&self) -> usize {
        self.label_tokens_within(self.len())
    }

    /// [`Sample::label_tokens`] of the first `max_len` tokens (as after a truncation).
    pub fn label_tokens_within(&self, max_len: usize) -> usize {
        self.labels
            .iter()
            .take(max_len)
            .skip(1)
            .filter(|&&l| l != IGNORE_INDEX)
            .count()
    }

    /// Keeps the first `max_len` tokens.
    pub fn truncate(&mut self, max_len: usize) {
        self.ids.truncate(max_len);
        self.labels.truncate(max_len);
    }
}
