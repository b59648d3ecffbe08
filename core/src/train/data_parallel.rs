//! Data-parallel training (DDP) in the trainer: each rank runs its own micro-batches and one
//! all-reduce per optimizer step makes every rank's gradients the global ones.
//!
//! - The stream's micro-batches are dealt round-robin: of each step's `N·K` micro-batches
//!   (N ranks, K accumulation steps) rank r takes those at `r, r + N, …`. Every rank reads the
//!   same seeded stream, so the shares are disjoint and together they are exactly what one
//!   device with `N·K` accumulation steps trains on; an epoch whose micro-batches are not a
//!   multiple of `N·K` runs on into the next epoch's first ones, as that one device would.
//! - Each rank's gradients are normalised by its own label tokens (the token-weighted rule);
//!   multiplied back by them, summed over the ranks and divided by the global count they are
//!   the gradients of the global mean loss: N ranks × K steps equal one device with N·K.
//! - One all-reduce of the trainable gradients in the model's parameter order, flattened into
//!   one f32 buffer (`4 × trainable` bytes, `predict::communication`'s DDP payload), and one of
//!   the step's loss sum, label tokens and tokens (3 f64).

use burn::module::Module;
use burn::tensor::{Device, Tensor, TensorData};

use super::grads::ParamGrads;
use super::optimizer::trainable_ids;
use crate::distributed::Counted;
use crate::error::{Error, Result};

/// What the all-reduces carry, as the counts name them.
pub const GRADIENTS: &str = "gradients";
/// The step's scalars.
pub const STEP_SCALARS: &str = "loss and token counts";
/// The adapters' hash after a checkpoint.
pub const REPLICA_HASH: &str = "replica hash";

/// One step's local figures, made global in place.
#[derive(Debug, Clone, Copy)]
pub struct StepFigures {
    /// Mean loss over the label tokens.
    pub loss: f32,
    /// Label tokens.
    pub label_tokens: usize,
    /// Tokens, padding included.
    pub tokens: usize,
}

/// Makes this rank's token-weighted gradients and figures the global ones.
pub fn all_reduce_step<M: Module>(
    collective: &mut Counted,
    model: &M,
    grads: &mut ParamGrads,
    figures: &mut StepFigures,
    device: &Device,
) -> Result<()> {
    let local = figures.label_tokens as f64;
    let mut scalars = [figures.loss as f64 * local, local, figures.tokens as f64];
    collective.sum_f64(STEP_SCALARS, &mut scalars)?;
    let total = scalars[1];
    let ids = trainable_ids(model);
    let numel: usize = ids
        .iter()
        .map(|(_, dims)| dims.iter().product::<usize>())
        .sum();
    let mut flat = Vec::with_capacity(numel);
    for (id, dims) in &ids {
        let n: usize = dims.iter().product();
        match grads.get(*id) {
            Some(g) => {
                let values = g
                    .clone()
                    .into_data()
                    .convert::<f32>()
                    .try_to_vec::<f32>()
                    .map_err(|e| Error::Internal(format!("reading a gradient: {e:?}")))?;
                flat.extend(values.iter().map(|v| v * local as f32));
            }
            // A parameter this rank's micro-batches gave no gradient: zeros, so every rank
            // hands the engine the same layout.
            None => flat.extend(std::iter::repeat_n(0.0f32, n)),
        }
    }
    collective.sum_f32(GRADIENTS, &mut flat)?;
    let inverse = if total > 0.0 { 1.0 / total as f32 } else { 0.0 };
    let mut at = 0;
    for (id, dims) in ids {
        let n: usize = dims.iter().product();
        let values: Vec<f32> = flat[at..at + n].iter().map(|v| v * inverse).collect();
        at += n;
        grads.insert(id, Tensor::from_data(TensorData::new(values, [n]), device));
    }
    figures.loss = if total > 0.0 {
        (scalars[0] / total) as f32
    } else {
        figures.loss
    };
    figures.label_tokens = total as usize;
    figures.tokens = scalars[2] as usize;
    Ok(())
}

/// FNV-1a over the trainable values, in the model's parameter order: equal on every rank
/// while the replicas are.
pub fn replica_hash<M: Module>(model: &M) -> Result<u64> {
    struct Values(Vec<Vec<f32>>);
    impl burn::module::ModuleVisitor for Values {
        fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<D>>) {
            let value = param.val();
            if value.is_require_grad()
                && let Ok(v) = value.into_data().convert::<f32>().try_to_vec::<f32>()
            {
                self.0.push(v);
            }
        }
    }
    let mut values = Values(Vec::new());
    model.visit(&mut values);
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for v in values.0.iter().flatten() {
        for byte in v.to_bits().to_le_bytes() {
            hash ^= byte as u64;
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    Ok(hash)
}
