//! RMSNorm on the cubecl backends: `y = w ⊙ x · r`, `r = 1/√(mean(x²) + ε)` per row, the
//! formula and the keeps of `kernels/cpu/fused/rms_norm.rs`.
//!
//! - forward, one launch (one cube of 64 units a row): writes `y` and each row's `r`; keeps `x`
//!   (a handle on its buffer, the residual stream's) and the `r`s, `[B·T]` f32;
//! - backward, per row with `g = w ⊙ ∂y`: `∂x = r·g − x·r³·(g·x)/D`, one launch, written over
//!   `∂y` when nothing else holds it; when the gain trains, `∂w = Σ_rows ∂y ⊙ x·r` first (one
//!   unit a column, a second launch).
//!
//! # Shapes
//! - `x`: `[B, T, D]` f32 (rows anywhere in its buffer, the last axis unit-stride), `gain`:
//!   `[D]` f32 → `[B, T, D]`

use burn::backend::Cube;
use burn::tensor::Tensor as BurnTensor;
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_backend::DType;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::{empty_device_contiguous_dtype, empty_device_dtype};
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::strided::{row_start, row_start_mut, unit_stride_rows};
use super::{Taken, count_launch, over_or_new, take};
use crate::kernels::gpu::reduce::{UNITS, halve_to_two};
use crate::memory::inner_marks;

/// `rms_norm(x, gain, eps)` when both are f32 on a cubecl device; both back otherwise.
pub fn rms_norm(
    x: BurnTensor<3>,
    gain: BurnTensor<1>,
    eps: f64,
) -> Result<BurnTensor<3>, (BurnTensor<3>, BurnTensor<1>)> {
    if x.dims()[2] != gain.dims()[0] {
        return Err((x, gain));
    }
    Ok(match take(x, gain)? {
        Taken::Tracked(x, gain) => {
            BurnTensor::from_primitive::<Autodiff<Cube>>(tracked(x, gain, eps))
        }
        Taken::Plain(x, gain) => {
            let (y, _) = forward(unit_stride_rows(x), into_contiguous(gain), eps as f32);
            BurnTensor::from_primitive::<Cube>(y)
        }
    })
}

/// One cube a row: each unit sums the squares of every 64th value from its own, the 64 sums
/// are added in shared memory (every barrier at the kernel's top level), then each unit
/// writes its values, and unit 0 the row's `r`.
#[cube(launch_unchecked)]
fn rms_norm_forward(
    x: &Tensor<f32>,
    gain: &Tensor<f32>,
    y: &mut Tensor<f32>,
    inv: &mut Tensor<f32>,
    eps: f32,
) {
    let unit = UNIT_POS_X as usize;
    let row = CUBE_POS_X as usize;
    let dim = gain.len();
    let (from, to) = (row_start(x, row), row_start_mut(y, row));
    let mut sum = 0.0f32;
    let mut i = unit;
    while i < dim {
        let value = x[from + i];
        sum += value * value;
        i += UNITS;
    }
    let mut partial = Shared::<[f32]>::new_slice(UNITS);
    partial[unit] = sum;
    sync_cube();
    halve_to_two(&mut partial, unit, false);
    sync_cube();
    let mean_square = (partial[0] + partial[1]) / f32::cast_from(dim);
    let r = 1.0f32 / f32::sqrt(mean_square + eps);
    let mut i = unit;
    while i < dim {
        y[to + i] = gain[i] * (x[from + i] * r);
        i += UNITS;
    }
    if unit == 0 {
        inv[row] = r;
    }
}

/// One cube a row: `dot = Σ w·∂y·x` over the row (64 partial sums added in shared memory),
/// then each unit writes `∂x = r·w·∂y − x·r³·dot/D` at the values it read. With `in_place`,
/// `∂y` is read from `dx` itself and `grad` is not read (one binding a buffer): a unit reads
/// each of its values before writing it, and no other unit touches them.
#[cube(launch_unchecked)]
fn rms_norm_backward(
    grad: &Tensor<f32>,
    x: &Tensor<f32>,
    gain: &Tensor<f32>,
    inv: &Tensor<f32>,
    dx: &mut Tensor<f32>,
    #[comptime] in_place: bool,
) {
    let unit = UNIT_POS_X as usize;
    let row = CUBE_POS_X as usize;
    let dim = gain.len();
    let (at_x, at_dx) = (row_start(x, row), row_start_mut(dx, row));
    let mut at_grad = at_dx;
    if !in_place {
        at_grad = row_start(grad, row);
    }
    let mut sum = 0.0f32;
    let mut i = unit;
    while i < dim {
        let d = if in_place {
            dx[at_dx + i]
        } else {
            grad[at_grad + i]
        };
        sum += gain[i] * d * x[at_x + i];
        i += UNITS;
    }
    let mut partial = Shared::<[f32]>::new_slice(UNITS);
    partial[unit] = sum;
    sync_cube();
    halve_to_two(&mut partial, unit, false);
    sync_cube();
    let dot = partial[0] + partial[1];
    let r = inv[row];
    let correction = r * r * r * dot / f32::cast_from(dim);
    let mut i = unit;
    while i < dim {
        let d = if in_place {
            dx[at_dx + i]
        } else {
            grad[at_grad + i]
        };
        dx[at_dx + i] = r * gain[i] * d - x[at_x + i] * correction;
        i += UNITS;
    }
}

/// One unit a column: `∂w[j] = Σ_rows ∂y[row, j] · x[row, j] · r[row]`, the rows in order.
#[cube(launch_unchecked)]
fn rms_norm_gain_grad(
    grad: &Tensor<f32>,
    x: &Tensor<f32>,
    inv: &Tensor<f32>,
    dw: &mut Tensor<f32>,
) {
    let column = ABSOLUTE_POS;
    if column < dw.len() {
        let mut sum = 0.0f32;
        for row in 0..inv.len() {
            sum += grad[row_start(grad, row) + column] * x[row_start(x, row) + column] * inv[row];
        }
        dw[column] = sum;
    }
}

/// `y` (`x`'s shape, in the allocator's layout) and the `[rows]` `r`s.
fn forward(x: CubeTensor, gain: CubeTensor, eps: f32) -> (CubeTensor, CubeTensor) {
    let shape = x.meta.shape().clone();
    let rows = shape[0] * shape[1];
    let (client, device) = (x.client.clone(), x.device.clone());
    let y = empty_device_dtype(client.clone(), device.clone(), shape, DType::F32);
    let inv = empty_device_contiguous_dtype(client.clone(), device, [rows].into(), DType::F32);
    // Safety: cube `row` < rows reads `x`'s row `row` (D values from `row_start`, x unit-stride
    // along D) and `gain[..D]`, writes `y`'s row `row` (x's shape) and `inv[row]`; the shared
    // slice has UNITS values, indexed below UNITS.
    unsafe {
        rms_norm_forward::launch_unchecked(
            &client,
            CubeCount::Static(rows as u32, 1, 1),
            CubeDim::new_1d(UNITS as u32),
            x.into_tensor_arg(),
            gain.into_tensor_arg(),
            y.clone().into_tensor_arg(),
            inv.clone().into_tensor_arg(),
            eps,
        );
    }
    count_launch();
    (y, inv)
}

/// `∂x` (over `grad`'s buffer when nothing else holds it) and, when `gain_trains`, `∂w`.
fn backward(
    grad: CubeTensor,
    x: CubeTensor,
    gain: CubeTensor,
    inv: CubeTensor,
    gain_trains: bool,
) -> (CubeTensor, Option<CubeTensor>) {
    let grad = unit_stride_rows(grad);
    let shape = grad.meta.shape().clone();
    let (rows, dim) = (shape[0] * shape[1], shape[2]);
    let (client, device) = (grad.client.clone(), grad.device.clone());
    let dw = gain_trains.then(|| {
        let dw =
            empty_device_contiguous_dtype(client.clone(), device.clone(), [dim].into(), DType::F32);
        let (cube_count, cube_dim) = crate::kernels::gpu::one_thread_each(&client, dim);
        // Safety: unit `column` < D reads column `column` of every row of `grad` and `x`
        // ([rows, D], unit-stride along D) and `inv[..rows]`, and writes `dw[column]`.
        unsafe {
            rms_norm_gain_grad::launch_unchecked(
                &client,
                cube_count,
                cube_dim,
                grad.clone().into_tensor_arg(),
                x.clone().into_tensor_arg(),
                inv.clone().into_tensor_arg(),
                dw.clone().into_tensor_arg(),
            );
        }
        count_launch();
        dw
    });
    // In place `inv` stands in for the gradient, which is `dx` itself.
    let (grad, dx, in_place) = over_or_new(grad, &inv);
    // A measurement reads the pool with the operands and the result alive, as they are while
    // the kernel runs (the launch takes its arguments' handles).
    let alive = inner_marks::armed().then(|| (x.clone(), inv.clone(), grad.clone()));
    // Safety: cube `row` < rows reads row `row` of `grad` (or of `dx` itself, `in_place`) and
    // `x` (D values each, unit-stride), `gain[..D]` and `inv[row]`, and writes row `row` of
    // `dx` (the gradient's shape); in place, each value is read and then written by the same
    // unit only.
    unsafe {
        rms_norm_backward::launch_unchecked(
            &client,
            CubeCount::Static(rows as u32, 1, 1),
            CubeDim::new_1d(UNITS as u32),
            grad.into_tensor_arg(),
            x.into_tensor_arg(),
            gain.into_tensor_arg(),
            inv.into_tensor_arg(),
            dx.clone().into_tensor_arg(),
            in_place,
        );
    }
    count_launch();
    if alive.is_some() {
        inner_marks::mark();
    }
    (dx, dw)
}

/// What the forward keeps: `x` (a handle on its buffer), the gain, and each row's `r`.
type Saved = (CubeTensor, CubeTensor, CubeTensor);

#[derive(Debug)]
struct RmsNormBackward;

impl Backward<Cube, 2> for RmsNormBackward {
    type State = Saved;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (x, gain, inv) = ops.state;
        let grad = grads.consume::<Cube>(&ops.node);
        let [parent_x, parent_gain] = ops.parents;
        let (dx, dw) = backward(grad, x, gain, inv, parent_gain.is_some());
        if let (Some(node), Some(dw)) = (parent_gain, dw) {
            grads.register::<Cube>(node.id, dw);
        }
        if let Some(node) = parent_x {
            grads.register::<Cube>(node.id, dx);
        }
    }
}

fn tracked(
    x: burn_backend::tensor::FloatTensor<Autodiff<Cube>>,
    gain: burn_backend::tensor::FloatTensor<Autodiff<Cube>>,
    eps: f64,
) -> burn_backend::tensor::FloatTensor<Autodiff<Cube>> {
    let prep = RmsNormBackward
        .prepare::<NoCheckpointing>([x.node(), gain.node()])
        .compute_bound()
        .stateful();
    let x = unit_stride_rows(x.into_primitive());
    let gain = into_contiguous(gain.into_primitive());
    let (y, inv) = forward(x.clone(), gain.clone(), eps as f32);
    match prep {
        OpsKind::Tracked(prep) => prep.finish((x, gain, inv), y),
        OpsKind::UnTracked(prep) => prep.finish(y),
    }
}
