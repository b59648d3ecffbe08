//! SwiGLU's gating, `h = silu(g) ⊙ u = g·σ(g)·u`, in one pass.
//!
//! - forward: `h = g·σ(g)·u`; keeps `g` and `u` (burn's ops keep `g`, `σ(g)`, `silu(g)` and
//!   `u`, and `silu(g)·u` is a separate op);
//! - backward, with `s = σ(g)` recomputed: `∂g = ∂h·u·s·(1 + g·(1 − s))`, `∂u = ∂h·g·s`,
//!   written over the kept `g` and `u`.

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

use super::{
    CpuKernel, CpuValues, VALUES_PER_TASK, backend_tensor, fast_exp, host_values, is_f32, on_cpu,
    owned, tracked_or_plain,
};

/// `silu(gate) ⊙ up` as the fused kernel, differentiable, when both are f32 host values of
/// one shape; otherwise the inputs back (`kernels::swiglu` then tries the GPU kernel, then
/// burn's ops).
///
/// # Shapes
/// - `gate`, `up`: `[B, T, F]` → `[B, T, F]`
pub fn swiglu(gate: Tensor<3>, up: Tensor<3>) -> Result<Tensor<3>, (Tensor<3>, Tensor<3>)> {
    if is_f32(&gate) && is_f32(&up) && gate.dims() == up.dims() {
        on_cpu(&Swiglu, (gate, up))
    } else {
        Err((gate, up))
    }
}

/// The fused op on one CPU backend.
struct Swiglu;

impl CpuKernel for Swiglu {
    type Inputs = (Tensor<3>, Tensor<3>);
    type Output = Tensor<3>;

    fn on_backend<B: CpuValues>(&self, (gate, up): Self::Inputs) -> Result<Tensor<3>, Self::Inputs>
    where
        DispatchTensor: DispatchKindConversion<B> + DispatchKindConversion<Autodiff<B>>,
    {
        let shape = gate.dims();
        tracked_or_plain::<B, _, _>(
            (gate, up),
            |(g, u)| Tensor::from_primitive::<Autodiff<B>>(tracked::<B>(g, u, shape)),
            |(g, u)| {
                let (g, device) = host_values::<B, 3>(g);
                let (u, _) = host_values::<B, 3>(u);
                let h = forward(&g, &u);
                Tensor::from_primitive::<B>(backend_tensor::<B, 3>(h, shape, &device))
            },
        )
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + fast_exp(-x))
}

/// `h = g·σ(g)·u`, element by element.
pub fn forward(gate: &[f32], up: &[f32]) -> Vec<f32> {
    let mut h = vec![0.0f32; gate.len()];
    h.par_chunks_mut(VALUES_PER_TASK)
        .zip(gate.par_chunks(VALUES_PER_TASK))
        .zip(up.par_chunks(VALUES_PER_TASK))
        .for_each(|((h, g), u)| {
            for ((h, &g), &u) in h.iter_mut().zip(g).zip(u) {
                *h = g * sigmoid(g) * u;
            }
        });
    h
}

/// Overwrites `gate` with `∂g` and `up` with `∂u`, given `∂h`.
pub fn backward_in_place(gate: &mut [f32], up: &mut [f32], grad_h: &[f32]) {
    gate.par_chunks_mut(VALUES_PER_TASK)
        .zip(up.par_chunks_mut(VALUES_PER_TASK))
        .zip(grad_h.par_chunks(VALUES_PER_TASK))
        .for_each(|((g, u), dh)| {
            for ((g, u), &dh) in g.iter_mut().zip(u.iter_mut()).zip(dh) {
                let (x, y) = (*g, *u);
                let s = sigmoid(x);
                *g = dh * y * s * (1.0 + x * (1.0 - s));
                *u = dh * x * s;
            }
        });
}

/// What the forward keeps: `g`, `u` (host values), the shape and the device.
type Saved = (Arc<Vec<f32>>, Arc<Vec<f32>>, [usize; 3], Device);

#[derive(Debug)]
struct SwigluBackward;

impl<B: CpuValues> Backward<B, 2> for SwigluBackward
where
    DispatchTensor: DispatchKindConversion<B>,
{
    type State = Saved;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (gate, up, shape, device) = ops.state;
        let (grad_h, _) = host_values::<B, 3>(grads.consume::<B>(&ops.node));
        let (mut gate, mut up) = (owned(gate), owned(up));
        backward_in_place(&mut gate, &mut up, &grad_h);
        drop(grad_h);
        let [parent_gate, parent_up] = ops.parents;
        for (parent, grad) in [(parent_gate, gate), (parent_up, up)] {
            if let Some(node) = parent {
                grads.register::<B>(node.id, backend_tensor::<B, 3>(grad, shape, &device));
            }
        }
    }
}

fn tracked<B: CpuValues>(
    gate: FloatTensor<Autodiff<B>>,
    up: FloatTensor<Autodiff<B>>,
    shape: [usize; 3],
) -> FloatTensor<Autodiff<B>>
where
    DispatchTensor: DispatchKindConversion<B>,
{
    let prep = SwigluBackward
        .prepare::<NoCheckpointing>([gate.node(), up.node()])
        .compute_bound()
        .stateful();
    let (g, device) = host_values::<B, 3>(gate.into_primitive());
    let (u, _) = host_values::<B, 3>(up.into_primitive());
    let h = backend_tensor::<B, 3>(forward(&g, &u), shape, &device);
    match prep {
        OpsKind::Tracked(prep) => prep.finish((Arc::new(g), Arc::new(u), shape, device), h),
        OpsKind::UnTracked(prep) => prep.finish(h),
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Distribution, Tensor, activation::silu};

    use crate::device::DeviceKind;
    use crate::kernels::swiglu;
    use crate::kernels::values::max_abs_diff;

    /// Values and both gradients match burn's `silu(g)·u` on every CPU backend, under a
    /// non-uniform upstream gradient, for gates from −12 to 12 (σ saturating both ways).
    #[test]
    fn values_and_gradients_match_burns_ops() {
        for kind in DeviceKind::cpu_backends() {
            let device = kind.open().unwrap().autodiff();
            let shape = [2, 3, 5000];
            let g0 = Tensor::<3>::random(shape, Distribution::Uniform(-12.0, 12.0), &device);
            let u0 = Tensor::<3>::random(shape, Distribution::Normal(0.0, 1.0), &device);
            let w = Tensor::<3>::random(shape, Distribution::Normal(0.0, 1.0), &device);
            let run = |fused: bool| {
                let (g, u) = (g0.clone().require_grad(), u0.clone().require_grad());
                let h = if fused {
                    swiglu(g.clone(), u.clone())
                } else {
                    silu(g.clone()) * u.clone()
                };
                let grads = (h.clone() * w.clone()).sum().backward();
                (h.inner(), g.grad(&grads).unwrap(), u.grad(&grads).unwrap())
            };
            let (h, dg, du) = run(true);
            let (h_ref, dg_ref, du_ref) = run(false);
            assert!(max_abs_diff(h, h_ref) < 1e-4, "{kind}: values");
            assert!(max_abs_diff(dg, dg_ref) < 1e-4, "{kind}: ∂gate");
            assert!(max_abs_diff(du, du_ref) < 1e-4, "{kind}: ∂up");
        }
    }

    /// Without a graph the fused forward gives the same values.
    #[test]
    fn forward_without_a_graph_matches() {
        for kind in DeviceKind::cpu_backends() {
            let device = kind.open().unwrap();
            let g = Tensor::<3>::random([1, 7, 300], Distribution::Normal(0.0, 3.0), &device);
            let u = Tensor::<3>::random([1, 7, 300], Distribution::Normal(0.0, 1.0), &device);
            let reference = silu(g.clone()) * u.clone();
            assert!(max_abs_diff(swiglu(g, u), reference) < 1e-5, "{kind}");
        }
    }
}
