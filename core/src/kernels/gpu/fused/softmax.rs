//! The eager attention's scale, additive mask and softmax in one kernel on the cubecl backends,
//! with a one-kernel backward: `p = softmax(s·scale + mask)` over the last axis of the
//! `[B, H, T, S]` scores.
//!
//! - forward, one launch (one cube of 64 units a row): the row's largest shifted score and the
//!   sum of exponentials in shared memory, then `p`; keeps `p` only (burn's ops write the
//!   scaled, masked and shifted scores, their exponentials and `p`, and keep three of them);
//! - backward, one launch: `∂s = scale · p ⊙ (∂p − Σ_row ∂p ⊙ p)`, written over `∂p` when
//!   nothing else holds it.
//!
//! The scores, the probabilities and their gradients are f32, or all f16 or all bf16 (the
//! 16-bit attention under autocast, `model/attention.rs`): the arithmetic is f32 either way,
//! only what is read and written is 16-bit.
//!
//! # Shapes
//! - `scores`: `[B, H, T, S]` f32, f16 or bf16 (rows anywhere in the buffer, the last axis
//!   unit-stride); `mask`: `[1 or B, 1, T, S]` f32, contiguous → `[B, H, T, S]` in the
//!   scores' dtype

use burn::backend::Cube;
use burn::tensor::Tensor as BurnTensor;
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn_backend::DType;
use burn_backend::cubecl::dtype_to_storage_type;
use burn_backend::tensor::FloatTensor;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::strided::unit_stride_rows;
use super::{count_launch, over_or_new};
use crate::kernels::gpu::reduce::{UNITS, halve_to_two};
use crate::memory::inner_marks;

/// `softmax(scores · scale + mask)` over the last axis when the scores are f32, f16 or bf16
/// and the mask f32 on a cubecl device, and the mask broadcasts as `[1 or B, 1, T, S]`; the
/// scores back otherwise.
pub fn scaled_masked_softmax(
    scores: BurnTensor<4>,
    scale: f64,
    mask: &BurnTensor<4>,
) -> Result<BurnTensor<4>, BurnTensor<4>> {
    let [b, _, t, s] = scores.dims();
    let [mb, mh, mt, ms] = mask.dims();
    let fits = matches!(scores.dtype(), DType::F32 | DType::F16 | DType::BF16)
        && mask.dtype() == DType::F32
        && (mb == 1 || mb == b)
        && [mh, mt, ms] == [1, t, s];
    let mask = fits
        .then(|| {
            mask.clone()
                .without_autodiff()
                .try_into_primitive::<Cube>()
                .ok()
        })
        .flatten();
    let Some(mask) = mask.map(into_contiguous) else {
        return Err(scores);
    };
    let scale = scale as f32;
    if let Ok(x) = scores.clone().try_into_primitive::<Autodiff<Cube>>() {
        return Ok(BurnTensor::from_primitive::<Autodiff<Cube>>(tracked(
            x, mask, scale,
        )));
    }
    match scores.clone().try_into_primitive::<Cube>() {
        Ok(x) => Ok(BurnTensor::from_primitive::<Cube>(forward(x, mask, scale))),
        Err(_) => Err(scores),
    }
}

/// Where row `row` (over `B·H·T`) of a rank-4 tensor starts.
#[cube]
fn row_of<F: Float>(x: &Tensor<F>, row: usize) -> usize {
    let (h, t) = (x.shape(1), x.shape(2));
    (row / (h * t)) * x.stride(0) + ((row / t) % h) * x.stride(1) + (row % t) * x.stride(2)
}

/// [`row_of`] for a tensor the kernel writes.
#[cube]
fn row_of_mut<F: Float>(x: &mut Tensor<F>, row: usize) -> usize {
    let (h, t) = (x.shape(1), x.shape(2));
    (row / (h * t)) * x.stride(0) + ((row / t) % h) * x.stride(1) + (row % t) * x.stride(2)
}

/// One cube a row: the largest `s·scale + mask` (64 partial maxima halved in shared memory),
/// the sum of their exponentials (likewise), then each unit writes its `p`. f32 arithmetic
/// whatever `F`.
#[cube(launch_unchecked)]
fn softmax_forward<F: Float>(
    scores: &Tensor<F>,
    mask: &Tensor<f32>,
    p: &mut Tensor<F>,
    scale: f32,
    #[define(F)] _dtype: ElemType,
) {
    let unit = UNIT_POS_X as usize;
    let row = CUBE_POS_X as usize;
    let width = scores.shape(3);
    let (heads, t) = (scores.shape(1), scores.shape(2));
    let at = row_of(scores, row);
    let to = row_of_mut(p, row);
    // The mask's row: its batch row when it has one per batch row, else the only one.
    let batch = row / (heads * t);
    let mask_batch = batch % mask.shape(0);
    let at_mask = mask_batch * mask.stride(0) + (row % t) * mask.stride(2);
    let mut largest = f32::new(-3.0e38); // below any score; WGSL has no infinity literal
    let mut i = unit;
    while i < width {
        largest = max(
            largest,
            f32::cast_from(scores[at + i]) * scale + mask[at_mask + i],
        );
        i += UNITS;
    }
    let mut partial = Shared::<[f32]>::new_slice(UNITS);
    partial[unit] = largest;
    sync_cube();
    halve_to_two(&mut partial, unit, true);
    sync_cube();
    let shift = max(partial[0], partial[1]);
    sync_cube();
    let mut sum = 0.0f32;
    let mut i = unit;
    while i < width {
        sum += f32::exp(f32::cast_from(scores[at + i]) * scale + mask[at_mask + i] - shift);
        i += UNITS;
    }
    partial[unit] = sum;
    sync_cube();
    halve_to_two(&mut partial, unit, false);
    sync_cube();
    let total = partial[0] + partial[1];
    let mut i = unit;
    while i < width {
        let e = f32::exp(f32::cast_from(scores[at + i]) * scale + mask[at_mask + i] - shift);
        p[to + i] = F::cast_from(e / total);
        i += UNITS;
    }
}

/// One cube a row: `dot = Σ ∂p·p` (64 partial sums halved in shared memory), then each unit
/// writes `∂s = scale·p·(∂p − dot)` at the values it read. With `in_place`, `∂p` is read from
/// `ds` itself and `grad` is not read. f32 arithmetic whatever `F`.
#[cube(launch_unchecked)]
fn softmax_backward<F: Float>(
    grad: &Tensor<F>,
    p: &Tensor<F>,
    ds: &mut Tensor<F>,
    scale: f32,
    #[comptime] in_place: bool,
    #[define(F)] _dtype: ElemType,
) {
    let unit = UNIT_POS_X as usize;
    let row = CUBE_POS_X as usize;
    let width = p.shape(3);
    let (at_p, at_ds) = (row_of(p, row), row_of_mut(ds, row));
    let mut at_grad = at_ds;
    if !in_place {
        at_grad = row_of(grad, row);
    }
    let mut sum = 0.0f32;
    let mut i = unit;
    while i < width {
        let d = if in_place {
            f32::cast_from(ds[at_ds + i])
        } else {
            f32::cast_from(grad[at_grad + i])
        };
        sum += d * f32::cast_from(p[at_p + i]);
        i += UNITS;
    }
    let mut partial = Shared::<[f32]>::new_slice(UNITS);
    partial[unit] = sum;
    sync_cube();
    halve_to_two(&mut partial, unit, false);
    sync_cube();
    let dot = partial[0] + partial[1];
    let mut i = unit;
    while i < width {
        let d = if in_place {
            f32::cast_from(ds[at_ds + i])
        } else {
            f32::cast_from(grad[at_grad + i])
        };
        ds[at_ds + i] = F::cast_from(scale * f32::cast_from(p[at_p + i]) * (d - dot));
        i += UNITS;
    }
}

fn rows_of(x: &CubeTensor) -> usize {
    let shape = x.meta.shape();
    shape[0] * shape[1] * shape[2]
}

fn forward(scores: CubeTensor, mask: CubeTensor, scale: f32) -> CubeTensor {
    let scores = unit_stride_rows(scores);
    let shape = scores.meta.shape().clone();
    let rows = rows_of(&scores);
    let client = scores.client.clone();
    let dtype = scores.dtype;
    let p = empty_device_dtype(client.clone(), scores.device.clone(), shape, dtype);
    // Safety: cube `row` < B·H·T reads row `row` of `scores` (S values from `row_of`,
    // unit-stride) and the mask's row for its batch row and position (`[1 or B, 1, T, S]`),
    // and writes row `row` of `p` (the scores' shape); the shared slice has UNITS values,
    // indexed below UNITS.
    unsafe {
        softmax_forward::launch_unchecked(
            &client,
            CubeCount::Static(rows as u32, 1, 1),
            CubeDim::new_1d(UNITS as u32),
            scores.into_tensor_arg(),
            mask.into_tensor_arg(),
            p.clone().into_tensor_arg(),
            scale,
            dtype_to_storage_type(dtype),
        );
    }
    count_launch();
    p
}

fn backward(grad: CubeTensor, p: CubeTensor, scale: f32) -> CubeTensor {
    // The gradient arrives in the probabilities' dtype from burn's product; anything else is
    // cast to it, so the kernel reads one dtype.
    let grad = match grad.dtype == p.dtype {
        true => grad,
        false => burn_cubecl::kernel::cast(grad, p.dtype),
    };
    let grad = unit_stride_rows(grad);
    let rows = rows_of(&grad);
    let client = grad.client.clone();
    let dtype = p.dtype;
    // In place `p` stands in for the gradient, which is `ds` itself.
    let (grad, ds, in_place) = over_or_new(grad, &p);
    // A measurement reads the pool with the operands and the result alive, as they are while
    // the kernel runs.
    let alive = inner_marks::armed().then(|| (p.clone(), grad.clone()));
    // Safety: cube `row` < B·H·T reads row `row` of `grad` (or of `ds` in place) and `p` (S
    // values each, unit-stride) and writes row `row` of `ds` (the gradient's shape); in place,
    // each value is read and then written by the same unit only.
    unsafe {
        softmax_backward::launch_unchecked(
            &client,
            CubeCount::Static(rows as u32, 1, 1),
            CubeDim::new_1d(UNITS as u32),
            grad.into_tensor_arg(),
            p.into_tensor_arg(),
            ds.clone().into_tensor_arg(),
            scale,
            in_place,
            dtype_to_storage_type(dtype),
        );
    }
    count_launch();
    if alive.is_some() {
        inner_marks::mark();
    }
    ds
}

#[derive(Debug)]
struct SoftmaxBackward;

impl Backward<Cube, 1> for SoftmaxBackward {
    /// The probabilities and the scale.
    type State = (CubeTensor, f32);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (p, scale) = ops.state;
        unary::<Cube, _>(ops.parents, ops.node, grads, |grad| {
            backward(grad, p, scale)
        });
    }
}

fn tracked(
    scores: FloatTensor<Autodiff<Cube>>,
    mask: CubeTensor,
    scale: f32,
) -> FloatTensor<Autodiff<Cube>> {
    let prep = SoftmaxBackward
        .prepare::<NoCheckpointing>([scores.node()])
        .compute_bound()
        .stateful();
    let p = forward(scores.into_primitive(), mask, scale);
    match prep {
        OpsKind::Tracked(prep) => prep.finish((p.clone(), scale), p),
        OpsKind::UnTracked(prep) => prep.finish(p),
    }
}
