//! What the model reads: token ids with their positions and segments, laid out `[B, T]`.
//!
//! Positions and segments are what make sequence packing exact: every packed sample restarts
//! at position 0 and attends only to tokens of its own segment.

use burn::tensor::{Device, Int, Tensor, TensorData};

use crate::config::MASKED;
use crate::device::link::{self, Traffic};
use crate::error::{Error, Result};

/// A `[B, T]` batch of token ids on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenBatch {
    /// B.
    pub batch: usize,
    /// T.
    pub seq: usize,
    /// `[B, T]` row-major token ids.
    pub input_ids: Vec<u32>,
    /// `[B, T]` RoPE positions (0, 1, 2, ... within each segment).
    pub positions: Vec<u32>,
    /// `[B, T]` segment index; attention never crosses segments.
    pub segments: Vec<u32>,
}

impl TokenBatch {
    /// Rows of equal length, each one sample starting at position 0.
    pub fn from_rows(rows: &[Vec<u32>]) -> Result<Self> {
        let seq = rows.first().map(Vec::len).unwrap_or(0);
        if seq == 0 {
            return Err(Error::Input(
                "a batch needs at least one non-empty row".into(),
            ));
        }
        if let Some(bad) = rows.iter().position(|r| r.len() != seq) {
            return Err(Error::Input(format!(
                "row {bad} has {} tokens, row 0 has {seq}: rows must have equal length",
                rows[bad].len()
            )));
        }
        let batch = rows.len();
        Ok(TokenBatch {
            batch,
            seq,
            input_ids: rows.concat(),
            positions: (0..batch).flat_map(|_| 0..seq as u32).collect(),
            segments: vec![0; batch * seq],
        })
    }

    /// One row.
    pub fn single(ids: &[u32]) -> Result<Self> {
        Self::from_rows(&[ids.to_vec()])
    }

    /// Checks every id against the vocabulary size.
    pub fn check_vocab(&self, vocab_size: usize) -> Result<()> {
        match self.input_ids.iter().find(|&&id| id as usize >= vocab_size) {
            Some(id) => Err(Error::Input(format!(
                "token id {id} is out of range for a vocabulary of {vocab_size}"
            ))),
            None => Ok(()),
        }
    }

    /// Whether some row holds more than one segment (a packed batch).
    pub fn is_packed(&self) -> bool {
        self.segments.iter().any(|&s| s != 0)
    }

    /// The ids as a `[B, T]` tensor.
    pub fn ids_tensor(&self, device: &Device) -> Tensor<2, Int> {
        link::upload(self.ids_data(), device, Traffic::Data)
    }

    /// The ids as `[B, T]` host data.
    pub fn ids_data(&self) -> TensorData {
        let ids: Vec<i64> = self.input_ids.iter().map(|&id| id as i64).collect();
        TensorData::new(ids, [self.batch, self.seq])
    }

    /// The additive attention mask: 0 where query i may see key j (j ≤ i, same segment, and
    /// with a sliding `window`, i − j < window), [`MASKED`] elsewhere. `[1, 1, T, T]` for
    /// unpacked batches, `[B, 1, T, T]` when packed.
    pub fn attention_mask(&self, device: &Device, window: Option<usize>) -> Tensor<4> {
        link::upload(self.attention_mask_data(window), device, Traffic::Data)
    }

    /// [`TokenBatch::attention_mask`] as host data.
    pub fn attention_mask_data(&self, window: Option<usize>) -> TensorData {
        let t = self.seq;
        let rows = if self.is_packed() { self.batch } else { 1 };
        // A sliding window: query i sees keys i − window < j ≤ i (transformers' Mistral).
        let too_far = |i: usize, j: usize| window.is_some_and(|w| i - j >= w);
        let mut mask = vec![0.0f32; rows * t * t];
        for b in 0..rows {
            let seg = &self.segments[b * t..(b + 1) * t];
            for i in 0..t {
                for j in 0..t {
                    if j > i || seg[j] != seg[i] || too_far(i, j) {
                        mask[(b * t + i) * t + j] = MASKED;
                    }
                }
            }
        }
        TensorData::new(mask, [rows, 1, t, t])
    }
}
