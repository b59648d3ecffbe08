//! The tiled attention on the CPU backends: every tile's products and softmax on host values,
//! one rayon task per head and query tile (forward) or per head (backward).
//!
//! [`super::super::efficient_attention`] states the math; its tensor-op version runs off the
//! CPU. Here each task reads its head's rows of `q`, `k`, `v` in place (row-major
//! `[B, H, T, Dh]`: one head's tile is a contiguous `[t, Dh]` block), multiplies them with a
//! single-threaded GEMM ([`super::small_gemm`]; transposed operands are read by stride, never
//! copied) and keeps its score block in one reused buffer. As burn ops, each block was sliced,
//! reshaped and copied to standard layout, its products batched over the K/V heads (three
//! heads for SmolLM2 on two threads: one idle a third of the time) and its gradients summed
//! by single-threaded adds: a SmolLM2 layer's attention took ~13 ms in the backward for
//! ~0.3 GFLOP.
//!
//! - forward, per (batch row, head, query tile): for each key tile up to the diagonal,
//!   `s = q·kᵀ`; `p = exp(s·scale + mask − m_new)` in place, updating the running row maximum
//!   `m` and sum `l`; `acc ← acc·exp(m_old − m_new) + p·v`. The tile's rows of the output are
//!   `acc / l` and the log-sum-exp `m + ln l`.
//! - backward, per (batch row, head): `δ = rowsum(∂o ⊙ o)`; for each block
//!   `p = exp(s·scale + mask − lse)`, `∂s = p ⊙ (∂o·vᵀ − δ)·scale`, `∂v += pᵀ·∂o`,
//!   `∂q += ∂s·k`, `∂k += ∂sᵀ·q`. A K/V head's gradient is the sum of its group's query heads'
//!   (one pass at the end).
//!
//! The mask is evaluated per element from positions and segment ids, never built.

use std::ops::Range;

use burn::tensor::{Device, Tensor, TensorData};
use rayon::prelude::*;

use super::small_gemm::{Operand, gemm};
use super::{exp_in_place, fast_exp, max_of, read_on_cpu, sum_of};
use crate::config::MASKED;
use crate::kernels::efficient_attention::{SavedTensors, TILE, TiledMask, tiles};

fn tensor<const D: usize>(values: Vec<f32>, shape: [usize; D], device: &Device) -> Tensor<D> {
    Tensor::from_data(TensorData::new(values, shape), device)
}

/// The sizes of one attention call.
#[derive(Clone, Copy)]
struct Dims {
    batch: usize,
    heads: usize,
    kv_heads: usize,
    seq: usize,
    head_dim: usize,
    scale: f32,
}

impl Dims {
    fn of(q: &Tensor<4>, k: &Tensor<4>) -> Self {
        let [batch, heads, seq, head_dim] = q.dims();
        Self {
            batch,
            heads,
            kv_heads: k.dims()[1],
            seq,
            head_dim,
            scale: (head_dim as f64).powf(-0.5) as f32,
        }
    }

    /// Query heads per K/V head.
    fn group(&self) -> usize {
        self.heads / self.kv_heads
    }

    /// Rows `range` of query head `head` in batch row `b` of a `[B, H, T, width]` buffer.
    fn head_rows<'a>(
        &self,
        x: &'a [f32],
        b: usize,
        head: usize,
        range: &Range<usize>,
        width: usize,
    ) -> &'a [f32] {
        let first = (b * self.heads + head) * self.seq + range.start;
        &x[first * width..(first + range.len()) * width]
    }

    /// Rows `range` of the K/V head that query head `head` reads, in a `[B, Hkv, T, Dh]` buffer.
    fn kv_rows<'a>(&self, x: &'a [f32], b: usize, head: usize, range: &Range<usize>) -> &'a [f32] {
        let first = (b * self.kv_heads + head / self.group()) * self.seq + range.start;
        &x[first * self.head_dim..(first + range.len()) * self.head_dim]
    }
}

/// Scales one row of scores and adds the mask for query position `i` of batch row `b`
/// against keys from `key_start`.
fn scale_and_mask(
    mask: &TiledMask,
    b: usize,
    i: usize,
    key_start: usize,
    scale: f32,
    scores: &mut [f32],
) {
    scores.iter_mut().for_each(|s| *s *= scale);
    if !mask.is_packed() {
        // Causal (perhaps windowed): the keys after position i, and those before its window.
        let visible = (i + 1).saturating_sub(key_start).min(scores.len());
        scores[visible..].iter_mut().for_each(|s| *s += MASKED);
        if let Some(window) = mask.window() {
            let too_old = (i + 1).saturating_sub(window + key_start).min(visible);
            scores[..too_old].iter_mut().for_each(|s| *s += MASKED);
        }
        return;
    }
    for (c, s) in scores.iter_mut().enumerate() {
        if mask.hides(b, i, key_start + c) {
            *s += MASKED;
        }
    }
}

/// Cuts a `[B·H, T, width]` buffer into one mutable block per (batch row · head, query tile).
fn tile_blocks(x: &mut [f32], seq: usize, width: usize) -> Vec<(usize, Range<usize>, &mut [f32])> {
    let mut blocks = Vec::new();
    for (bh, head) in x.chunks_mut(seq * width).enumerate() {
        let mut rest = head;
        for range in tiles(seq) {
            let (block, tail) = rest.split_at_mut(range.len() * width);
            blocks.push((bh, range, block));
            rest = tail;
        }
    }
    blocks
}

/// The forward over every tile: the output `[B, H, T, Dh]` and the log-sum-exp of each query
/// row `[B, H, T, 1]`; `None` when the tensors are not f32 on one CPU backend.
///
/// # Shapes
/// - `q`: `[B, H, T, Dh]`, `k`, `v`: `[B, Hkv, T, Dh]`
pub(crate) fn forward(
    q: &Tensor<4>,
    k: &Tensor<4>,
    v: &Tensor<4>,
    mask: &TiledMask,
) -> Option<(Tensor<4>, Tensor<4>)> {
    let d = Dims::of(q, k);
    let dh = d.head_dim;
    let mut out = vec![0.0f32; d.batch * d.heads * d.seq * dh];
    let mut lse = vec![0.0f32; d.batch * d.heads * d.seq];
    read_on_cpu(&[q, k, v], |values| {
        let [q, k, v] = [values[0], values[1], values[2]];
        let blocks: Vec<_> = tile_blocks(&mut out, d.seq, dh)
            .into_iter()
            .zip(tile_blocks(&mut lse, d.seq, 1))
            .collect();
        blocks.into_par_iter().for_each_init(
            || vec![0.0f32; TILE * TILE],
            |scores, ((bh, qr, out), (_, _, lse))| {
                let (b, head) = (bh / d.heads, bh % d.heads);
                forward_tile(&d, mask, (q, k, v), (b, head, &qr), scores, out, lse);
            },
        );
    })?;
    let device = q.device();
    Some((
        tensor(out, [d.batch, d.heads, d.seq, dh], &device),
        tensor(lse, [d.batch, d.heads, d.seq, 1], &device),
    ))
}

/// One query tile of one head: writes its rows of the output and log-sum-exp.
fn forward_tile(
    d: &Dims,
    mask: &TiledMask,
    (q, k, v): (&[f32], &[f32], &[f32]),
    (b, head, qr): (usize, usize, &Range<usize>),
    scores: &mut [f32],
    out: &mut [f32],
    lse: &mut [f32],
) {
    let (dh, tq) = (d.head_dim, qr.len());
    let q_tile = d.head_rows(q, b, head, qr, dh);
    let mut max = vec![f32::NEG_INFINITY; tq];
    let mut sum = vec![0.0f32; tq];
    // The accumulator is the output block itself (allocated as zeros) until the final division.
    for kr in mask.key_tiles(qr) {
        let tk = kr.len();
        let s = &mut scores[..tq * tk];
        gemm(
            (tq, tk, dh),
            Operand::plain(q_tile, dh),
            Operand::transposed(d.kv_rows(k, b, head, &kr), dh),
            s,
            false,
        );
        for (r, (row, acc)) in s.chunks_mut(tk).zip(out.chunks_mut(dh)).enumerate() {
            scale_and_mask(mask, b, qr.start + r, kr.start, d.scale, row);
            let new_max = max[r].max(max_of(row));
            exp_in_place(row, new_max, 1.0);
            let rescale = fast_exp(max[r] - new_max);
            sum[r] = sum[r] * rescale + sum_of(row);
            max[r] = new_max;
            acc.iter_mut().for_each(|a| *a *= rescale);
        }
        gemm(
            (tq, dh, tk),
            Operand::plain(s, tk),
            Operand::plain(d.kv_rows(v, b, head, &kr), dh),
            out,
            true,
        );
    }
    for (r, row) in out.chunks_mut(dh).enumerate() {
        let l = sum[r];
        row.iter_mut().for_each(|o| *o /= l);
        lse[r] = max[r] + l.ln();
    }
}

/// The gradients of `q`, `k` and `v`, recomputing each block's probabilities; `None` when the
/// tensors are not f32 on one CPU backend.
///
/// # Shapes
/// - as [`crate::kernels::efficient_attention::backward_tiled`]
pub(crate) fn backward(
    saved: &SavedTensors,
    grad_out: Tensor<4>,
    mask: &TiledMask,
) -> Option<(Tensor<4>, Tensor<4>, Tensor<4>)> {
    let SavedTensors { q, k, v, out, lse } = saved;
    let d = Dims::of(q, k);
    let per_head = d.seq * d.head_dim;
    let query_heads = d.batch * d.heads;
    let mut grad_q = vec![0.0f32; query_heads * per_head];
    // Each query head's share of its K/V head's gradients, summed over the group below.
    let mut grad_k_share = vec![0.0f32; query_heads * per_head];
    let mut grad_v_share = vec![0.0f32; query_heads * per_head];
    read_on_cpu(&[q, k, v, out, lse, &grad_out], |values| {
        let inputs = HeadInputs {
            q: values[0],
            k: values[1],
            v: values[2],
            out: values[3],
            lse: values[4],
            grad_out: values[5],
        };
        grad_q
            .par_chunks_mut(per_head)
            .zip(grad_k_share.par_chunks_mut(per_head))
            .zip(grad_v_share.par_chunks_mut(per_head))
            .enumerate()
            .for_each(|(bh, ((grad_q, grad_k), grad_v))| {
                let grads = HeadGrads {
                    q: grad_q,
                    k: grad_k,
                    v: grad_v,
                };
                backward_head(&d, mask, &inputs, (bh / d.heads, bh % d.heads), grads);
            });
    })?;
    let (grad_k, grad_v) = if d.group() == 1 {
        (grad_k_share, grad_v_share)
    } else {
        (sum_groups(&d, &grad_k_share), sum_groups(&d, &grad_v_share))
    };
    let device = q.device();
    let [b, h, hkv, t, dh] = [d.batch, d.heads, d.kv_heads, d.seq, d.head_dim];
    Some((
        tensor(grad_q, [b, h, t, dh], &device),
        tensor(grad_k, [b, hkv, t, dh], &device),
        tensor(grad_v, [b, hkv, t, dh], &device),
    ))
}

/// The saved tensors' values, row-major.
struct HeadInputs<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    out: &'a [f32],
    lse: &'a [f32],
    grad_out: &'a [f32],
}

/// One query head's gradient rows `[T, Dh]` (its own `∂q`; its shares of `∂k`, `∂v`).
struct HeadGrads<'a> {
    q: &'a mut [f32],
    k: &'a mut [f32],
    v: &'a mut [f32],
}

/// Every block of one query head.
fn backward_head(
    d: &Dims,
    mask: &TiledMask,
    x: &HeadInputs<'_>,
    (b, head): (usize, usize),
    grads: HeadGrads<'_>,
) {
    let dh = d.head_dim;
    let all = 0..d.seq;
    let lse = d.head_rows(x.lse, b, head, &all, 1);
    // δ = rowsum(∂o ⊙ o), the softmax backward's subtracted term.
    let delta: Vec<f32> = d
        .head_rows(x.grad_out, b, head, &all, dh)
        .chunks(dh)
        .zip(d.head_rows(x.out, b, head, &all, dh).chunks(dh))
        .map(|(g, o)| g.iter().zip(o).map(|(g, o)| g * o).sum())
        .collect();
    let mut p = vec![0.0f32; TILE * TILE];
    let mut grad_s = vec![0.0f32; TILE * TILE];
    for qr in tiles(d.seq) {
        let tq = qr.len();
        let q_tile = d.head_rows(x.q, b, head, &qr, dh);
        let grad_out_tile = d.head_rows(x.grad_out, b, head, &qr, dh);
        let grad_q_tile = &mut grads.q[qr.start * dh..qr.end * dh];
        for kr in mask.key_tiles(&qr) {
            let tk = kr.len();
            let k_tile = d.kv_rows(x.k, b, head, &kr);
            let (p, grad_s) = (&mut p[..tq * tk], &mut grad_s[..tq * tk]);
            gemm(
                (tq, tk, dh),
                Operand::plain(q_tile, dh),
                Operand::transposed(k_tile, dh),
                p,
                false,
            );
            gemm(
                (tq, tk, dh),
                Operand::plain(grad_out_tile, dh),
                Operand::transposed(d.kv_rows(x.v, b, head, &kr), dh),
                grad_s,
                false,
            );
            for (r, (p_row, grad_row)) in p.chunks_mut(tk).zip(grad_s.chunks_mut(tk)).enumerate() {
                let i = qr.start + r;
                scale_and_mask(mask, b, i, kr.start, d.scale, p_row);
                let (lse, delta) = (lse[i], delta[i]);
                for (p, g) in p_row.iter_mut().zip(grad_row) {
                    *p = fast_exp(*p - lse);
                    *g = *p * (*g - delta) * d.scale;
                }
            }
            let keys = kr.start * dh..kr.end * dh;
            gemm(
                (tk, dh, tq),
                Operand::transposed(p, tk),
                Operand::plain(grad_out_tile, dh),
                &mut grads.v[keys.clone()],
                true,
            );
            gemm(
                (tq, dh, tk),
                Operand::plain(grad_s, tk),
                Operand::plain(k_tile, dh),
                grad_q_tile,
                true,
            );
            gemm(
                (tk, dh, tq),
                Operand::transposed(grad_s, tk),
                Operand::plain(q_tile, dh),
                &mut grads.k[keys],
                true,
            );
        }
    }
}

/// `[B, H, T, Dh]` per-query-head shares summed into `[B, Hkv, T, Dh]`.
fn sum_groups(d: &Dims, shares: &[f32]) -> Vec<f32> {
    let per_head = d.seq * d.head_dim;
    let group = d.group();
    let mut sums = vec![0.0f32; d.batch * d.kv_heads * per_head];
    sums.par_chunks_mut(per_head)
        .enumerate()
        .for_each(|(bkv, sum)| {
            let first = bkv * group; // (b·Hkv + kv)·G = b·H + kv·G
            for member in shares[first * per_head..(first + group) * per_head].chunks(per_head) {
                sum.iter_mut().zip(member).for_each(|(s, &x)| *s += x);
            }
        });
    sums
}
