//! Rotary position embedding of a whole projection, `[B, T, n·Dh]`, in one pass.
//!
//! Per head vector, with `lo = x[..Dh/2]`, `hi = x[Dh/2..]` and the table values `c`, `s` of its
//! position (HF's "rotate half", [`crate::model::rope`]):
//!
//! - forward: `y_lo = lo·c_lo − hi·s_lo`, `y_hi = hi·c_hi + lo·s_hi`, written over `x`
//!   (burn's ops cut, negate, concatenate and multiply: five passes over `[B, H, T, Dh]`);
//! - backward, the transposed rotation: `∂lo = ∂y_lo·c_lo + ∂y_hi·s_hi`,
//!   `∂hi = ∂y_hi·c_hi − ∂y_lo·s_lo`, written over `∂y`.
//!
//! It keeps nothing but the batch's tables (shared by every layer): the rotation needs no
//! input to be undone.

use std::sync::Arc;

use burn::tensor::{Device, Tensor};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_backend::tensor::FloatTensor;
use burn_dispatch::{DispatchKindConversion, DispatchTensor};
use rayon::prelude::*;

use super::{CpuKernel, CpuValues, backend_tensor, host_values, is_f32, on_cpu, tracked_or_plain};

/// A batch's cos/sin tables on the host, `[B·T, Dh]` each, row-major.
#[derive(Debug, Clone)]
pub struct HostTables {
    /// cos of each position's angles.
    pub cos: Arc<[f32]>,
    /// sin of each position's angles.
    pub sin: Arc<[f32]>,
    /// Dh.
    pub head_dim: usize,
}

/// Positions per rayon task.
const POSITIONS_PER_TASK: usize = 16;

/// Rotates every head of a projection; differentiable. The input back (`Err`) when it is not f32 on a
/// CPU backend (the caller then uses burn's ops).
///
/// # Shapes
/// - `x`: `[B, T, n·Dh]` → `[B, T, n·Dh]`; the tables hold `B·T` rows
pub fn rope(x: Tensor<3>, tables: &HostTables) -> Result<Tensor<3>, Tensor<3>> {
    let [b, t, width] = x.dims();
    if !is_f32(&x) || width % tables.head_dim != 0 || tables.cos.len() != b * t * tables.head_dim {
        return Err(x);
    }
    on_cpu(&Rope { tables }, x)
}

/// The fused op on one CPU backend.
struct Rope<'a> {
    tables: &'a HostTables,
}

impl CpuKernel for Rope<'_> {
    type Inputs = Tensor<3>;
    type Output = Tensor<3>;

    fn on_backend<B: CpuValues>(&self, x: Tensor<3>) -> Result<Tensor<3>, Tensor<3>>
    where
        DispatchTensor: DispatchKindConversion<B> + DispatchKindConversion<Autodiff<B>>,
    {
        let shape = x.dims();
        tracked_or_plain::<B, _, _>(
            x,
            |x| Tensor::from_primitive::<Autodiff<B>>(tracked::<B>(x, self.tables, shape)),
            |x| {
                let (mut values, device) = host_values::<B, 3>(x);
                rotate(&mut values, self.tables, Direction::Forward);
                Tensor::from_primitive::<B>(backend_tensor::<B, 3>(values, shape, &device))
            },
        )
    }
}

/// Which way to turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// The embedding: by +angle.
    Forward,
    /// Its transpose (the backward): by −angle.
    Backward,
}

/// Rotates `[B·T, n·Dh]` values in place, each position with its table row.
fn rotate(values: &mut [f32], tables: &HostTables, direction: Direction) {
    let dh = tables.head_dim;
    let half = dh / 2;
    let width = values.len() / (tables.cos.len() / dh);
    values
        .par_chunks_mut(width * POSITIONS_PER_TASK)
        .zip(tables.cos.par_chunks(dh * POSITIONS_PER_TASK))
        .zip(tables.sin.par_chunks(dh * POSITIONS_PER_TASK))
        .for_each(|((values, cos), sin)| {
            for ((position, cos), sin) in values
                .chunks_mut(width)
                .zip(cos.chunks(dh))
                .zip(sin.chunks(dh))
            {
                let (c_lo, c_hi) = cos.split_at(half);
                let (s_lo, s_hi) = sin.split_at(half);
                for head in position.chunks_mut(dh) {
                    let (lo, hi) = head.split_at_mut(half);
                    for j in 0..half {
                        let (l, h) = (lo[j], hi[j]);
                        (lo[j], hi[j]) = match direction {
                            Direction::Forward => {
                                (l * c_lo[j] - h * s_lo[j], h * c_hi[j] + l * s_hi[j])
                            }
                            Direction::Backward => {
                                (l * c_lo[j] + h * s_hi[j], h * c_hi[j] - l * s_lo[j])
                            }
                        };
                    }
                }
            }
        });
}

/// What the forward keeps: the tables, the shape and the device.
type Saved = (HostTables, [usize; 3], Device);

#[derive(Debug)]
struct RopeBackward;

impl<B: CpuValues> Backward<B, 1> for RopeBackward
where
    DispatchTensor: DispatchKindConversion<B>,
{
    type State = Saved;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (tables, shape, device) = ops.state;
        let (mut grad, _) = host_values::<B, 3>(grads.consume::<B>(&ops.node));
        rotate(&mut grad, &tables, Direction::Backward);
        let [parent] = ops.parents;
        if let Some(node) = parent {
            grads.register::<B>(node.id, backend_tensor::<B, 3>(grad, shape, &device));
        }
    }
}

fn tracked<B: CpuValues>(
    x: FloatTensor<Autodiff<B>>,
    tables: &HostTables,
    shape: [usize; 3],
) -> FloatTensor<Autodiff<B>>
where
    DispatchTensor: DispatchKindConversion<B>,
{
    let prep = RopeBackward
        .prepare::<NoCheckpointing>([x.node()])
        .compute_bound()
        .stateful();
    let (mut values, device) = host_values::<B, 3>(x.into_primitive());
    rotate(&mut values, tables, Direction::Forward);
    let y = backend_tensor::<B, 3>(values, shape, &device);
    match prep {
        OpsKind::Tracked(prep) => prep.finish((tables.clone(), shape, device), y),
        OpsKind::UnTracked(prep) => prep.finish(y),
    }
}
