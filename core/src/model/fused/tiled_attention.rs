//! The tiled attention's element-wise work (scale, mask, online softmax, rescaling, the
//! softmax backward) as one parallel pass per score block, for the CPU backends.
//!
//! [`super::super::efficient_attention`] states the math. With burn's ops each `[B, Hkv, G·tq,
//! tk]` block of scores went through about eight single-threaded passes in the forward (scale,
//! mask, row max, subtract, exp, row sum, rescale, accumulate) and seven in the backward; the
//! matrix products stay burn's (BLAS). Here:
//!
//! - forward, per block: one pass turns the scores into `p = exp(s·scale + mask − m_new)` in
//!   place while updating the running row maximum `m` and sum `l`; one pass folds `p·v` into
//!   the accumulator (`acc·exp(m_old − m_new) + p·v`). The finished rows go straight to their
//!   place in the output and the log-sum-exp (no concatenation).
//! - backward, per block: one pass recomputes `p = exp(s·scale + mask − lse)` in place, one
//!   writes `∂s = p ⊙ (∂p − δ)·scale` over `∂p`.
//!
//! Rows of a block are `(b, kv head, group member, query)` in that order (the query tile is
//! folded as in [`super::super::efficient_attention`]); the mask is evaluated per element from
//! positions and segment ids, never built as a tensor.

use std::ops::Range;

use burn::tensor::{Device, Tensor, TensorData};
use rayon::prelude::*;

use super::{fast_exp, max_of, sum_of};
use crate::model::batch::MASKED;
use crate::model::efficient_attention::{
    SavedTensors, TiledMask, backward_by_blocks, key_rows, query_rows, tiles,
};

/// Rows per rayon task (a row is one query's scores over a key tile, ≤ 128 values).
const ROWS_PER_TASK: usize = 64;

/// A tensor's f32 values (no copy when its buffer is held by no one else).
fn values<const D: usize>(x: Tensor<D>) -> Vec<f32> {
    x.into_data()
        .try_into_vec::<f32>()
        .expect("the caller checked that the tensors hold f32")
}

fn tensor<const D: usize>(values: Vec<f32>, shape: [usize; D], device: &Device) -> Tensor<D> {
    Tensor::from_data(TensorData::new(values, shape), device)
}

/// Where the rows of one score block sit.
#[derive(Clone, Copy)]
struct Block<'a> {
    mask: &'a TiledMask,
    /// Rows per batch row: `Hkv·G·tq`.
    rows_per_batch: usize,
    queries: (usize, usize),
    /// First key position of the block.
    key_start: usize,
}

impl Block<'_> {
    fn new<'a>(
        mask: &'a TiledMask,
        heads: usize,
        queries: &Range<usize>,
        keys: &Range<usize>,
    ) -> Block<'a> {
        Block {
            mask,
            rows_per_batch: heads * queries.len(),
            queries: (queries.start, queries.len()),
            key_start: keys.start,
        }
    }

    /// The batch row and query position of block row `row`.
    fn locate(&self, row: usize) -> (usize, usize) {
        let (start, len) = self.queries;
        (row / self.rows_per_batch, start + row % len)
    }

    /// Adds the mask to one row of scaled scores.
    fn mask_row(&self, row: usize, scores: &mut [f32]) {
        let (b, i) = self.locate(row);
        if !self.mask.is_packed() {
            // Causal only: the keys after position i.
            let visible = (i + 1).saturating_sub(self.key_start).min(scores.len());
            scores[visible..].iter_mut().for_each(|s| *s += MASKED);
            return;
        }
        for (c, s) in scores.iter_mut().enumerate() {
            if self.mask.hides(b, i, self.key_start + c) {
                *s += MASKED;
            }
        }
    }
}

/// The forward over every tile: the output `[B, H, T, Dh]` and the log-sum-exp of each query
/// row `[B, H, T, 1]`.
///
/// # Shapes
/// - `q`: `[B, H, T, Dh]`, `k`, `v`: `[B, Hkv, T, Dh]` (f32, on a CPU backend)
pub(crate) fn forward(
    q: &Tensor<4>,
    k: &Tensor<4>,
    v: &Tensor<4>,
    mask: &TiledMask,
) -> (Tensor<4>, Tensor<4>) {
    let [b, h, t, dh] = q.dims();
    let hkv = k.dims()[1];
    let group = h / hkv;
    let device = q.device();
    let scale = (dh as f64).powf(-0.5) as f32;
    let mut out = vec![0.0f32; b * h * t * dh];
    let mut lse = vec![0.0f32; b * h * t];
    for qr in tiles(t) {
        let tq = qr.len();
        let rows = b * h * tq;
        let q_tile = query_rows(q, &qr, hkv); // [B, Hkv, G·tq, Dh]
        let (mut max, mut sum) = (vec![f32::NEG_INFINITY; rows], vec![0.0f32; rows]);
        let mut acc = vec![0.0f32; rows * dh];
        for kr in tiles(qr.end) {
            let tk = kr.len();
            let block = Block::new(mask, h, &qr, &kr);
            let mut p = values(q_tile.clone().matmul(key_rows(k, &kr).swap_dims(2, 3)));
            let mut rescale = vec![0.0f32; rows];
            p.par_chunks_mut(tk * ROWS_PER_TASK)
                .zip(max.par_chunks_mut(ROWS_PER_TASK))
                .zip(sum.par_chunks_mut(ROWS_PER_TASK))
                .zip(rescale.par_chunks_mut(ROWS_PER_TASK))
                .enumerate()
                .for_each(|(task, (((p, max), sum), rescale))| {
                    let first = task * ROWS_PER_TASK;
                    for (r, row) in p.chunks_mut(tk).enumerate() {
                        row.iter_mut().for_each(|s| *s *= scale);
                        block.mask_row(first + r, row);
                        let new_max = max[r].max(max_of(row));
                        row.iter_mut().for_each(|s| *s = fast_exp(*s - new_max));
                        let row_sum = sum_of(row);
                        rescale[r] = fast_exp(max[r] - new_max);
                        sum[r] = sum[r] * rescale[r] + row_sum;
                        max[r] = new_max;
                    }
                });
            let p = tensor(p, [b, hkv, group * tq, tk], &device);
            let pv = values(p.matmul(key_rows(v, &kr))); // [B, Hkv, G·tq, Dh]
            acc.par_chunks_mut(dh * ROWS_PER_TASK)
                .zip(pv.par_chunks(dh * ROWS_PER_TASK))
                .zip(rescale.par_chunks(ROWS_PER_TASK))
                .for_each(|((acc, pv), rescale)| {
                    for ((acc, pv), &f) in acc.chunks_mut(dh).zip(pv.chunks(dh)).zip(rescale) {
                        acc.iter_mut().zip(pv).for_each(|(a, &x)| *a = *a * f + x);
                    }
                });
        }
        // Block row (b, kv head, member, query a) is head kv·G + member at position start + a:
        // in [B, H, T, ·] order the tile's rows are runs of tq consecutive positions.
        for (run, ((acc, max), sum)) in acc
            .chunks(tq * dh)
            .zip(max.chunks(tq))
            .zip(sum.chunks(tq))
            .enumerate()
        {
            let first = run * t + qr.start; // (b·H + head)·T + start
            let out = &mut out[first * dh..(first + tq) * dh];
            for ((out, acc), &l) in out.chunks_mut(dh).zip(acc.chunks(dh)).zip(sum) {
                out.iter_mut().zip(acc).for_each(|(o, &a)| *o = a / l);
            }
            for ((lse, &m), &l) in lse[first..first + tq].iter_mut().zip(max).zip(sum) {
                *lse = m + l.ln();
            }
        }
    }
    (
        tensor(out, [b, h, t, dh], &device),
        tensor(lse, [b, h, t, 1], &device),
    )
}

/// The gradients of `q`, `k` and `v`, recomputing each block's probabilities.
///
/// # Shapes
/// - as [`crate::model::efficient_attention::backward_tiled`]
pub(crate) fn backward(
    saved: &SavedTensors,
    grad_out: Tensor<4>,
    mask: &TiledMask,
) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
    let [b, h, _, dh] = saved.q.dims();
    let hkv = saved.k.dims()[1];
    let group = h / hkv;
    let device = saved.q.device();
    let scale = (dh as f64).powf(-0.5) as f32;
    backward_by_blocks(saved, grad_out, |block| {
        let (tq, tk) = (block.queries.len(), block.keys.len());
        let shape = [b, hkv, group * tq, tk];
        let rows = Block::new(mask, h, block.queries, block.keys);
        let lse = values(block.lse.clone()); // [B·Hkv·G·tq]
        let delta = values(block.delta.clone()); // [B·Hkv·G·tq]
        let mut p = values(block.q.clone().matmul(block.k.clone().swap_dims(2, 3)));
        p.par_chunks_mut(tk * ROWS_PER_TASK)
            .zip(lse.par_chunks(ROWS_PER_TASK))
            .enumerate()
            .for_each(|(task, (p, lse))| {
                let first = task * ROWS_PER_TASK;
                for (r, (row, &lse)) in p.chunks_mut(tk).zip(lse).enumerate() {
                    row.iter_mut().for_each(|s| *s *= scale);
                    rows.mask_row(first + r, row);
                    row.iter_mut().for_each(|s| *s = fast_exp(*s - lse));
                }
            });
        let mut grad_s = values(
            block
                .grad_out
                .clone()
                .matmul(block.v.clone().swap_dims(2, 3)),
        );
        grad_s
            .par_chunks_mut(tk * ROWS_PER_TASK)
            .zip(p.par_chunks(tk * ROWS_PER_TASK))
            .zip(delta.par_chunks(ROWS_PER_TASK))
            .for_each(|((grad, p), delta)| {
                for ((grad, p), &d) in grad.chunks_mut(tk).zip(p.chunks(tk)).zip(delta) {
                    grad.iter_mut()
                        .zip(p)
                        .for_each(|(g, &p)| *g = p * (*g - d) * scale);
                }
            });
        (tensor(p, shape, &device), tensor(grad_s, shape, &device))
    })
}
