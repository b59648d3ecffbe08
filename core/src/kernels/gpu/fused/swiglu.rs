//! SwiGLU's gating on the cubecl backends, `h = silu(g) ⊙ u = g·σ(g)·u`, the formula and the
//! keeps of `kernels/cpu/fused/swiglu.rs`.
//!
//! - forward, one launch (one unit a value): keeps `g` and `u` (handles on the projections'
//!   outputs; burn's ops keep `σ(g)` and `silu(g)` besides);
//! - backward, one launch, with `s = σ(g)` recomputed: `∂g = ∂h·u·s·(1 + g·(1 − s))`,
//!   `∂u = ∂h·g·s`, written over the kept `g` and `u` when nothing else holds them.
//!
//! `σ(g) = 1/(1 + exp(−g))`.
//!
//! # Shapes
//! - `gate`, `up`: `[B, T, F]` f32 (rows anywhere in their buffers, the last axis unit-stride)
//!   → `[B, T, F]`

use burn::backend::Cube;
use burn::tensor::Tensor as BurnTensor;
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_backend::DType;
use burn_backend::tensor::FloatTensor;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::strided::{row_start, row_start_mut, unit_stride_rows};
use super::{Taken, count_launch, take};
use crate::memory::inner_marks;

/// `silu(gate) ⊙ up` when both are f32 of one shape on a cubecl device; both back otherwise.
pub fn swiglu(
    gate: BurnTensor<3>,
    up: BurnTensor<3>,
) -> Result<BurnTensor<3>, (BurnTensor<3>, BurnTensor<3>)> {
    if gate.dims() != up.dims() {
        return Err((gate, up));
    }
    Ok(match take(gate, up)? {
        Taken::Tracked(g, u) => BurnTensor::from_primitive::<Autodiff<Cube>>(tracked(g, u)),
        Taken::Plain(g, u) => {
            BurnTensor::from_primitive::<Cube>(forward(unit_stride_rows(g), unit_stride_rows(u)))
        }
    })
}

/// The offset of logical value `at` (row-major over `[B, T, F]`) in `x`'s buffer.
#[cube]
fn offset(x: &Tensor<f32>, at: usize, width: usize) -> usize {
    row_start(x, at / width) + at % width
}

/// [`offset`] in a tensor the kernel writes.
#[cube]
fn offset_mut(x: &mut Tensor<f32>, at: usize, width: usize) -> usize {
    row_start_mut(x, at / width) + at % width
}

#[cube]
fn sigmoid(x: f32) -> f32 {
    1.0f32 / (1.0f32 + f32::exp(-x))
}

/// One unit a value.
#[cube(launch_unchecked)]
fn swiglu_forward(gate: &Tensor<f32>, up: &Tensor<f32>, h: &mut Tensor<f32>, values: usize) {
    let at = ABSOLUTE_POS;
    if at < values {
        let width = h.shape(2);
        let g = gate[offset(gate, at, width)];
        let u = up[offset(up, at, width)];
        let to = offset_mut(h, at, width);
        h[to] = g * sigmoid(g) * u;
    }
}

/// One unit a value: reads `g`, `u`, `∂h` and writes `∂g`, `∂u` at the same place. `dg` and
/// `du` may be `gate`'s and `up`'s own buffers; then (`in_place`) `gate` and `up` are not bound
/// and the values are read from `dg` and `du` (one binding a buffer).
#[cube(launch_unchecked)]
fn swiglu_backward(
    gate: &Tensor<f32>,
    up: &Tensor<f32>,
    grad: &Tensor<f32>,
    dg: &mut Tensor<f32>,
    du: &mut Tensor<f32>,
    values: usize,
    #[comptime] in_place: bool,
) {
    let at = ABSOLUTE_POS;
    if at < values {
        let width = grad.shape(2);
        let (at_dg, at_du) = (offset_mut(dg, at, width), offset_mut(du, at, width));
        let (g, u) = if in_place {
            (dg[at_dg], du[at_du])
        } else {
            (gate[offset(gate, at, width)], up[offset(up, at, width)])
        };
        let dh = grad[offset(grad, at, width)];
        let s = sigmoid(g);
        dg[at_dg] = dh * u * s * (1.0f32 + g * (1.0f32 - s));
        du[at_du] = dh * g * s;
    }
}

fn forward(gate: CubeTensor, up: CubeTensor) -> CubeTensor {
    let shape = gate.meta.shape().clone();
    let values = shape.num_elements();
    let client = gate.client.clone();
    let h = empty_device_dtype(client.clone(), gate.device.clone(), shape, DType::F32);
    let (cube_count, cube_dim) = crate::kernels::gpu::one_thread_each(&client, values);
    // Safety: unit `at` < values reads value `at` of `gate` and `up` and writes value `at` of
    // `h`, all of one `[B, T, F]` shape, each at its own strides (unit-stride along F).
    unsafe {
        swiglu_forward::launch_unchecked(
            &client,
            cube_count,
            cube_dim,
            gate.into_tensor_arg(),
            up.into_tensor_arg(),
            h.clone().into_tensor_arg(),
            values,
        );
    }
    count_launch();
    h
}

/// `(∂g, ∂u)`, over `gate`'s and `up`'s buffers when nothing else holds them.
fn backward(gate: CubeTensor, up: CubeTensor, grad: CubeTensor) -> (CubeTensor, CubeTensor) {
    let grad = unit_stride_rows(grad);
    let shape = gate.meta.shape().clone();
    let values = shape.num_elements();
    let (client, device) = (gate.client.clone(), gate.device.clone());
    // A measurement reads the pool with the operands and the results alive, as they are while
    // the kernel runs (the launch takes its arguments' handles).
    let alive = inner_marks::armed().then(|| grad.clone());
    let in_place = gate.can_mut() && up.can_mut();
    let (gate, up, dg, du) = match in_place {
        // Unread: the gradient stands in for `g` and `u`, which are `∂g` and `∂u` themselves.
        true => (grad.clone(), grad.clone(), gate, up),
        false => {
            let new =
                || empty_device_dtype(client.clone(), device.clone(), shape.clone(), DType::F32);
            (gate, up, new(), new())
        }
    };
    let (cube_count, cube_dim) = crate::kernels::gpu::one_thread_each(&client, values);
    // Safety: unit `at` < values reads value `at` of `gate`, `up` (or of `dg`, `du` in place)
    // and `grad`, and writes value `at` of `dg` and `du`, all of one `[B, T, F]` shape at their
    // own strides; in place, each value is read and then written by the same unit only.
    unsafe {
        swiglu_backward::launch_unchecked(
            &client,
            cube_count,
            cube_dim,
            gate.into_tensor_arg(),
            up.into_tensor_arg(),
            grad.into_tensor_arg(),
            dg.clone().into_tensor_arg(),
            du.clone().into_tensor_arg(),
            values,
            in_place,
        );
    }
    count_launch();
    if alive.is_some() {
        inner_marks::mark();
    }
    (dg, du)
}

#[derive(Debug)]
struct SwigluBackward;

impl Backward<Cube, 2> for SwigluBackward {
    /// `g` and `u`: handles on the projections' outputs.
    type State = (CubeTensor, CubeTensor);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (gate, up) = ops.state;
        let grad = grads.consume::<Cube>(&ops.node);
        let (dg, du) = backward(gate, up, grad);
        let [parent_gate, parent_up] = ops.parents;
        for (parent, grad) in [(parent_gate, dg), (parent_up, du)] {
            if let Some(node) = parent {
                grads.register::<Cube>(node.id, grad);
            }
        }
    }
}

fn tracked(
    gate: FloatTensor<Autodiff<Cube>>,
    up: FloatTensor<Autodiff<Cube>>,
) -> FloatTensor<Autodiff<Cube>> {
    let prep = SwigluBackward
        .prepare::<NoCheckpointing>([gate.node(), up.node()])
        .compute_bound()
        .stateful();
    let g = unit_stride_rows(gate.into_primitive());
    let u = unit_stride_rows(up.into_primitive());
    let h = forward(g.clone(), u.clone());
    match prep {
        OpsKind::Tracked(prep) => prep.finish((g, u), h),
        OpsKind::UnTracked(prep) => prep.finish(h),
    }
}
