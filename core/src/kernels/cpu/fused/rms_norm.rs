//! RMSNorm, `y = w ⊙ x · r` with `r = 1/√(mean(x²) + ε)` per row, in one pass.
//!
//! - forward: keeps `x` (by reference: the buffer is the residual stream's, shared) and one `r`
//!   per row (burn's ops keep `x`, three per-row statistics and, when `w` trains, `x·r`);
//! - backward, per row with `g = w ⊙ ∂y`: `∂x = r·g − x·r³·(g·x)/D`, written over `∂y`, and
//!   `∂w = Σ_rows ∂y ⊙ x·r` when the gain trains.

use burn::tensor::{Device, Tensor};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_backend::tensor::FloatTensor;
use burn_dispatch::{DispatchKindConversion, DispatchTensor};
use rayon::prelude::*;

use super::{
    CpuKernel, CpuValues, VALUES_PER_TASK, backend_tensor, host_values, is_f32, on_cpu,
    tracked_or_plain, with_values,
};

/// `w ⊙ x / √(mean(x²) + ε)` over the last axis as the fused kernel, differentiable, when
/// `x` and `gain` are f32 host values; otherwise the inputs back (`kernels::rms_norm` then
/// tries the GPU kernel, then burn's ops).
///
/// # Shapes
/// - `x`: `[B, T, D]`, `gain`: `[D]` → `[B, T, D]`
pub fn rms_norm(
    x: Tensor<3>,
    gain: Tensor<1>,
    eps: f64,
) -> Result<Tensor<3>, (Tensor<3>, Tensor<1>)> {
    if is_f32(&x) && is_f32(&gain) && x.dims()[2] == gain.dims()[0] {
        on_cpu(&RmsNorm { eps }, (x, gain))
    } else {
        Err((x, gain))
    }
}

/// The fused op on one CPU backend.
struct RmsNorm {
    eps: f64,
}

impl CpuKernel for RmsNorm {
    type Inputs = (Tensor<3>, Tensor<1>);
    type Output = Tensor<3>;

    fn on_backend<B: CpuValues>(&self, (x, gain): Self::Inputs) -> Result<Tensor<3>, Self::Inputs>
    where
        DispatchTensor: DispatchKindConversion<B> + DispatchKindConversion<Autodiff<B>>,
    {
        let (shape, eps, device) = (x.dims(), self.eps, x.device());
        tracked_or_plain::<B, _, _>(
            (x, gain),
            |(x, gain)| Tensor::from_primitive::<Autodiff<B>>(tracked::<B>(x, gain, shape, eps)),
            |(x, gain)| {
                let (w, _) = host_values::<B, 1>(gain);
                let (y, _) = with_values::<B, 3, _>(&x, |values| forward(values, &w, eps));
                Tensor::from_primitive::<B>(backend_tensor::<B, 3>(y, shape, &device))
            },
        )
    }
}

/// Rows per rayon task for rows of `dim` values.
fn rows_per_task(dim: usize) -> usize {
    (VALUES_PER_TASK / dim.max(1)).max(1)
}

/// `y = w ⊙ x · r` and each row's `r`.
pub fn forward(x: &[f32], gain: &[f32], eps: f64) -> (Vec<f32>, Vec<f32>) {
    let dim = gain.len();
    let rows = x.len() / dim;
    let mut y = vec![0.0f32; x.len()];
    let mut inv = vec![0.0f32; rows];
    let per_task = rows_per_task(dim);
    y.par_chunks_mut(per_task * dim)
        .zip(inv.par_chunks_mut(per_task))
        .zip(x.par_chunks(per_task * dim))
        .for_each(|((y, inv), x)| {
            for ((y, r), x) in y.chunks_mut(dim).zip(inv.iter_mut()).zip(x.chunks(dim)) {
                let mean_square = x.iter().map(|&v| v * v).sum::<f32>() / dim as f32;
                *r = 1.0 / (mean_square + eps as f32).sqrt();
                for ((y, &x), &w) in y.iter_mut().zip(x).zip(gain) {
                    *y = w * (x * *r);
                }
            }
        });
    (y, inv)
}

/// Overwrites `grad` (∂y) with ∂x; returns ∂w when `want_gain_grad`.
pub fn backward_in_place(
    grad: &mut [f32],
    x: &[f32],
    gain: &[f32],
    inv: &[f32],
    want_gain_grad: bool,
) -> Option<Vec<f32>> {
    let dim = gain.len();
    let per_task = rows_per_task(dim);
    let chunks = grad
        .par_chunks_mut(per_task * dim)
        .zip(x.par_chunks(per_task * dim))
        .zip(inv.par_chunks(per_task));
    let gain_grad = |mut acc: Vec<f32>, ((dy, x), inv): ((&mut [f32], &[f32]), &[f32])| {
        for ((dy, x), &r) in dy.chunks_mut(dim).zip(x.chunks(dim)).zip(inv) {
            if want_gain_grad {
                for ((a, &d), &v) in acc.iter_mut().zip(dy.iter()).zip(x) {
                    *a += d * v * r;
                }
            }
            let dot: f32 = dy
                .iter()
                .zip(x)
                .zip(gain)
                .map(|((&d, &v), &w)| w * d * v)
                .sum();
            let correction = r * r * r * dot / dim as f32;
            for ((d, &v), &w) in dy.iter_mut().zip(x).zip(gain) {
                *d = r * w * *d - v * correction;
            }
        }
        acc
    };
    let size = if want_gain_grad { dim } else { 0 };
    let summed = chunks.fold(|| vec![0.0f32; size], gain_grad).reduce(
        || vec![0.0f32; size],
        |mut a, b| {
            a.iter_mut().zip(b).for_each(|(a, b)| *a += b);
            a
        },
    );
    want_gain_grad.then_some(summed)
}

/// What the forward keeps: `x` (a handle on its buffer), the gain, each row's `r`, the shape
/// and the device.
type Saved<B> = (
    FloatTensor<B>,
    FloatTensor<B>,
    std::sync::Arc<Vec<f32>>,
    [usize; 3],
    Device,
);

#[derive(Debug)]
struct RmsNormBackward;

impl<B: CpuValues> Backward<B, 2> for RmsNormBackward
where
    DispatchTensor: DispatchKindConversion<B>,
{
    type State = Saved<B>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (x, gain, inv, shape, device) = ops.state;
        let (mut grad, _) = host_values::<B, 3>(grads.consume::<B>(&ops.node));
        let (gain, _) = host_values::<B, 1>(gain);
        let [parent_x, parent_gain] = ops.parents;
        let gain_grad = with_values::<B, 3, _>(&x, |x| {
            backward_in_place(&mut grad, x, &gain, &inv, parent_gain.is_some())
        });
        drop(x);
        if let (Some(node), Some(gain_grad)) = (parent_gain, gain_grad) {
            let dim = gain.len();
            grads.register::<B>(node.id, backend_tensor::<B, 1>(gain_grad, [dim], &device));
        }
        if let Some(node) = parent_x {
            grads.register::<B>(node.id, backend_tensor::<B, 3>(grad, shape, &device));
        }
    }
}

fn tracked<B: CpuValues>(
    x: FloatTensor<Autodiff<B>>,
    gain: FloatTensor<Autodiff<B>>,
    shape: [usize; 3],
    eps: f64,
) -> FloatTensor<Autodiff<B>>
where
    DispatchTensor: DispatchKindConversion<B>,
{
    let prep = RmsNormBackward
        .prepare::<NoCheckpointing>([x.node(), gain.node()])
        .compute_bound()
        .stateful();
    let (x, gain) = (x.into_primitive(), gain.into_primitive());
    let device = Tensor::<3>::from_primitive::<B>(x.clone()).device();
    let (w, _) = host_values::<B, 1>(gain.clone());
    let (y, inv) = with_values::<B, 3, _>(&x, |values| forward(values, &w, eps));
    let y = backend_tensor::<B, 3>(y, shape, &device);
    match prep {
        OpsKind::Tracked(prep) => {
            prep.finish((x, gain, std::sync::Arc::new(inv), shape, device), y)
        }
        OpsKind::UnTracked(prep) => prep.finish(y),
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Distribution, Tensor};

    use crate::device::DeviceKind;
    use crate::kernels::rms_norm;
    use crate::kernels::values::max_abs_diff;

    const EPS: f64 = 1e-5;

    /// burn's ops, as `RmsNorm` ran them before the fused op.
    fn reference(x: Tensor<3>, gain: Tensor<1>) -> Tensor<3> {
        let inv = (x.clone().square().mean_dim(2) + EPS).sqrt().recip();
        gain.unsqueeze::<3>() * (x * inv)
    }

    /// Values and the gradients of `x` and the gain match burn's ops on every CPU backend,
    /// with a trainable and with a frozen gain.
    #[test]
    fn values_and_gradients_match_burns_ops() {
        for kind in DeviceKind::cpu_backends() {
            let device = kind.open().unwrap().autodiff();
            let shape = [2, 37, 96];
            let x0 = Tensor::<3>::random(shape, Distribution::Normal(0.5, 2.0), &device);
            let w0 = Tensor::<1>::random([96], Distribution::Normal(1.0, 0.3), &device);
            let up = Tensor::<3>::random(shape, Distribution::Normal(0.0, 1.0), &device);
            for gain_trains in [true, false] {
                let run = |fused: bool| {
                    let x = x0.clone().require_grad();
                    let w = if gain_trains {
                        w0.clone().require_grad()
                    } else {
                        w0.clone()
                    };
                    let y = if fused {
                        rms_norm(x.clone(), w.clone(), EPS)
                    } else {
                        reference(x.clone(), w.clone())
                    };
                    let grads = (y.clone() * up.clone()).sum().backward();
                    (y.inner(), x.grad(&grads).unwrap(), w.grad(&grads))
                };
                let (y, dx, dw) = run(true);
                let (y_ref, dx_ref, dw_ref) = run(false);
                assert!(max_abs_diff(y, y_ref) < 1e-5, "{kind}: values");
                let diff = max_abs_diff(dx, dx_ref);
                assert!(diff < 1e-5, "{kind}: ∂x off by {diff}");
                match (dw, dw_ref) {
                    (Some(dw), Some(dw_ref)) => {
                        let diff = max_abs_diff(dw, dw_ref);
                        assert!(diff < 1e-3, "{kind}: ∂w off by {diff}");
                    }
                    (None, None) => assert!(!gain_trains),
                    _ => panic!("{kind}: the gain's gradient exists on one side only"),
                }
            }
        }
    }

    /// Without a graph the fused forward gives the same values.
    #[test]
    fn forward_without_a_graph_matches() {
        for kind in DeviceKind::cpu_backends() {
            let device = kind.open().unwrap();
            let x = Tensor::<3>::random([1, 5, 576], Distribution::Normal(0.0, 3.0), &device);
            let w = Tensor::<1>::random([576], Distribution::Normal(1.0, 0.2), &device);
            let expected = reference(x.clone(), w.clone());
            assert!(max_abs_diff(rms_norm(x, w, EPS), expected) < 1e-5, "{kind}");
        }
    }
}
