//! The LM head and the causal-LM loss a chunk of rows at a time, so that the `[B·T, V]`
//! logits and their gradient never exist whole (`--chunked-loss`; the idea of Liger's fused
//! linear cross-entropy, written with napkin's own head and loss kernels).
//!
//! The head must be frozen (LoRA and QLoRA runs without an adapter on it). Then the loss
//! needs only `∂loss/∂h`, the gradient of the final norm's output `h: [B·T, D]`, and each
//! chunk of rows gives its part of it on its own:
//!
//! 1. `h` is read outside the step's graph; for each chunk of `R` rows (and the row after it,
//!    which the chunk's last label is read at, weight 0 there), the head's product makes the
//!    chunk's `[R + 1, V]` logits in a small graph of its own, the fused loss sums the chunk's
//!    NLLs and its backward gives the chunk's `∂h` (`[R + 1, D]`, its last row 0), and the
//!    chunk's logits are freed;
//! 2. the chunks' `∂h` rows, joined, are a constant `G: [B, T, D]`, and the step's graph gets
//!    the surrogate `Σ h ⊙ G`, whose backward sends `G` into the final norm and the blocks.
//!
//! The loss is the sum of the chunks' sums, reported outside the graph. The head's product
//! runs twice per row in all (forward, then for `∂h` in the chunk's backward) as in the
//! whole-logits path; what is saved is the `[B·T, V]` f32 tensor the loss keeps: with
//! SmolLM2's 49,152-word vocabulary, 96 MB at T = 512, against one chunk's 16 MiB.
//!
//! What a step holds for it: `G` (`[B, T, D]` f32, the surrogate's product keeps it until the
//! backward), and while a chunk runs its logits (on a GPU, their gradient beside them when the
//! kernel cannot write it in place), its `∂h` and the chunks' `∂h` so far.

use burn::tensor::Tensor;

use super::Llama;
use super::linear::BaseWeight;
use super::loss::{row_log_probs, shift_labels, weighted_nll};
use crate::error::{Error, Result};
use crate::kernels::cpu::fused::cross_entropy::ShiftedLabels;

pub use crate::config::{CHUNK_LOGITS_BYTES, default_chunk_rows};

/// How many chunks `rows` logits rows take with `chunk_rows` rows each: every row but the
/// last of all (it predicts nothing) begins one chunk's labels.
pub fn chunks(rows: usize, chunk_rows: usize) -> usize {
    rows.saturating_sub(1).div_ceil(chunk_rows.max(1))
}

/// Each chunk of `rows` logits rows as `(start, end)`: the labels of rows `start..end` (at
/// most `chunk_rows` of them) and the logits of rows `start..=end` (the last one's label
/// belongs to the next chunk, or, the last row of all, to nothing).
fn spans(rows: usize, chunk_rows: usize) -> impl Iterator<Item = (usize, usize)> {
    let step = chunk_rows.max(1);
    (0..rows.saturating_sub(1))
        .step_by(step)
        .map(move |start| (start, (start + step).min(rows - 1)))
}

/// The labels of rows `start..end` of `per_row`.
fn labels_of(per_row: &ShiftedLabels, start: usize, end: usize) -> ShiftedLabels {
    ShiftedLabels {
        targets: per_row.targets[start..end].into(),
        weights: per_row.weights[start..end].into(),
    }
}

/// Whether the LM head trains (its weight, its bias or an adapter on it; the tied embedding):
/// the chunked loss then does not apply.
pub fn head_trains(model: &Llama) -> bool {
    match &model.lm_head {
        None => model.embed_tokens.val().is_require_grad(),
        Some(head) => {
            head.lora.is_some()
                || matches!(&head.base, BaseWeight::Dense(w) if w.val().is_require_grad())
                || head
                    .bias
                    .as_ref()
                    .is_some_and(|b| b.val().is_require_grad())
        }
    }
}

/// The micro-batch's loss through the final norm and a frozen head, `chunk_rows` logits rows
/// at a time: the surrogate `Σ h ⊙ G` in the step's graph, whose backward gives the loss's
/// gradient, and the summed NLL (`[1]`, outside the graph), with the labels' conventions of
/// [`causal_lm_loss`](super::causal_lm_loss). On a GPU the labels are uploaded once, as two
/// `[B·T]` columns (a class and a weight per logits row), and each chunk reads its rows of them.
///
/// # Shapes
/// - `top`: `[B, T, D]` (the last block's output, in the graph); `labels`: `B·T` values
pub fn chunked_lm_loss(
    model: &Llama,
    top: Tensor<3>,
    labels: &[i64],
    chunk_rows: usize,
) -> Result<(Tensor<1>, Tensor<1>)> {
    chunked_weighted_lm_loss(model, top, labels, None, chunk_rows)
}

/// [`chunked_lm_loss`] with a weight of its own on every label (`weights` beside `labels`, as
/// [`weighted_lm_loss`](super::weighted_lm_loss) takes them): a preference objective's
/// surrogate. The `[1]` value is `Σ w·(−log p)`.
///
/// # Shapes
/// - `top`: `[B, T, D]` (in the graph); `labels`, `weights`: `B·T` values
pub fn chunked_weighted_lm_loss(
    model: &Llama,
    top: Tensor<3>,
    labels: &[i64],
    weights: Option<&[f32]>,
    chunk_rows: usize,
) -> Result<(Tensor<1>, Tensor<1>)> {
    let [b, t, _] = top.dims();
    let v = model.config.vocab_size;
    let per_row = row_labels(&shift_labels([b, t, v], labels, weights)?, b, t);
    let on_host = |logits: Tensor<3>, start: usize, end: usize| {
        weighted_nll(logits, &labels_of(&per_row, start, end))
    };
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if crate::device::is_gpu(&top.device()) {
        let [classes, weights] = super::loss::columns(&per_row, b * t);
        let upload = |data| -> Tensor<1> {
            crate::device::link::upload(data, &top.device(), crate::device::link::Traffic::Data)
        };
        let (classes, weights) = (upload(classes), upload(weights));
        return chunked(model, top, chunk_rows, |logits, start, end| {
            let rows = end - start;
            let (k, w) = (
                classes.clone().narrow(0, start, rows),
                weights.clone().narrow(0, start, rows),
            );
            // The GPU kernel takes f32 logits; others (16-bit ones) go to burn's ops.
            match crate::kernels::gpu::fused::cross_entropy::summed_nll(logits, &k, &w) {
                Ok(sum) => Ok(sum),
                Err(logits) => on_host(logits, start, end),
            }
        });
    }
    chunked(model, top, chunk_rows, on_host)
}

/// [`chunked_lm_loss`] with the labels already on the device, as two `[B·T]` f32 columns (a
/// class and a weight per logits row, weight 0 on each sequence's last row;
/// `loss::weighted_label_columns` per logits row): a step recorded as a device graph reads
/// them from its kept buffers. An error where the GPU loss kernel does not take the logits.
///
/// # Shapes
/// - `top`: `[B, T, D]`; `classes`, `weights`: `[B·T]`
pub(crate) fn chunked_lm_loss_on_device(
    model: &Llama,
    top: Tensor<3>,
    classes: &Tensor<1>,
    weights: &Tensor<1>,
    chunk_rows: usize,
) -> Result<(Tensor<1>, Tensor<1>)> {
    chunked(model, top, chunk_rows, |logits, start, end| {
        let rows = end - start;
        super::loss::summed_nll_on_device(
            logits,
            &classes.clone().narrow(0, start, rows),
            &weights.clone().narrow(0, start, rows),
        )
    })
}

/// `log p(labelₜ)` under the logits at `t − 1` for every label (0 at each row's first position
/// and at ignored labels), as [`label_log_probs`](super::label_log_probs) reads them from whole
/// logits, through the final norm and the head of `model` (graph-free, e.g. `Llama::valid`'s)
/// `chunk_rows` logits rows at a time.
///
/// # Shapes
/// - `top`: `[B, T, D]` (the last block's output, outside any graph); `labels`: `B·T` values
///   → `B·T` values, row-major `[B, T]`
pub fn chunked_label_log_probs(
    model: &Llama,
    top: Tensor<3>,
    labels: &[i64],
    chunk_rows: usize,
) -> Result<Vec<f32>> {
    let [b, t, _] = top.dims();
    let mut out = vec![0.0f32; b * t];
    graph_free_chunks(
        model,
        top,
        labels,
        chunk_rows,
        |logits, chunk_labels, start| {
            let values = row_log_probs(logits, chunk_labels)?;
            // Logits row `start + j` predicts the label at row `start + j + 1` (same sequence:
            // each sequence's last row weighs 0).
            for (j, &weight) in chunk_labels.weights.iter().enumerate() {
                if weight != 0.0 {
                    out[start + j + 1] = values[j];
                }
            }
            Ok(())
        },
    )?;
    Ok(out)
}

/// The summed NLL (`[1]`) through the final norm and the head, `chunk_rows` logits rows at a
/// time, without a graph (a held-out evaluation on `Llama::valid`'s model): one chunk's logits
/// at a time, and no gradient.
///
/// # Shapes
/// - `top`: `[B, T, D]` (the last block's output); `labels`: `B·T` values
pub fn chunked_lm_loss_value(
    model: &Llama,
    top: Tensor<3>,
    labels: &[i64],
    chunk_rows: usize,
) -> Result<Tensor<1>> {
    let mut sum: Option<Tensor<1>> = None;
    graph_free_chunks(model, top, labels, chunk_rows, |logits, chunk_labels, _| {
        let value = weighted_nll(logits, chunk_labels)?;
        sum = Some(match sum.take() {
            Some(s) => s + value,
            None => value,
        });
        Ok(())
    })?;
    sum.ok_or_else(|| Error::Input("a causal-LM loss needs 2 tokens".into()))
}

/// The graph-free chunks: `each(logits, labels, start)` gets each chunk's logits (rows
/// `start..=end` of the final norm's output through the head, `[1, end − start + 1, V]`) and
/// the labels of rows `start..end`.
fn graph_free_chunks(
    model: &Llama,
    top: Tensor<3>,
    labels: &[i64],
    chunk_rows: usize,
    mut each: impl FnMut(Tensor<3>, &ShiftedLabels, usize) -> Result<()>,
) -> Result<()> {
    let [b, t, d] = top.dims();
    let v = model.config.vocab_size;
    let per_row = row_labels(&shift_labels([b, t, v], labels, None)?, b, t);
    let h = model.norm.forward(top).reshape([b * t, d]); // [B·T, D]
    for (start, end) in spans(b * t, chunk_rows) {
        let chunk = h
            .clone()
            .narrow(0, start, end - start + 1)
            .reshape([1, end - start + 1, d]);
        each(
            model.head_product(chunk),
            &labels_of(&per_row, start, end),
            start,
        )?;
    }
    Ok(())
}

/// The chunks' loop: `nll(logits, start, end)` sums the weighted NLL of logits rows
/// `start..=end` (`[1, end − start + 1, V]`) against the labels of rows `start..end`.
fn chunked(
    model: &Llama,
    top: Tensor<3>,
    chunk_rows: usize,
    mut nll: impl FnMut(Tensor<3>, usize, usize) -> Result<Tensor<1>>,
) -> Result<(Tensor<1>, Tensor<1>)> {
    if head_trains(model) {
        return Err(Error::Input(
            "--chunked-loss needs a frozen LM head (no adapter on lm_head, no full \
             fine-tuning); run without it"
                .into(),
        ));
    }
    let [b, t, d] = top.dims();
    let normed = model.norm.forward(top); // [B, T, D], in the graph
    let h = normed.clone().inner().reshape([b * t, d]); // [B·T, D], outside it
    let rows = b * t;
    let mut grads: Vec<Tensor<2>> = Vec::with_capacity(chunks(rows, chunk_rows));
    let mut sum: Option<Tensor<1>> = None;
    for (start, end) in spans(rows, chunk_rows) {
        let last = end + 1 == rows;
        let chunk = Tensor::from_inner(h.clone().narrow(0, start, end - start + 1))
            .reshape([1, end - start + 1, d])
            .require_grad(); // [1, R + 1, D]
        let logits = model.head_product(chunk.clone()); // [1, R + 1, V]
        let chunk_nll = nll(logits, start, end)?;
        let value = chunk_nll.clone().inner();
        let backward = chunk_nll.backward();
        let grad = chunk
            .grad(&backward)
            .ok_or_else(|| Error::Internal("no gradient reached a chunk of the head".into()))?
            .reshape([end - start + 1, d]);
        drop(backward);
        // Row `end` is the next chunk's first (its gradient here is 0); the last of all is 0.
        grads.push(if last {
            grad
        } else {
            grad.narrow(0, 0, end - start)
        });
        sum = Some(match sum {
            Some(s) => s + value,
            None => value,
        });
    }
    let sum = sum.ok_or_else(|| Error::Input("a causal-LM loss needs 2 tokens".into()))?;
    let g = Tensor::cat(grads, 0).reshape([b, t, d]); // [B, T, D]
    let surrogate = (normed * Tensor::from_inner(g)).sum();
    Ok((surrogate, sum))
}

/// The shifted labels laid out per logits row: row `b·T + t` reads label `b·(T − 1) + t` for
/// `t < T − 1`, and the last row of each sequence weighs 0.
pub(super) fn row_labels(shifted: &ShiftedLabels, b: usize, t: usize) -> ShiftedLabels {
    let mut targets = vec![0u32; b * t];
    let mut weights = vec![0.0f32; b * t];
    for row in 0..b {
        let (from, to) = (row * (t - 1), row * t);
        targets[to..to + t - 1].copy_from_slice(&shifted.targets[from..from + t - 1]);
        weights[to..to + t - 1].copy_from_slice(&shifted.weights[from..from + t - 1]);
    }
    ShiftedLabels {
        targets: targets.into(),
        weights: weights.into(),
    }
}
