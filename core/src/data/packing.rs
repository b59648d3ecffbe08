//! Turning samples into `[B, T]` rows.
//!
//! Packing puts several samples into one row of T tokens. Each keeps its own positions
//! (restarting at 0) and its own segment, so attention never crosses from one sample into
//! another, and the first token of each sample gets no label (it would otherwise be
//! "predicted" from the end of the previous sample). Without packing, each sample gets a row
//! of its own and the rest is padding. Padding tokens form their own segment and carry no label.

use super::MicroBatch;
use super::sample::Sample;
use crate::model::{IGNORE_INDEX, TokenBatch};

/// Token id used for padding (never a label, never attended to by real tokens).
pub const PAD_ID: u32 = 0;

/// One row under construction.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Row {
    /// Token ids.
    pub ids: Vec<u32>,
    /// Labels.
    pub labels: Vec<i64>,
    /// Position of each token within its sample.
    pub positions: Vec<u32>,
    /// Segment of each token.
    pub segments: Vec<u32>,
}

impl Row {
    fn push(&mut self, sample: &Sample) {
        let segment = self.segments.last().map_or(0, |s| s + 1);
        let first = self.ids.is_empty();
        self.ids.extend(&sample.ids);
        self.labels
            .extend(sample.labels.iter().enumerate().map(|(i, &l)| {
                // A later sample's first label would be predicted across the boundary.
                if i == 0 && !first { IGNORE_INDEX } else { l }
            }));
        self.positions.extend(0..sample.len() as u32);
        self.segments
            .extend(std::iter::repeat_n(segment, sample.len()));
    }

    fn pad_to(&mut self, len: usize) {
        let segment = self.segments.last().map_or(0, |s| s + 1);
        let missing = len.saturating_sub(self.ids.len());
        self.ids.extend(std::iter::repeat_n(PAD_ID, missing));
        self.labels
            .extend(std::iter::repeat_n(IGNORE_INDEX, missing));
        self.positions.extend(0..missing as u32);
        self.segments.extend(std::iter::repeat_n(segment, missing));
    }
}

/// Packs samples, in order, into rows of exactly `seq_len` tokens (first fit: a sample that
/// does not fit starts a new row; samples longer than a row are truncated).
pub fn pack(samples: &[Sample], seq_len: usize) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::new();
    let mut current = Row::default();
    for sample in samples {
        let mut sample = sample.clone();
        sample.truncate(seq_len);
        if current.ids.len() + sample.len() > seq_len {
            current.pad_to(seq_len);
            rows.push(std::mem::take(&mut current));
        }
        current.push(&sample);
    }
    if !current.ids.is_empty() {
        current.pad_to(seq_len);
        rows.push(current);
    }
    rows
}

/// One sample per row, truncated to `seq_len` and padded to the longest row.
pub fn pad_each(samples: &[Sample], seq_len: usize) -> Vec<Row> {
    let longest = samples
        .iter()
        .map(|s| s.len().min(seq_len))
        .max()
        .unwrap_or(0);
    samples
        .iter()
        .map(|s| {
            let mut s = s.clone();
            s.truncate(seq_len);
            let mut row = Row::default();
            row.push(&s);
            row.pad_to(longest);
            row
        })
        .collect()
}

/// Rows of equal length as one micro-batch.
///
/// # Panics
/// If the rows differ in length or there are none (both are built by this module).
pub fn micro_batch(rows: &[Row]) -> MicroBatch {
    let seq = rows[0].ids.len();
    assert!(
        rows.iter().all(|r| r.ids.len() == seq),
        "rows of equal length"
    );
    let batch = TokenBatch {
        batch: rows.len(),
        seq,
        input_ids: rows.iter().flat_map(|r| r.ids.iter().copied()).collect(),
        positions: rows
            .iter()
            .flat_map(|r| r.positions.iter().copied())
            .collect(),
        segments: rows
            .iter()
            .flat_map(|r| r.segments.iter().copied())
            .collect(),
    };
    MicroBatch {
        batch,
        labels: rows.iter().flat_map(|r| r.labels.iter().copied()).collect(),
    }
}
