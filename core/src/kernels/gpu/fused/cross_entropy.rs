//! The causal-LM cross-entropy on the cubecl backends, the formula and the keeps of
//! `kernels/cpu/fused/cross_entropy.rs`: per row of the `[B·T, V]` logits, the log-sum-exp and the
//! label's logit, summed with the label weights.
//!
//! - forward, one launch (one cube of 64 units a row) and burn's sum: `Σ_rows w·(lse − x[label])`
//!   with `lse = m + ln Σ exp(x − m)`; keeps the logits, one `lse` per row and the labels
//!   (burn's log-softmax keeps a shifted copy of the logits and its row sums);
//! - backward, one launch: `∂x = ∂loss·w·(exp(x − lse) − onehot(label))`, 0 on the last
//!   position of each sequence (it predicts nothing) and on ignored ones, written over the kept
//!   logits when nothing else holds them.
//!
//! The labels come as two f32 tensors of `[B·(T − 1)]`: the class (exact in f32 below 2²⁴) and
//! its weight (1, or 0: ignored), the bytes burn's ops upload for them.
//!
//! # Shapes
//! - `logits`: `[B, T, V]` f32 (rows anywhere in the buffer, the last axis unit-stride) → `[1]`

use burn::backend::Cube;
use burn::tensor::Tensor as BurnTensor;
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn_backend::DType;
use burn_backend::ops::FloatTensorOps;
use burn_backend::tensor::FloatTensor;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::strided::{row_start, row_start_mut, unit_stride_rows};
use super::{count_launch, over_or_new};
use crate::kernels::gpu::reduce::{UNITS, halve_to_two};
use crate::memory::inner_marks;

/// The summed weighted NLL when the logits are f32 on a cubecl device and the labels
/// (`targets`, `weights`: `[B·(T − 1)]` f32, on the logits' device) fit them; the logits back
/// otherwise.
pub fn summed_nll(
    logits: BurnTensor<3>,
    targets: &BurnTensor<1>,
    weights: &BurnTensor<1>,
) -> Result<BurnTensor<1>, BurnTensor<3>> {
    let Some((targets, weights)) = cube_labels(&logits, targets, weights) else {
        return Err(logits);
    };
    if let Ok(x) = logits.clone().try_into_primitive::<Autodiff<Cube>>() {
        return Ok(BurnTensor::from_primitive::<Autodiff<Cube>>(tracked(
            x, targets, weights,
        )));
    }
    match logits.clone().try_into_primitive::<Cube>() {
        Ok(x) => {
            let (sum, _) = forward(unit_stride_rows(x), targets, weights);
            Ok(BurnTensor::from_primitive::<Cube>(sum))
        }
        Err(_) => Err(logits),
    }
}

/// `w·(−log p(label))` at every row of the `[B·T, V]` logits (0 on rows that predict nothing),
/// outside any graph, when the logits are f32 on a cubecl device and the labels fit them; the
/// logits back otherwise. The forward's launch without the sum: two `[B·T]` buffers, no
/// `[B, T, V]` one (burn's log-softmax writes two).
///
/// # Shapes
/// - `logits`: `[B, T, V]` → `[B·T]`, row `b·T + t` predicting label `b·(T − 1) + t`
pub fn row_nll(
    logits: BurnTensor<3>,
    targets: &BurnTensor<1>,
    weights: &BurnTensor<1>,
) -> Result<BurnTensor<1>, BurnTensor<3>> {
    let Some((targets, weights)) = cube_labels(&logits, targets, weights) else {
        return Err(logits);
    };
    match logits
        .clone()
        .without_autodiff()
        .try_into_primitive::<Cube>()
    {
        Ok(x) => {
            let (nll, _) = rows_forward(unit_stride_rows(x), targets, weights);
            Ok(BurnTensor::from_primitive::<Cube>(nll))
        }
        Err(_) => Err(logits),
    }
}

/// The labels as contiguous cubecl tensors, when the logits are f32 with T ≥ 2 and the labels
/// are f32 `[B·(T − 1)]` on a cubecl device; None otherwise (the caller gives the logits back).
fn cube_labels(
    logits: &BurnTensor<3>,
    targets: &BurnTensor<1>,
    weights: &BurnTensor<1>,
) -> Option<(CubeTensor, CubeTensor)> {
    let [b, t, _] = logits.dims();
    if logits.dtype() != DType::F32 || t < 2 {
        return None;
    }
    let rows = b * (t - 1);
    let label = |x: &BurnTensor<1>| {
        (x.dtype() == DType::F32 && x.dims() == [rows])
            .then(|| {
                x.clone()
                    .without_autodiff()
                    .try_into_primitive::<Cube>()
                    .ok()
            })
            .flatten()
            .map(into_contiguous)
    };
    Some((label(targets)?, label(weights)?))
}

/// Row `row`'s class and weight: row `b·T + t` reads label `b·(T − 1) + t`; the last position
/// of a sequence has weight 0.
#[cube]
fn label_of(targets: &Tensor<f32>, weights: &Tensor<f32>, row: usize, seq: usize) -> (usize, f32) {
    let t = row % seq;
    let mut class = 0usize;
    let mut weight = 0.0f32;
    if t + 1 < seq {
        let i = (row / seq) * (seq - 1) + t;
        class = usize::cast_from(targets[i]);
        weight = weights[i];
    }
    (class, weight)
}

/// One cube a row: the row's largest logit and the sum of exponentials (64 partials each,
/// halved in shared memory), then unit 0 writes the row's `lse` and weighted NLL.
#[cube(launch_unchecked)]
fn nll_forward(
    logits: &Tensor<f32>,
    targets: &Tensor<f32>,
    weights: &Tensor<f32>,
    lse: &mut Tensor<f32>,
    nll: &mut Tensor<f32>,
) {
    let unit = UNIT_POS_X as usize;
    let row = CUBE_POS_X as usize;
    let vocab = logits.shape(2);
    let at = row_start(logits, row);
    let mut largest = f32::new(-3.0e38); // below any logit; WGSL has no infinity literal
    let mut i = unit;
    while i < vocab {
        largest = max(largest, logits[at + i]);
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
    while i < vocab {
        sum += f32::exp(logits[at + i] - shift);
        i += UNITS;
    }
    partial[unit] = sum;
    sync_cube();
    halve_to_two(&mut partial, unit, false);
    sync_cube();
    if unit == 0 {
        let row_lse = shift + f32::ln(partial[0] + partial[1]);
        let (class, weight) = label_of(targets, weights, row, logits.shape(1));
        lse[row] = row_lse;
        nll[row] = weight * (row_lse - logits[at + class]);
    }
}

/// One unit a value: `∂x = s·exp(x − lse) − s·[v = class]` with `s = ∂loss·w` (0 on rows with
/// no label). With `in_place`, the logits are read from `dx` itself and `logits` is not read.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn nll_backward(
    logits: &Tensor<f32>,
    lse: &Tensor<f32>,
    targets: &Tensor<f32>,
    weights: &Tensor<f32>,
    grad: &Tensor<f32>,
    dx: &mut Tensor<f32>,
    values: usize,
    #[comptime] in_place: bool,
) {
    let at = ABSOLUTE_POS;
    if at < values {
        let (seq, vocab) = (dx.shape(1), dx.shape(2));
        let (row, v) = (at / vocab, at % vocab);
        let to = row_start_mut(dx, row) + v;
        let x = if in_place {
            dx[to]
        } else {
            logits[row_start(logits, row) + v]
        };
        let (class, weight) = label_of(targets, weights, row, seq);
        let scale = grad[0] * weight;
        let mut d = scale * f32::exp(x - lse[row]);
        if v == class {
            d -= scale;
        }
        dx[to] = d;
    }
}

/// The `[1]` sum and the `[B·T]` log-sum-exps.
fn forward(
    logits: CubeTensor,
    targets: CubeTensor,
    weights: CubeTensor,
) -> (CubeTensor, CubeTensor) {
    let (nll, lse) = rows_forward(logits, targets, weights);
    (Cube::float_sum(nll), lse)
}

/// The `[B·T]` weighted NLLs and log-sum-exps: one launch.
fn rows_forward(
    logits: CubeTensor,
    targets: CubeTensor,
    weights: CubeTensor,
) -> (CubeTensor, CubeTensor) {
    let shape = logits.meta.shape().clone();
    let rows = shape[0] * shape[1];
    let (client, device) = (logits.client.clone(), logits.device.clone());
    let new =
        || empty_device_contiguous_dtype(client.clone(), device.clone(), [rows].into(), DType::F32);
    let (lse, nll) = (new(), new());
    // Safety: cube `row` < B·T reads row `row` of the logits (V values, unit-stride) and, for
    // positions before the last, label `b·(T − 1) + t` < B·(T − 1); unit 0 writes `lse[row]`
    // and `nll[row]`; the class read is below V (the caller checked the labels).
    unsafe {
        nll_forward::launch_unchecked(
            &client,
            CubeCount::Static(rows as u32, 1, 1),
            CubeDim::new_1d(UNITS as u32),
            logits.into_tensor_arg(),
            targets.into_tensor_arg(),
            weights.into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            nll.clone().into_tensor_arg(),
        );
    }
    count_launch();
    (nll, lse)
}

fn backward(
    grad: CubeTensor,
    logits: CubeTensor,
    lse: CubeTensor,
    targets: CubeTensor,
    weights: CubeTensor,
) -> CubeTensor {
    let shape = logits.meta.shape().clone();
    let values = shape.num_elements();
    let client = logits.client.clone();
    let grad = into_contiguous(grad);
    // In place the row statistics stand in for the logits, which are `dx` itself.
    let (logits, dx, in_place) = over_or_new(logits, &lse);
    // A measurement reads the pool with the kept tensors and the result alive, as they are
    // while the kernel runs.
    let alive = inner_marks::armed().then(|| (lse.clone(), grad.clone()));
    let (cube_count, cube_dim) = crate::kernels::gpu::one_thread_each(&client, values);
    // Safety: unit `at` < B·T·V reads value `at` of the logits (or of `dx` in place), its
    // row's `lse`, label and the `[1]` gradient, and writes value `at` of `dx` (the logits'
    // shape); in place, each value is read and then written by its own unit only.
    unsafe {
        nll_backward::launch_unchecked(
            &client,
            cube_count,
            cube_dim,
            logits.into_tensor_arg(),
            lse.into_tensor_arg(),
            targets.into_tensor_arg(),
            weights.into_tensor_arg(),
            grad.into_tensor_arg(),
            dx.clone().into_tensor_arg(),
            values,
            in_place,
        );
    }
    count_launch();
    if alive.is_some() {
        inner_marks::mark();
    }
    dx
}

#[derive(Debug)]
struct NllBackward;

impl Backward<Cube, 1> for NllBackward {
    /// The logits (a handle on the head's output), the row log-sum-exps and the labels.
    type State = (CubeTensor, CubeTensor, CubeTensor, CubeTensor);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (logits, lse, targets, weights) = ops.state;
        unary::<Cube, _>(ops.parents, ops.node, grads, |grad| {
            backward(grad, logits, lse, targets, weights)
        });
    }
}

fn tracked(
    logits: FloatTensor<Autodiff<Cube>>,
    targets: CubeTensor,
    weights: CubeTensor,
) -> FloatTensor<Autodiff<Cube>> {
    let prep = NllBackward
        .prepare::<NoCheckpointing>([logits.node()])
        .compute_bound()
        .stateful();
    let x = unit_stride_rows(logits.into_primitive());
    let (sum, lse) = forward(x.clone(), targets.clone(), weights.clone());
    match prep {
        OpsKind::Tracked(prep) => prep.finish((x, lse, targets, weights), sum),
        OpsKind::UnTracked(prep) => prep.finish(sum),
    }
}
