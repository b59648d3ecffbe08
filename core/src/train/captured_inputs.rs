//! A captured step's inputs, every micro-batch's of one kind in one device buffer: token ids,
//! the RoPE tables, the eager attention's mask and the two label columns. Micro-batch `m`'s
//! inputs are views of the buffer's `m`-th part, which the recorded graph reads; each new
//! step's batch is written over each buffer once (`link::write_over`), so a step submits the
//! same writes whatever its accumulation (a buffer a micro-batch submitted `6·K`).
//!
//! The parts lie end to end, so a step writes exactly its batch's bytes. The views are taken
//! inside the recording: burn's slice is a view only where both ends of the part lie at
//! multiples of the device's memory alignment, and a copy elsewhere (with two or more
//! micro-batches, a part whose bytes are not a multiple of it: the label columns, usually),
//! which the graph must then repeat each replay (a copy made before the recording kept the
//! first step's labels: measured, replays 0.37 off in loss). Those copies are held for the run
//! (`predict::link::held_by_recorded_step`).
//!
//! # Shapes
//! - each kind: a flat buffer of K parts; micro-batch `m`'s views: ids `[B, T]`, RoPE
//!   `[B, 1, T, Dh]` × 2, mask `[1 or B, 1, T, T]`, label columns `[B·(T − 1)]` × 2

use burn::tensor::kind::Basic;
use burn::tensor::{Int, Tensor, TensorData};

use super::step::StepInputs;
use crate::data::MicroBatch;
use crate::device::link::{self, Traffic, write_over, write_over_int};
use crate::error::{Error, Result};
use crate::model::Llama;
use crate::model::attention::AttentionMask;
use crate::model::loss::weighted_label_columns;
use crate::model::rope::{RopeTables, inverse_frequencies};

/// One micro-batch's inputs: views of the step's buffers.
pub(super) struct KeptInputs {
    pub inputs: StepInputs,
    /// `[B·(T − 1)]`: each label's class (0 where ignored).
    pub classes: Tensor<1>,
    /// `[B·(T − 1)]`: each label's weight, `1 / label tokens of the step` (0 where ignored).
    pub weights: Tensor<1>,
}

/// The step's input buffers, one a kind, each `K` parts, and where the parts lie.
pub(super) struct PackedInputs {
    ids: Tensor<1, Int>,
    cos: Tensor<1>,
    sin: Tensor<1>,
    /// The eager attention's; None for the tiled one (its masks are made on the host).
    mask: Option<Tensor<1>>,
    classes: Tensor<1>,
    weights: Tensor<1>,
    /// The label columns are per logits row, for the chunked loss.
    chunked: bool,
    /// The parts of ids, cos, sin, mask, classes, weights.
    layout: [Layout; 6],
}

/// Where one kind's parts lie in its buffer: each part's shape, and the values from one
/// part's start to the next (its length: the parts are end to end).
#[derive(Debug, Clone, Default)]
struct Layout {
    shape: Vec<usize>,
    stride: usize,
}

impl Layout {
    /// Part `m` of `buffer`, in its own shape.
    fn view<const D: usize, K: Basic>(&self, buffer: &Tensor<1, K>, m: usize) -> Tensor<D, K> {
        let len = self.shape.iter().product();
        let shape: [usize; D] = std::array::from_fn(|i| self.shape[i]);
        buffer
            .clone()
            .narrow(0, m * self.stride, len)
            .reshape(shape)
    }
}

/// One kind's host data: its parts laid end to end.
struct Parts {
    data: TensorData,
    layout: Layout,
}

impl Parts {
    fn of(parts: Vec<TensorData>) -> Result<Self> {
        let first = parts
            .first()
            .ok_or_else(|| Error::Internal("a step without micro-batches".into()))?;
        let (dtype, shape) = (first.dtype(), first.shape().to_vec());
        let stride_bytes = first.as_bytes().len();
        let mut bytes = vec![0u8; stride_bytes * parts.len()];
        for (i, part) in parts.iter().enumerate() {
            if part.dtype() != dtype || part.shape().to_vec() != shape {
                return Err(Error::Internal(
                    "a captured step's micro-batches differ in shape".into(),
                ));
            }
            bytes[i * stride_bytes..][..stride_bytes].copy_from_slice(part.as_bytes());
        }
        let values = bytes.len() / dtype.size();
        Ok(Parts {
            data: TensorData::from_bytes_vec(bytes, [values], dtype),
            layout: Layout {
                stride: stride_bytes / dtype.size(),
                shape,
            },
        })
    }
}

/// The host data of a step's inputs, each kind's parts end to end.
struct StepData {
    ids: Parts,
    cos: Parts,
    sin: Parts,
    mask: Option<Parts>,
    classes: Parts,
    weights: Parts,
}

impl StepData {
    /// The step's data; the label columns per logits row (`[B·T]`) for the chunked loss, per
    /// label (`[B·(T − 1)]`) otherwise.
    fn of(model: &Llama, micro: &[MicroBatch], chunked: bool) -> Result<Self> {
        let weight = step_weight(micro);
        let inv_freq = inverse_frequencies(&model.config);
        let (mut ids, mut cos, mut sin, mut mask) = (vec![], vec![], vec![], vec![]);
        let (mut classes, mut weights) = (vec![], vec![]);
        let eager = model.attention == crate::config::AttentionKind::Eager;
        for m in micro {
            let batch = &m.batch;
            let [c, s] = RopeTables::data(&inv_freq, &batch.positions, batch.batch, batch.seq);
            let dims = [batch.batch, batch.seq, model.config.vocab_size];
            let [k, w] = weighted_label_columns(dims, &m.labels, weight, chunked)?;
            ids.push(batch.ids_data());
            cos.push(c);
            sin.push(s);
            classes.push(k);
            weights.push(w);
            if eager {
                mask.push(batch.attention_mask_data(model.config.sliding_window));
            }
        }
        Ok(StepData {
            ids: Parts::of(ids)?,
            cos: Parts::of(cos)?,
            sin: Parts::of(sin)?,
            mask: match eager {
                true => Some(Parts::of(mask)?),
                false => None,
            },
            classes: Parts::of(classes)?,
            weights: Parts::of(weights)?,
        })
    }
}

impl PackedInputs {
    /// `micro`'s inputs uploaded once a kind (the tables outside autodiff when the step
    /// `recomputes` blocks, as `StepInputs::upload`), and each micro-batch's context (its host
    /// tables) for [`PackedInputs::views`].
    pub(super) fn upload(
        model: &Llama,
        micro: &[MicroBatch],
        recomputes: bool,
        chunk_rows: Option<usize>,
    ) -> Result<(Self, Vec<StepInputs>)> {
        let data = StepData::of(model, micro, chunk_rows.is_some())?;
        let tables_on = match recomputes {
            true => model.device().inner(),
            false => model.device(),
        };
        let device = model.device();
        let mask_layout = data.mask.as_ref().map(|m| m.layout.clone());
        let packed = PackedInputs {
            ids: link::upload(data.ids.data, &device, Traffic::Data),
            cos: link::upload(data.cos.data, &tables_on, Traffic::Data),
            sin: link::upload(data.sin.data, &tables_on, Traffic::Data),
            mask: data
                .mask
                .map(|mask| link::upload(mask.data, &tables_on, Traffic::Data)),
            classes: link::upload(data.classes.data, &device, Traffic::Data),
            weights: link::upload(data.weights.data, &device, Traffic::Data),
            chunked: chunk_rows.is_some(),
            layout: [
                data.ids.layout,
                data.cos.layout,
                data.sin.layout,
                mask_layout.unwrap_or_default(),
                data.classes.layout,
                data.weights.layout,
            ],
        };
        let contexts = micro
            .iter()
            .map(|m| StepInputs::upload(model, &m.batch, recomputes))
            .collect();
        Ok((packed, contexts))
    }

    /// Each micro-batch's inputs as views of the buffers, its `contexts`' device tensors
    /// swapped for them (theirs are dropped). Called inside the recording, so that a view burn
    /// makes as a copy is a copy the graph repeats; it uploads nothing.
    pub(super) fn views(&self, contexts: Vec<StepInputs>) -> Vec<KeptInputs> {
        let [ids, cos, sin, mask, classes, weights] = &self.layout;
        contexts
            .into_iter()
            .enumerate()
            .map(|(m, mut inputs)| {
                inputs.ids = ids.view(&self.ids, m);
                inputs.ctx.rope.cos = cos.view(&self.cos, m);
                inputs.ctx.rope.sin = sin.view(&self.sin, m);
                if let (AttentionMask::Dense(view), Some(buffer)) =
                    (&mut inputs.ctx.mask, &self.mask)
                {
                    *view = mask.view(buffer, m);
                }
                KeptInputs {
                    inputs,
                    classes: classes.view(&self.classes, m),
                    weights: weights.view(&self.weights, m),
                }
            })
            .collect()
    }

    /// Writes `micro`'s data over the buffers, one write a kind; false where a buffer could
    /// not be written (its length differs).
    pub(super) fn refresh(&self, model: &Llama, micro: &[MicroBatch]) -> Result<bool> {
        let data = StepData::of(model, micro, self.chunked)?;
        let mut written = write_over_int(&self.ids, data.ids.data, Traffic::Data)
            && write_over(&self.cos, data.cos.data, Traffic::Data)
            && write_over(&self.sin, data.sin.data, Traffic::Data)
            && write_over(&self.classes, data.classes.data, Traffic::Data)
            && write_over(&self.weights, data.weights.data, Traffic::Data);
        match (&self.mask, data.mask) {
            (Some(mask), Some(parts)) => written &= write_over(mask, parts.data, Traffic::Data),
            (None, None) => {}
            _ => written = false,
        }
        Ok(written)
    }
}

/// Each counted label's weight in the step's loss: `1 / label tokens of the step`.
pub(super) fn step_weight(micro: &[MicroBatch]) -> f32 {
    let total: usize = micro.iter().map(MicroBatch::label_tokens).sum();
    1.0 / total.max(1) as f32
}
