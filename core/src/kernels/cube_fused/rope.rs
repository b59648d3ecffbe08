//! Rotary position embedding of a whole projection on the cubecl backends, the formula and the
//! keeps of `kernels/fused/rope.rs`: per head, with `lo = x[..Dh/2]`, `hi = x[Dh/2..]` and the
//! table values `c`, `s` of the position,
//!
//! - forward, one launch: `y_lo = lo·c_lo − hi·s_lo`, `y_hi = hi·c_hi + lo·s_hi`, written over
//!   `x` when nothing else holds it (burn's ops cut, negate, concatenate, multiply and add);
//! - backward, one launch, the transposed rotation: `∂lo = ∂y_lo·c_lo + ∂y_hi·s_hi`,
//!   `∂hi = ∂y_hi·c_hi − ∂y_lo·s_lo`, written over `∂y` likewise.
//!
//! One unit a `(lo, hi)` pair, so a unit reads and writes only its own two values. It keeps
//! the batch's tables (shared by every layer), nothing of the projection.
//!
//! # Shapes
//! - `x`: `[B, T, n·Dh]` f32 (rows anywhere in its buffer, the last axis unit-stride);
//!   `cos`, `sin`: `[B, 1, T, Dh]` f32, contiguous → `[B, T, n·Dh]`

use burn::backend::Cube;
use burn::tensor::Tensor as BurnTensor;
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn_backend::DType;
use burn_backend::tensor::FloatTensor;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::strided::{row_start, row_start_mut, unit_stride_rows};
use super::{count_launch, over_or_new};

/// Rotates every head of `x` when it is f32 on a cubecl device with tables of `B·T` rows of
/// `Dh` values; `x` back otherwise.
pub fn rope(
    x: BurnTensor<3>,
    cos: &BurnTensor<4>,
    sin: &BurnTensor<4>,
) -> Result<BurnTensor<3>, BurnTensor<3>> {
    let [b, t, width] = x.dims();
    let [tb, _, tt, dh] = cos.dims();
    let fits = x.dtype() == DType::F32 && dh % 2 == 0 && width % dh == 0 && [tb, tt] == [b, t];
    let tables = fits.then(|| Some((table(cos)?, table(sin)?))).flatten();
    let Some((cos, sin)) = tables else {
        return Err(x);
    };
    if let Ok(x) = x.clone().try_into_primitive::<Autodiff<Cube>>() {
        return Ok(BurnTensor::from_primitive::<Autodiff<Cube>>(tracked(
            x, cos, sin,
        )));
    }
    match x.clone().try_into_primitive::<Cube>() {
        Ok(x) => Ok(BurnTensor::from_primitive::<Cube>(turn(
            unit_stride_rows(x),
            cos,
            sin,
            false,
        ))),
        Err(_) => Err(x),
    }
}

/// A table's cubecl primitive, contiguous, from the plain or the autodiff device.
fn table(t: &BurnTensor<4>) -> Option<CubeTensor> {
    if t.dtype() != DType::F32 {
        return None;
    }
    let plain = t.clone().without_autodiff();
    plain.try_into_primitive::<Cube>().ok().map(into_contiguous)
}

/// One unit a pair: `x`'s row `row` holds `n` heads of `dh`; the pair `(lo, hi)` is
/// `(j, j + dh/2)` of a head. `backward` turns the other way (the transpose). With `in_place`,
/// `x` is not read (`y` holds the values).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn rope_pairs(
    x: &Tensor<f32>,
    cos: &Tensor<f32>,
    sin: &Tensor<f32>,
    y: &mut Tensor<f32>,
    pairs: usize,
    dh: usize,
    #[comptime] backward: bool,
    #[comptime] in_place: bool,
) {
    let at = ABSOLUTE_POS;
    if at < pairs {
        let half = dh / 2;
        let width = y.shape(2);
        let pairs_a_row = width / 2;
        let row = at / pairs_a_row;
        let in_row = at % pairs_a_row;
        let head = in_row / half;
        let j = in_row % half;
        let col = head * dh + j;
        let to = row_start_mut(y, row) + col;
        let (l, h) = if in_place {
            (y[to], y[to + half])
        } else {
            let from = row_start(x, row) + col;
            (x[from], x[from + half])
        };
        let table = row * dh;
        let (c_lo, c_hi) = (cos[table + j], cos[table + j + half]);
        let (s_lo, s_hi) = (sin[table + j], sin[table + j + half]);
        if backward {
            y[to] = l * c_lo + h * s_hi;
            y[to + half] = h * c_hi - l * s_lo;
        } else {
            y[to] = l * c_lo - h * s_lo;
            y[to + half] = h * c_hi + l * s_hi;
        }
    }
}

/// `x` turned by the tables (the transpose with `backward`), over its own buffer when nothing
/// else holds it.
fn turn(x: CubeTensor, cos: CubeTensor, sin: CubeTensor, backward: bool) -> CubeTensor {
    let x = unit_stride_rows(x);
    let shape = x.meta.shape().clone();
    let dh = cos.meta.shape()[3];
    let pairs = shape.num_elements() / 2;
    let client = x.client.clone();
    // In place the table stands in for `x`, which is `y` itself.
    let (x, y, in_place) = over_or_new(x, &cos);
    let (cube_count, cube_dim) = crate::kernels::one_thread_each(&client, pairs);
    // Safety: unit `at` < pairs reads the pair `(j, j + Dh/2)` of one head of one row of `x` (or
    // of `y` in place) and that row's table values at `j` and `j + Dh/2` (`B·T` rows of Dh),
    // and writes the same pair of `y` (x's shape, unit-stride along the width); in place, each
    // value is read and then written by its own unit only.
    unsafe {
        rope_pairs::launch_unchecked(
            &client,
            cube_count,
            cube_dim,
            x.into_tensor_arg(),
            cos.into_tensor_arg(),
            sin.into_tensor_arg(),
            y.clone().into_tensor_arg(),
            pairs,
            dh,
            backward,
            in_place,
        );
    }
    count_launch();
    y
}

#[derive(Debug)]
struct RopeBackward;

impl Backward<Cube, 1> for RopeBackward {
    /// The batch's tables (shared by every layer).
    type State = (CubeTensor, CubeTensor);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (cos, sin) = ops.state;
        unary::<Cube, _>(ops.parents, ops.node, grads, |grad| {
            turn(grad, cos, sin, true)
        });
    }
}

fn tracked(
    x: FloatTensor<Autodiff<Cube>>,
    cos: CubeTensor,
    sin: CubeTensor,
) -> FloatTensor<Autodiff<Cube>> {
    let prep = RopeBackward
        .prepare::<NoCheckpointing>([x.node()])
        .compute_bound()
        .stateful();
    let y = turn(x.into_primitive(), cos.clone(), sin.clone(), false);
    match prep {
        OpsKind::Tracked(prep) => prep.finish((cos, sin), y),
        OpsKind::UnTracked(prep) => prep.finish(y),
    }
}
