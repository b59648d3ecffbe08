//! Memory-efficient ("flash-style") causal attention: the `[B, H, T, T]` scores and
//! probabilities never exist.
//!
//! The queries and keys are cut into tiles of [`TILE`] positions. For each query tile the key
//! tiles up to the diagonal are visited with an online softmax (a running row maximum `m`, a
//! running sum `l` of `exp(s − m)`, and an accumulator rescaled whenever `m` grows), so only
//! one `[B, H, tile, tile]` block of scores is alive at a time. The forward keeps `q`, `k`,
//! `v`, the output and one log-sum-exp per query row; the backward recomputes each block's
//! probabilities from those (`p = exp(s − lse)`) and forms
//!
//! - `∂v += pᵀ·∂o`, `∂p = ∂o·vᵀ`, `∂s = p ⊙ (∂p − rowsum(∂o ⊙ o))`,
//! - `∂q += ∂s·k·scale`, `∂k += ∂sᵀ·q·scale`.
//!
//! Key tiles past the diagonal are skipped (every key there is in the future), which halves
//! the score FLOPs at long context. Grouped-query heads are folded as in the eager attention:
//! each K/V head meets its group of query heads in one batched matmul.
//!
//! The gradient is a custom autodiff operation on every backend napkin builds: the CPU ones
//! (Flex, NdArray: the tiles on host values, `fused::tiled_attention`) and burn's cubecl one
//! (wgpu, WebGPU, CUDA: the tiles with burn's ops). Any other backend would run the same tiled
//! math under burn's own autodiff, which gives the same values and gradients but keeps every
//! block's probabilities for the backward (no memory saving).

use std::ops::Range;
use std::sync::{Arc, Mutex};

use burn::tensor::{Device, Tensor, TensorData};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_backend::Backend;
use burn_backend::tensor::FloatTensor;
use burn_dispatch::{DispatchKindConversion, DispatchTensor};

use super::cpu::fused;
use crate::config::MASKED;
use crate::device::link::{self, Traffic};
use crate::memory::inner_marks;

/// Query and key positions per tile.
pub use crate::config::ATTENTION_TILE as TILE;

/// The causal (and, for packed rows, same-segment) visibility of a batch, kept as segment ids
/// so that a tile's additive mask is built only when that tile needs one.
///
/// Without packing a tile's mask depends only on its size and the offset between its query
/// and key positions, so each distinct one is built and uploaded once per batch and shared by
/// every layer and pass (forward, recompute, backward) through the clones of this mask.
#[derive(Debug, Clone)]
pub struct TiledMask {
    batch: usize,
    seq: usize,
    /// `[B, T]` segment ids; None when no row is packed.
    segments: Option<Arc<[u32]>>,
    /// A sliding window (Mistral's): query i sees keys i − window < j ≤ i.
    window: Option<usize>,
    /// The causal tiles made so far: (|q|, |k|, q.start − k.start) → the mask on its device.
    causal: Arc<Mutex<Vec<(CausalTile, Tensor<4>)>>>,
}

/// What an unpacked tile's mask depends on: its query and key counts and their offset.
type CausalTile = (usize, usize, isize);

impl TiledMask {
    /// The mask of `batch` rows of `seq` positions; `segments` (`[B, T]` segment ids) when some
    /// row holds several packed sequences, None when the mask is only causal; `window` for a
    /// model with a sliding window.
    pub fn new(batch: usize, seq: usize, segments: Option<&[u32]>, window: Option<usize>) -> Self {
        TiledMask {
            batch,
            seq,
            segments: segments.map(Arc::from),
            window,
            causal: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Whether some row holds several packed sequences (else the mask is only causal, perhaps
    /// windowed).
    pub(crate) fn is_packed(&self) -> bool {
        self.segments.is_some()
    }

    /// The sliding window, if the model has one.
    pub(crate) fn window(&self) -> Option<usize> {
        self.window
    }

    /// Whether key position `j` is older than query position `i`'s window.
    fn too_far(&self, i: usize, j: usize) -> bool {
        self.window.is_some_and(|w| j + w <= i)
    }

    /// Whether query position `i` of batch row `b` cannot see key position `j` (a future key,
    /// one past the window, or one of another packed sequence).
    pub(crate) fn hides(&self, b: usize, i: usize, j: usize) -> bool {
        j > i
            || self.too_far(i, j)
            || self.segments.as_ref().is_some_and(|s| {
                let row = &s[b * self.seq..(b + 1) * self.seq];
                row[j] != row[i]
            })
    }

    /// The key tiles query tile `queries` visits: those up to the diagonal, less the ones every
    /// key of which is past every query's window (skipped, as the future ones are).
    pub(crate) fn key_tiles(&self, queries: &Range<usize>) -> impl Iterator<Item = Range<usize>> {
        let queries = queries.clone();
        tiles(queries.end).filter(move |keys| self.visits(&queries, keys))
    }

    /// Whether some query of `queries` sees some key of `keys` (up to the diagonal: the
    /// newest key within the first query's window).
    fn visits(&self, queries: &Range<usize>, keys: &Range<usize>) -> bool {
        keys.start < queries.end && !self.too_far(queries.start, keys.end - 1)
    }

    fn tile(&self, q: &Range<usize>, k: &Range<usize>, device: &Device) -> Option<Tensor<4>> {
        if self.segments.is_some() {
            return self.build_tile(q, k, device);
        }
        // Every key of the tile is visible (no future key, none past a window): no mask.
        if k.end <= q.start + 1 && !self.too_far(q.end - 1, k.start) {
            return None;
        }
        let key = (q.len(), k.len(), q.start as isize - k.start as isize);
        let mut made = self.causal.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, mask)) = made
            .iter()
            .find(|(at, mask)| *at == key && mask.device() == *device)
        {
            return Some(mask.clone());
        }
        let mask = self.build_tile(q, k, device)?;
        made.push((key, mask.clone()));
        Some(mask)
    }

    /// A tile's mask built on the host and uploaded.
    fn build_tile(&self, q: &Range<usize>, k: &Range<usize>, device: &Device) -> Option<Tensor<4>> {
        let (tq, tk) = (q.len(), k.len());
        let rows = if self.segments.is_some() {
            self.batch
        } else {
            1
        };
        let mut values = vec![0.0f32; rows * tq * tk];
        let mut any = false;
        for row in 0..rows {
            let segment = |pos: usize| {
                self.segments
                    .as_ref()
                    .map_or(0, |s| s[row * self.seq + pos])
            };
            for (a, i) in q.clone().enumerate() {
                for (c, j) in k.clone().enumerate() {
                    if j > i || self.too_far(i, j) || segment(j) != segment(i) {
                        values[(row * tq + a) * tk + c] = MASKED;
                        any = true;
                    }
                }
            }
        }
        any.then(|| {
            link::upload(
                TensorData::new(values, [rows, 1, tq, tk]),
                device,
                Traffic::Data,
            )
        })
    }
}

/// Tiles `0..len` in steps of [`TILE`].
pub(crate) fn tiles(len: usize) -> impl Iterator<Item = Range<usize>> {
    (0..len)
        .step_by(TILE)
        .map(move |start| start..(start + TILE).min(len))
}

/// One block of scaled, masked scores.
///
/// # Shapes
/// - `q`: `[B, Hkv, G·tq, Dh]` (query tile, groups folded into rows), `k`: `[B, Hkv, tk, Dh]`
/// - returns `[B, Hkv, G·tq, tk]`
fn block_scores(q: Tensor<4>, k: Tensor<4>, mask: Option<Tensor<4>>, heads: usize) -> Tensor<4> {
    let [b, hkv, rows, dh] = q.dims();
    let tk = k.dims()[2];
    let scale = (dh as f64).powf(-0.5);
    let s = q.matmul(k.swap_dims(2, 3)) * scale;
    match mask {
        Some(mask) => {
            let tq = rows * hkv / heads;
            (s.reshape([b, heads, tq, tk]) + mask).reshape([b, hkv, rows, tk])
        }
        None => s,
    }
}

/// Rows `range` of every query head, with the groups folded: `[B, H, T, X]` → `[B, Hkv, G·|range|, X]`.
fn query_rows(x: &Tensor<4>, range: &Range<usize>, kv_heads: usize) -> Tensor<4> {
    let [b, h, _, width] = x.dims();
    x.clone()
        .slice([0..b, 0..h, range.clone(), 0..width])
        .reshape([b, kv_heads, h / kv_heads * range.len(), width])
}

/// Positions `range` of the K/V heads: `[B, Hkv, T, Dh]` → `[B, Hkv, |range|, Dh]`.
fn key_rows(x: &Tensor<4>, range: &Range<usize>) -> Tensor<4> {
    let [b, hkv, _, dh] = x.dims();
    x.clone().slice([0..b, 0..hkv, range.clone(), 0..dh])
}

/// The forward without a graph: on the CPU backends (f32) on host values
/// ([`fused::tiled_attention`]), elsewhere with burn's ops.
///
/// # Shapes
/// - `q`: `[B, H, T, Dh]`, `k`, `v`: `[B, Hkv, T, Dh]`
/// - returns the output `[B, H, T, Dh]` and the log-sum-exp of each query row `[B, H, T, 1]`
pub fn forward_tiled(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    mask: &TiledMask,
) -> (Tensor<4>, Tensor<4>) {
    if let Some(fused) = fused::tiled_attention::forward(&q, &k, &v, mask) {
        return fused;
    }
    forward_with_tensor_ops(q, k, v, mask)
}

/// [`forward_tiled`] with burn's tensor ops (any backend).
pub fn forward_with_tensor_ops(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    mask: &TiledMask,
) -> (Tensor<4>, Tensor<4>) {
    let [b, h, t, dh] = q.dims();
    let hkv = k.dims()[1];
    let device = q.device();
    let mut outputs = Vec::new();
    let mut log_sum_exps = Vec::new();
    for qr in tiles(t) {
        let q_tile = query_rows(&q, &qr, hkv); // [B, Hkv, G·tq, Dh]
        // (running max m, running sum l, accumulator), all over the tile's query rows.
        let mut state: Option<(Tensor<4>, Tensor<4>, Tensor<4>)> = None;
        for kr in mask.key_tiles(&qr) {
            let s = block_scores(
                q_tile.clone(),
                key_rows(&k, &kr),
                mask.tile(&qr, &kr, &device),
                h,
            ); // [B, Hkv, G·tq, tk]
            let block_max = s.clone().max_dim(3);
            let v_tile = key_rows(&v, &kr);
            state = Some(match state {
                None => {
                    let p = (s - block_max.clone()).exp();
                    (block_max, p.clone().sum_dim(3), p.matmul(v_tile))
                }
                Some((m, l, acc)) => {
                    let m_new = m.clone().max_pair(block_max);
                    let rescale = (m - m_new.clone()).exp();
                    let p = (s - m_new.clone()).exp();
                    let l = l * rescale.clone() + p.clone().sum_dim(3);
                    let acc = acc * rescale + p.matmul(v_tile);
                    (m_new, l, acc)
                }
            });
        }
        let (m, l, acc) = state.expect("every query tile sees at least its diagonal key tile");
        let tq = qr.len();
        outputs.push((acc / l.clone()).reshape([b, h, tq, dh]));
        log_sum_exps.push((m + l.log()).reshape([b, h, tq, 1]));
    }
    (Tensor::cat(outputs, 2), Tensor::cat(log_sum_exps, 2))
}

/// The gradients of the inputs, recomputing each block's probabilities: fused on the CPU
/// backends (f32), burn's ops elsewhere.
///
/// # Shapes
/// - `q`: `[B, H, T, Dh]`, `k`, `v`: `[B, Hkv, T, Dh]`, `out`, `grad_out`: `[B, H, T, Dh]`,
///   `lse`: `[B, H, T, 1]`
/// - returns `∂q` `[B, H, T, Dh]`, `∂k`, `∂v` `[B, Hkv, T, Dh]`
pub fn backward_tiled(
    saved: &SavedTensors,
    grad_out: Tensor<4>,
    mask: &TiledMask,
) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
    if let Some(fused) = fused::tiled_attention::backward(saved, grad_out.clone(), mask) {
        return fused;
    }
    backward_with_tensor_ops(saved, grad_out, mask)
}

/// [`backward_tiled`] with burn's tensor ops (any backend).
pub fn backward_with_tensor_ops(
    saved: &SavedTensors,
    grad_out: Tensor<4>,
    mask: &TiledMask,
) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
    let [_, h, _, dh] = saved.q.dims();
    let device = saved.q.device();
    let scale = (dh as f64).powf(-0.5);
    backward_by_blocks(saved, grad_out, mask, |block| {
        let s = block_scores(
            block.q.clone(),
            block.k.clone(),
            mask.tile(block.queries, block.keys, &device),
            h,
        );
        let p = (s - block.lse.clone()).exp(); // [B, Hkv, G·tq, tk]
        let grad_p = block
            .grad_out
            .clone()
            .matmul(block.v.clone().swap_dims(2, 3));
        let grad_s = p.clone() * (grad_p - block.delta.clone()) * scale;
        (p, grad_s)
    })
}

/// One score block of the backward: the tiles it is computed from.
///
/// # Shapes
/// - `q`, `grad_out`: `[B, Hkv, G·tq, Dh]`, `lse`, `delta`: `[B, Hkv, G·tq, 1]` (query rows,
///   groups folded); `k`, `v`: `[B, Hkv, tk, Dh]`
struct BackwardBlock<'a> {
    q: &'a Tensor<4>,
    k: &'a Tensor<4>,
    v: &'a Tensor<4>,
    grad_out: &'a Tensor<4>,
    lse: &'a Tensor<4>,
    /// `rowsum(∂o ⊙ o)`.
    delta: &'a Tensor<4>,
    queries: &'a Range<usize>,
    keys: &'a Range<usize>,
}

/// The backward's loop over query tiles and the key tiles up to the diagonal. `block` gives a
/// block's probabilities `p` and score gradient `∂s = p ⊙ (∂o·vᵀ − δ)·scale`, both
/// `[B, Hkv, G·tq, tk]`; the loop forms `∂v += pᵀ·∂o`, `∂q += ∂s·k`, `∂k += ∂sᵀ·q`.
fn backward_by_blocks(
    saved: &SavedTensors,
    grad_out: Tensor<4>,
    mask: &TiledMask,
    mut block: impl FnMut(BackwardBlock<'_>) -> (Tensor<4>, Tensor<4>),
) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
    let SavedTensors { q, k, v, out, lse } = saved;
    let [b, h, t, dh] = q.dims();
    let hkv = k.dims()[1];
    // rowsum(∂o ⊙ o) = rowsum(∂p ⊙ p): the softmax backward's subtracted term. [B, H, T, 1]
    let delta = (grad_out.clone() * out.clone()).sum_dim(3);
    let key_tiles: Vec<Range<usize>> = tiles(t).collect();
    let mut grad_k: Vec<Option<Tensor<4>>> = vec![None; key_tiles.len()];
    let mut grad_v: Vec<Option<Tensor<4>>> = vec![None; key_tiles.len()];
    let add = |acc: &mut Option<Tensor<4>>, x: Tensor<4>| {
        *acc = Some(match acc.take() {
            Some(a) => a + x,
            None => x,
        })
    };
    let mut grad_q = Vec::new();
    for qr in tiles(t) {
        let q_tile = query_rows(q, &qr, hkv); // [B, Hkv, G·tq, Dh]
        let grad_out_tile = query_rows(&grad_out, &qr, hkv); // [B, Hkv, G·tq, Dh]
        let lse_tile = query_rows(lse, &qr, hkv); // [B, Hkv, G·tq, 1]
        let delta_tile = query_rows(&delta, &qr, hkv); // [B, Hkv, G·tq, 1]
        let mut grad_q_tile: Option<Tensor<4>> = None;
        for (index, kr) in key_tiles
            .iter()
            .enumerate()
            .filter(|(_, kr)| mask.visits(&qr, kr))
        {
            let k_tile = key_rows(k, kr);
            let (p, grad_s) = block(BackwardBlock {
                q: &q_tile,
                k: &k_tile,
                v: &key_rows(v, kr),
                grad_out: &grad_out_tile,
                lse: &lse_tile,
                delta: &delta_tile,
                queries: &qr,
                keys: kr,
            });
            // A measurement reads the pool here: this block's `p` and `∂s` beside the sums.
            inner_marks::mark();
            add(
                &mut grad_v[index],
                p.swap_dims(2, 3).matmul(grad_out_tile.clone()),
            );
            add(&mut grad_q_tile, grad_s.clone().matmul(k_tile));
            add(
                &mut grad_k[index],
                grad_s.swap_dims(2, 3).matmul(q_tile.clone()),
            );
        }
        let grad_q_tile = grad_q_tile.expect("every query tile sees its diagonal key tile");
        grad_q.push(grad_q_tile.reshape([b, h, qr.len(), dh]));
    }
    let gather = |parts: Vec<Option<Tensor<4>>>| {
        Tensor::cat(
            parts
                .into_iter()
                .map(|p| p.expect("every key tile is on some query tile's diagonal"))
                .collect(),
            2,
        )
    };
    (Tensor::cat(grad_q, 2), gather(grad_k), gather(grad_v))
}

/// What the forward keeps for the backward.
#[derive(Debug, Clone)]
pub struct SavedTensors {
    /// `[B, H, T, Dh]`.
    pub q: Tensor<4>,
    /// `[B, Hkv, T, Dh]`.
    pub k: Tensor<4>,
    /// `[B, Hkv, T, Dh]`.
    pub v: Tensor<4>,
    /// `[B, H, T, Dh]`.
    pub out: Tensor<4>,
    /// `[B, H, T, 1]`.
    pub lse: Tensor<4>,
}

/// Causal attention with a tiled softmax; differentiable.
///
/// # Shapes
/// - `q`: `[B, H, T, Dh]`, `k`, `v`: `[B, Hkv, T, Dh]` (after RoPE)
/// - returns `[B, H, T, Dh]`
pub fn efficient_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    mask: &TiledMask,
) -> Tensor<4> {
    if q.is_tracked() || k.is_tracked() || v.is_tracked() {
        #[cfg(feature = "flex")]
        if let Some(out) = on_backend::<burn_flex::Flex>(&q, &k, &v, mask) {
            return out;
        }
        #[cfg(feature = "openblas")]
        {
            #[allow(deprecated)]
            type NdArray = burn_ndarray::NdArray;
            if let Some(out) = on_backend::<NdArray>(&q, &k, &v, mask) {
                return out;
            }
        }
        // The GPU backends (wgpu, WebGPU, CUDA): the same tiles with burn's ops, inside the
        // custom op, so the backward recomputes each block instead of autodiff keeping it.
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        if let Some(out) = on_backend::<burn::backend::Cube>(&q, &k, &v, mask) {
            return out;
        }
    }
    // No graph needed, or a backend without the custom op (burn's autodiff then keeps the
    // blocks' probabilities).
    forward_tiled(q, k, v, mask).0
}

/// The custom op when the tensors live on `Autodiff<B>`.
fn on_backend<B: Backend>(
    q: &Tensor<4>,
    k: &Tensor<4>,
    v: &Tensor<4>,
    mask: &TiledMask,
) -> Option<Tensor<4>>
where
    DispatchTensor: DispatchKindConversion<B> + DispatchKindConversion<Autodiff<B>>,
{
    let primitive = |x: &Tensor<4>| x.clone().try_into_primitive::<Autodiff<B>>().ok();
    let (q, k, v) = (primitive(q)?, primitive(k)?, primitive(v)?);
    Some(Tensor::from_primitive::<Autodiff<B>>(tracked::<B>(
        q, k, v, mask,
    )))
}

/// The backward step; its state is what the forward kept.
#[derive(Debug)]
struct EfficientAttentionBackward;

fn wrap<B: Backend>(x: FloatTensor<B>) -> Tensor<4>
where
    DispatchTensor: DispatchKindConversion<B>,
{
    Tensor::from_primitive::<B>(x)
}

fn unwrap<B: Backend>(x: Tensor<4>) -> FloatTensor<B>
where
    DispatchTensor: DispatchKindConversion<B>,
{
    x.try_into_primitive::<B>()
        .expect("a tensor computed from this backend's tensors stays on it")
}

impl<B: Backend> Backward<B, 3> for EfficientAttentionBackward
where
    DispatchTensor: DispatchKindConversion<B>,
{
    /// What the forward kept (inner-backend tensors), and the mask.
    type State = (SavedTensors, TiledMask);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (saved, mask) = ops.state;
        let grad_out = wrap::<B>(grads.consume::<B>(&ops.node));
        let (grad_q, grad_k, grad_v) = backward_tiled(&saved, grad_out, &mask);
        drop(saved);
        let [pq, pk, pv] = ops.parents;
        for (parent, grad) in [(pq, grad_q), (pk, grad_k), (pv, grad_v)] {
            if let Some(node) = parent {
                grads.register::<B>(node.id, unwrap::<B>(grad));
            }
        }
    }
}

fn tracked<B: Backend>(
    q: FloatTensor<Autodiff<B>>,
    k: FloatTensor<Autodiff<B>>,
    v: FloatTensor<Autodiff<B>>,
    mask: &TiledMask,
) -> FloatTensor<Autodiff<B>>
where
    DispatchTensor: DispatchKindConversion<B>,
{
    let prep = EfficientAttentionBackward
        .prepare::<NoCheckpointing>([q.node(), k.node(), v.node()])
        .compute_bound()
        .stateful();
    let [q, k, v] = [q, k, v].map(|x| wrap::<B>(x.into_primitive()));
    let (out, lse) = forward_tiled(q.clone(), k.clone(), v.clone(), mask);
    let output = unwrap::<B>(out.clone());
    match prep {
        OpsKind::Tracked(prep) => {
            let saved = SavedTensors { q, k, v, out, lse };
            prep.finish((saved, mask.clone()), output)
        }
        OpsKind::UnTracked(prep) => prep.finish(output),
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Distribution, Tensor, activation::softmax};

    use super::*;
    use crate::device::DeviceKind;
    use crate::kernels::values::max_abs_diff;

    /// B = 2, H = 4 query heads over Hkv = 2 K/V heads, Dh = 8; T = 300 spans two full tiles
    /// and a partial one.
    const SHAPE: (usize, usize, usize, usize, usize) = (2, 4, 2, 300, 8);

    /// The eager formula on a dense mask: softmax(q·kᵀ/√Dh + mask)·v, K/V heads repeated.
    fn reference(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, mask: Tensor<4>) -> Tensor<4> {
        let [_, h, _, dh] = q.dims();
        let [b, hkv, t, _] = k.dims();
        let group = h / hkv;
        // Query head g·group + r uses K/V head g.
        let expand = |x: Tensor<4>| {
            x.reshape([b, hkv, 1, t, dh])
                .repeat_dim(2, group)
                .reshape([b, hkv * group, t, dh])
        };
        let scores = q.matmul(expand(k).swap_dims(2, 3)) * (dh as f64).powf(-0.5) + mask;
        softmax(scores, 3).matmul(expand(v))
    }

    /// `[B, T]` segment ids: one sequence a row, or (packed) row 0 cut into segments of 70,
    /// 150 and 80 tokens (boundaries inside tiles) and row 1 one sequence.
    fn segments(packed: bool) -> Vec<u32> {
        let (b, _, _, t, _) = SHAPE;
        let mut segments = vec![0u32; b * t];
        if packed {
            for (i, s) in segments[..t].iter_mut().enumerate() {
                *s = match i {
                    0..70 => 0,
                    70..220 => 1,
                    _ => 2,
                };
            }
        }
        segments
    }

    /// The masks every check runs on: causal, packed, and each with a sliding window of 100
    /// (key tiles wholly past it for the last query tile, partly past it below the diagonal).
    const MASKS: [(bool, Option<usize>); 4] = [
        (false, None),
        (true, None),
        (false, Some(100)),
        (true, Some(100)),
    ];

    fn tiled_mask((packed, window): (bool, Option<usize>)) -> TiledMask {
        let (b, _, _, t, _) = SHAPE;
        let segments = segments(packed);
        TiledMask::new(b, t, packed.then_some(segments.as_slice()), window)
    }

    /// The dense `[B, 1, T, T]` additive mask, written out independently of [`TiledMask`]: a
    /// future key, one past the window or one of another segment is hidden.
    fn dense_mask((packed, window): (bool, Option<usize>), device: &Device) -> Tensor<4> {
        let (b, _, _, t, _) = SHAPE;
        let segments = segments(packed);
        let mut mask = vec![0.0f32; b * t * t];
        for row in 0..b {
            let seg = &segments[row * t..(row + 1) * t];
            for i in 0..t {
                for j in 0..t {
                    if j > i || window.is_some_and(|w| i - j >= w) || seg[j] != seg[i] {
                        mask[(row * t + i) * t + j] = MASKED;
                    }
                }
            }
        }
        Tensor::from_data(TensorData::new(mask, [b, 1, t, t]), device)
    }

    fn inputs(device: &Device) -> [Tensor<4>; 3] {
        let (b, h, hkv, t, dh) = SHAPE;
        let normal = Distribution::Normal(0.0, 1.0);
        [
            Tensor::random([b, h, t, dh], normal, device),
            Tensor::random([b, hkv, t, dh], normal, device),
            Tensor::random([b, hkv, t, dh], normal, device),
        ]
    }

    /// Values within 1e-5 of the eager formula, on every mask of [`MASKS`] and CPU backend.
    #[test]
    fn values_match_eager_attention() {
        for kind in DeviceKind::cpu_backends() {
            let device = kind.open().unwrap();
            for case in MASKS {
                let [q, k, v] = inputs(&device);
                let ours = efficient_attention(q.clone(), k.clone(), v.clone(), &tiled_mask(case));
                let eager = reference(q, k, v, dense_mask(case, &device));
                assert_eq!(ours.dims(), eager.dims());
                let err = max_abs_diff(ours, eager);
                assert!(err <= 1e-5, "{kind}, mask {case:?}: max |diff| {err}");
            }
        }
    }

    /// ∂q, ∂k, ∂v of Σ(out ⊙ g) within 1e-5 of burn's autodiff through the eager formula.
    #[test]
    fn gradients_match_eager_attention() {
        for kind in DeviceKind::cpu_backends() {
            let device = kind.open().unwrap().autodiff();
            for case in MASKS {
                let inputs = inputs(&device);
                let (b, h, _, t, dh) = SHAPE;
                let g = Tensor::<4>::random([b, h, t, dh], Distribution::Normal(0.0, 1.0), &device);
                let grads_of = |efficient: bool| {
                    let [q, k, v] = inputs.clone().map(|x| x.require_grad());
                    let out = if efficient {
                        efficient_attention(q.clone(), k.clone(), v.clone(), &tiled_mask(case))
                    } else {
                        reference(q.clone(), k.clone(), v.clone(), dense_mask(case, &device))
                    };
                    let grads = (out * g.clone()).sum().backward();
                    [q, k, v].map(|x| x.grad(&grads).expect("a gradient"))
                };
                let ours = grads_of(true);
                let eager = grads_of(false);
                for (name, (a, e)) in ["q", "k", "v"].iter().zip(ours.into_iter().zip(eager)) {
                    assert_eq!(a.dims(), e.dims(), "∂{name}");
                    let err = max_abs_diff(a, e);
                    assert!(
                        err <= 1e-5,
                        "{kind}, mask {case:?}: ∂{name} max |diff| {err}"
                    );
                }
            }
        }
    }

    /// The fused CPU passes and burn's tensor ops (the path of every other backend) agree on
    /// the output, the log-sum-exp and the three gradients, on every mask of [`MASKS`].
    #[test]
    fn fused_passes_match_the_tensor_ops() {
        for kind in DeviceKind::cpu_backends() {
            let device = kind.open().unwrap();
            for case in MASKS {
                let mask = tiled_mask(case);
                let [q, k, v] = inputs(&device);
                let (out, lse) = forward_tiled(q.clone(), k.clone(), v.clone(), &mask);
                let (out_ops, lse_ops) =
                    forward_with_tensor_ops(q.clone(), k.clone(), v.clone(), &mask);
                assert!(
                    max_abs_diff(out.clone(), out_ops) <= 1e-5,
                    "{kind} {case:?}: out"
                );
                assert!(
                    max_abs_diff(lse.clone(), lse_ops) <= 1e-5,
                    "{kind} {case:?}: lse"
                );
                let grad_out =
                    Tensor::<4>::random(out.dims(), Distribution::Normal(0.0, 1.0), &device);
                let saved = SavedTensors { q, k, v, out, lse };
                let fused = backward_tiled(&saved, grad_out.clone(), &mask);
                let ops = backward_with_tensor_ops(&saved, grad_out, &mask);
                for (name, a, e) in [
                    ("q", fused.0, ops.0),
                    ("k", fused.1, ops.1),
                    ("v", fused.2, ops.2),
                ] {
                    let err = max_abs_diff(a, e);
                    assert!(err <= 1e-5, "{kind} {case:?}: ∂{name} max |diff| {err}");
                }
            }
        }
    }

    /// A tile mask is built only where some key is hidden: below the diagonal of an unpacked
    /// batch there is none.
    #[test]
    fn tiles_below_the_diagonal_need_no_mask() {
        let device = DeviceKind::Cpu.open().unwrap();
        let causal = tiled_mask((false, None));
        assert!(causal.tile(&(128..256), &(0..128), &device).is_none());
        assert!(causal.tile(&(128..256), &(128..256), &device).is_some());
        let packed = tiled_mask((true, None));
        assert!(packed.tile(&(128..256), &(0..128), &device).is_some());
        // A window of 100: below the diagonal the oldest keys are hidden, and the last query
        // tile skips the first key tile, every key of which is past every query's window.
        let windowed = tiled_mask((false, Some(100)));
        assert!(windowed.tile(&(128..256), &(0..128), &device).is_some());
        let visited: Vec<_> = windowed.key_tiles(&(256..300)).collect();
        assert_eq!(visited, [128..256, 256..300]);
    }

    /// The tiles the plan visits are the fraction of (query, key) pairs the time predictor
    /// counts (`predict::time::visited_fraction`), over sizes and windows that do and do not
    /// fall on tile edges.
    #[test]
    fn the_tile_plan_visits_the_fraction_the_predictor_counts() {
        use crate::predict::time::visited_fraction;
        for t in [100, 256, 300, 1024, 1500] {
            for window in [
                None,
                Some(1),
                Some(64),
                Some(128),
                Some(200),
                Some(256),
                Some(1000),
            ] {
                let mask = TiledMask::new(1, t, None, window);
                let pairs: usize = tiles(t)
                    .map(|q| q.len() * mask.key_tiles(&q).map(|k| k.len()).sum::<usize>())
                    .sum();
                let planned = pairs as f64 / (t * t) as f64;
                assert_eq!(
                    visited_fraction(t, window),
                    planned,
                    "t {t} window {window:?}"
                );
            }
        }
    }
}
