//! Rotary position embedding of a whole projection on the cubecl backends, split into heads in
//! the same launch: the formula and the keeps of `kernels/cpu/fused/rope.rs`, the layout attention
//! multiplies in. Per head, with `lo = x[..Dh/2]`, `hi = x[Dh/2..]` and the table values `c`,
//! `s` of the position,
//!
//! - forward, one launch: `y_lo = lo·c_lo − hi·s_lo`, `y_hi = hi·c_hi + lo·s_hi`, read from the
//!   projection's rows and written as heads `[B, n, T, Dh]` (burn's ops cut, negate,
//!   concatenate, multiply and add, and the split into heads copies once more before a product
//!   can read it);
//! - backward, one launch, the transposed rotation: `∂lo = ∂y_lo·c_lo + ∂y_hi·s_hi`,
//!   `∂hi = ∂y_hi·c_hi − ∂y_lo·s_lo`, read from the heads (any strides: a product's gradient
//!   arrives reshaped) and written as the projection's rows.
//!
//! One unit a `(lo, hi)` pair, so a unit reads and writes only its own two values. It keeps
//! the batch's tables (shared by every layer), nothing of the projection.
//!
//! The heads can be written in 16 bits (the attention under autocast, `model/attention.rs`):
//! the rotation is f32 arithmetic, its output rounded once, and the backward reads a 16-bit
//! gradient and writes the projection's f32 one, so no cast runs either way.
//!
//! # Shapes
//! - `x`: `[B, T, n·Dh]` f32 (rows anywhere in its buffer, the last axis unit-stride);
//!   `cos`, `sin`: `[B, 1, T, Dh]` f32, contiguous → `[B, n, T, Dh]` f32, f16 or bf16

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
use burn_cubecl::kernel::{into_contiguous, untile};
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::count_launch;
use super::strided::{row_start, row_start_mut, unit_stride_rows};

/// Rotates every head of `x` and splits it into `heads` heads of dtype `out` (f32, f16 or
/// bf16) when `x` is f32 on a cubecl device with tables of `B·T` rows of `Dh` values; `x`
/// back otherwise.
pub fn rope_heads(
    x: BurnTensor<3>,
    cos: &BurnTensor<4>,
    sin: &BurnTensor<4>,
    heads: usize,
    out: DType,
) -> Result<BurnTensor<4>, BurnTensor<3>> {
    let [b, t, width] = x.dims();
    let [tb, _, tt, dh] = cos.dims();
    let fits = x.dtype() == DType::F32
        && matches!(out, DType::F32 | DType::F16 | DType::BF16)
        && dh % 2 == 0
        && heads * dh == width
        && [tb, tt] == [b, t];
    let tables = fits.then(|| Some((table(cos)?, table(sin)?))).flatten();
    let Some((cos, sin)) = tables else {
        return Err(x);
    };
    if let Ok(x) = x.clone().try_into_primitive::<Autodiff<Cube>>() {
        return Ok(BurnTensor::from_primitive::<Autodiff<Cube>>(tracked(
            x, cos, sin, heads, out,
        )));
    }
    match x.clone().try_into_primitive::<Cube>() {
        Ok(x) => Ok(BurnTensor::from_primitive::<Cube>(into_heads(
            x, &cos, &sin, heads, out,
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

/// Where value `j` of head `head` of row `row = b·T + t` of a heads tensor `[B, n, T, Dh]` is,
/// whatever its strides.
#[cube]
fn head_at<F: Float>(y: &Tensor<F>, row: usize, head: usize, j: usize) -> usize {
    let t = y.shape(2);
    (row / t) * y.stride(0) + head * y.stride(1) + (row % t) * y.stride(2) + j * y.stride(3)
}

/// [`head_at`] of a heads tensor the kernel writes.
#[cube]
fn head_at_mut<F: Float>(y: &mut Tensor<F>, row: usize, head: usize, j: usize) -> usize {
    let t = y.shape(2);
    (row / t) * y.stride(0) + head * y.stride(1) + (row % t) * y.stride(2) + j * y.stride(3)
}

/// The forward, one unit a pair: the pair `(j, j + Dh/2)` of head `head` of `x`'s row `row`,
/// rotated, into the heads tensor `y` (f32 arithmetic, written as `F`).
#[cube(launch_unchecked)]
fn rope_into_heads<F: Float>(
    x: &Tensor<f32>,
    cos: &Tensor<f32>,
    sin: &Tensor<f32>,
    y: &mut Tensor<F>,
    pairs: usize,
    dh: usize,
    #[define(F)] _dtype: ElemType,
) {
    let at = ABSOLUTE_POS;
    if at < pairs {
        let half = dh / 2;
        let pairs_a_row = y.shape(1) * half;
        let row = at / pairs_a_row;
        let head = (at % pairs_a_row) / half;
        let j = (at % pairs_a_row) % half;
        let from = row_start(x, row) + head * dh + j;
        let (l, h) = (x[from], x[from + half]);
        let table = row * dh;
        let (c_lo, c_hi) = (cos[table + j], cos[table + j + half]);
        let (s_lo, s_hi) = (sin[table + j], sin[table + j + half]);
        let lo = head_at_mut(y, row, head, j);
        let hi = head_at_mut(y, row, head, j + half);
        y[lo] = F::cast_from(l * c_lo - h * s_lo);
        y[hi] = F::cast_from(h * c_hi + l * s_hi);
    }
}

/// The backward, one unit a pair: the pair of the heads gradient `g`, turned back, into the
/// projection's rows `dx` (read as `G`, f32 arithmetic and output).
#[cube(launch_unchecked)]
fn rope_from_heads<G: Float>(
    g: &Tensor<G>,
    cos: &Tensor<f32>,
    sin: &Tensor<f32>,
    dx: &mut Tensor<f32>,
    pairs: usize,
    dh: usize,
    #[define(G)] _dtype: ElemType,
) {
    let at = ABSOLUTE_POS;
    if at < pairs {
        let half = dh / 2;
        let pairs_a_row = g.shape(1) * half;
        let row = at / pairs_a_row;
        let head = (at % pairs_a_row) / half;
        let j = (at % pairs_a_row) % half;
        let (l, h) = (
            f32::cast_from(g[head_at(g, row, head, j)]),
            f32::cast_from(g[head_at(g, row, head, j + half)]),
        );
        let table = row * dh;
        let (c_lo, c_hi) = (cos[table + j], cos[table + j + half]);
        let (s_lo, s_hi) = (sin[table + j], sin[table + j + half]);
        let to = row_start_mut(dx, row) + head * dh + j;
        dx[to] = l * c_lo + h * s_hi;
        dx[to + half] = h * c_hi - l * s_lo;
    }
}

/// `x` `[B, T, n·Dh]` rotated into `heads` heads `[B, n, T, Dh]` of dtype `out` (a new
/// buffer).
fn into_heads(
    x: CubeTensor,
    cos: &CubeTensor,
    sin: &CubeTensor,
    heads: usize,
    out: DType,
) -> CubeTensor {
    let x = unit_stride_rows(x);
    let [b, t, width] = x.meta.shape().dims::<3>();
    let dh = width / heads;
    let pairs = b * t * width / 2;
    let client = x.client.clone();
    let y = empty_device_dtype(
        client.clone(),
        x.device.clone(),
        [b, heads, t, dh].into(),
        out,
    );
    let (cube_count, cube_dim) = crate::kernels::gpu::one_thread_each(&client, pairs);
    // Safety: unit `at` < pairs reads the pair `(j, j + Dh/2)` of one head of one row of `x`
    // (unit-stride along the width) and that row's table values at `j` and `j + Dh/2` (`B·T`
    // rows of Dh), and writes the same pair of that head and position of `y` (`[B, n, T, Dh]`,
    // its own strides): every value of `y` by exactly one unit.
    unsafe {
        rope_into_heads::launch_unchecked(
            &client,
            cube_count,
            cube_dim,
            x.into_tensor_arg(),
            cos.clone().into_tensor_arg(),
            sin.clone().into_tensor_arg(),
            y.clone().into_tensor_arg(),
            pairs,
            dh,
            dtype_to_storage_type(out),
        );
    }
    count_launch();
    y
}

/// The heads gradient `g` `[B, n, T, Dh]` turned back into the projection's rows
/// `[B, T, n·Dh]` (a new buffer).
fn from_heads(g: CubeTensor, cos: &CubeTensor, sin: &CubeTensor) -> CubeTensor {
    let g = untile(g);
    let [b, heads, t, dh] = g.meta.shape().dims::<4>();
    let pairs = b * heads * t * dh / 2;
    let client = g.client.clone();
    let read = dtype_to_storage_type(g.dtype);
    let dx = empty_device_dtype(
        client.clone(),
        g.device.clone(),
        [b, t, heads * dh].into(),
        DType::F32,
    );
    let (cube_count, cube_dim) = crate::kernels::gpu::one_thread_each(&client, pairs);
    // Safety: unit `at` < pairs reads one pair of one head and position of `g` (through its
    // strides) and the position's table values, and writes that pair of the row of `dx`
    // (`[B, T, n·Dh]`, unit-stride along the width): every value of `dx` by exactly one unit.
    unsafe {
        rope_from_heads::launch_unchecked(
            &client,
            cube_count,
            cube_dim,
            g.into_tensor_arg(),
            cos.clone().into_tensor_arg(),
            sin.clone().into_tensor_arg(),
            dx.clone().into_tensor_arg(),
            pairs,
            dh,
            read,
        );
    }
    count_launch();
    dx
}

#[derive(Debug)]
struct RopeBackward;

impl Backward<Cube, 1> for RopeBackward {
    /// The batch's tables (shared by every layer).
    type State = (CubeTensor, CubeTensor);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (cos, sin) = ops.state;
        unary::<Cube, _>(ops.parents, ops.node, grads, |grad| {
            from_heads(grad, &cos, &sin)
        });
    }
}

fn tracked(
    x: FloatTensor<Autodiff<Cube>>,
    cos: CubeTensor,
    sin: CubeTensor,
    heads: usize,
    out: DType,
) -> FloatTensor<Autodiff<Cube>> {
    let prep = RopeBackward
        .prepare::<NoCheckpointing>([x.node()])
        .compute_bound()
        .stateful();
    let y = into_heads(x.into_primitive(), &cos, &sin, heads, out);
    match prep {
        OpsKind::Tracked(prep) => prep.finish((cos, sin), y),
        OpsKind::UnTracked(prep) => prep.finish(y),
    }
}
