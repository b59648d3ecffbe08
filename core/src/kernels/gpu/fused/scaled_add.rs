//! A LoRA linear's sum on the cubecl backends: `y = base + s·low`, the base product plus the
//! scaled adapter product, in one launch (burn's ops: a scalar product, then a sum).
//!
//! - forward, one launch (one unit a value): written over `base` when nothing else holds it;
//!   keeps nothing;
//! - backward: `∂base = ∂y` (the same buffer, no launch), `∂low = s·∂y` (one launch).
//!
//! peft's order: the scale multiplies the adapter's `[N, out]` product.
//!
//! # Shapes
//! - `base`, `low`: `[N, out]` f32 (rows anywhere in their buffers, the last axis unit-stride)
//!   → `[N, out]`

use burn::backend::Cube;
use burn::tensor::Tensor as BurnTensor;
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind, binary};
use burn_backend::DType;
use burn_backend::ops::FloatTensorOps;
use burn_backend::tensor::FloatTensor;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::strided::unit_stride_rows;
use super::{count_launch, over_or_new};

/// `base + s·low` when both are f32 of one shape on a cubecl device; both back otherwise.
pub fn add_scaled(
    base: BurnTensor<2>,
    low: BurnTensor<2>,
    s: f64,
) -> Result<BurnTensor<2>, (BurnTensor<2>, BurnTensor<2>)> {
    if base.dims() != low.dims() || base.dtype() != DType::F32 || low.dtype() != DType::F32 {
        return Err((base, low));
    }
    let s = s as f32;
    if let (Ok(b), Ok(l)) = (
        base.clone().try_into_primitive::<Autodiff<Cube>>(),
        low.clone().try_into_primitive::<Autodiff<Cube>>(),
    ) {
        return Ok(BurnTensor::from_primitive::<Autodiff<Cube>>(tracked(
            b, l, s,
        )));
    }
    match (
        base.clone().try_into_primitive::<Cube>(),
        low.clone().try_into_primitive::<Cube>(),
    ) {
        (Ok(b), Ok(l)) => Ok(BurnTensor::from_primitive::<Cube>(forward(b, l, s))),
        _ => Err((base, low)),
    }
}

/// One unit a value of `[N, out]`. With `in_place`, `base` is not read (`y` holds it).
#[cube(launch_unchecked)]
fn scaled_add(
    base: &Tensor<f32>,
    low: &Tensor<f32>,
    y: &mut Tensor<f32>,
    s: f32,
    values: usize,
    #[comptime] in_place: bool,
) {
    let at = ABSOLUTE_POS;
    if at < values {
        let width = y.shape(1);
        let (row, col) = (at / width, at % width);
        let to = row * y.stride(0) + col;
        let b = if in_place {
            y[to]
        } else {
            base[row * base.stride(0) + col]
        };
        y[to] = b + s * low[row * low.stride(0) + col];
    }
}

fn forward(base: CubeTensor, low: CubeTensor, s: f32) -> CubeTensor {
    let (base, low) = (unit_stride_rows(base), unit_stride_rows(low));
    let shape = base.meta.shape().clone();
    let values = shape.num_elements();
    let client = base.client.clone();
    // In place the adapter's product stands in for the base, which is `y` itself.
    let (base, y, in_place) = over_or_new(base, &low);
    let (cube_count, cube_dim) = crate::kernels::gpu::one_thread_each(&client, values);
    // Safety: unit `at` < N·out reads value `at` of `base` (or of `y` in place) and of `low`
    // and writes value `at` of `y`, all `[N, out]` at their own row strides; in place, each
    // value is read and then written by its own unit only.
    unsafe {
        scaled_add::launch_unchecked(
            &client,
            cube_count,
            cube_dim,
            base.into_tensor_arg(),
            low.into_tensor_arg(),
            y.clone().into_tensor_arg(),
            s,
            values,
            in_place,
        );
    }
    count_launch();
    y
}

#[derive(Debug)]
struct ScaledAddBackward;

impl Backward<Cube, 2> for ScaledAddBackward {
    /// The scale.
    type State = f32;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let s = ops.state;
        binary::<Cube, _, _>(
            ops.parents,
            ops.node,
            grads,
            |grad| grad,
            |grad| Cube::float_mul_scalar(grad, s.into()),
        );
    }
}

fn tracked(
    base: FloatTensor<Autodiff<Cube>>,
    low: FloatTensor<Autodiff<Cube>>,
    s: f32,
) -> FloatTensor<Autodiff<Cube>> {
    let prep = ScaledAddBackward
        .prepare::<NoCheckpointing>([base.node(), low.node()])
        .compute_bound()
        .stateful();
    let y = forward(base.into_primitive(), low.into_primitive(), s);
    match prep {
        OpsKind::Tracked(prep) => prep.finish(s, y),
        OpsKind::UnTracked(prep) => prep.finish(y),
    }
}
