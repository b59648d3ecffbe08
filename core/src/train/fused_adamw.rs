//! AdamW's update of one parameter as one pass over its values, for the CPU backends.
//!
//! As burn tensor ops ([`super::adamw::update_with_tensor_ops`]) the update is about ten
//! single-threaded passes, each allocating a fresh `[numel]` buffer: profiled on a SmolLM2 full
//! fine-tuning step (135 M values), it took ~30 % of the step while the second core idled.
//! Here every value is read once and written once, in place (the parameter, m and v are
//! taken over without a copy when nothing else holds them), split over rayon's threads.
//!
//! Per value, in the order and precision (f32) of the tensor-op version:
//! `m ← m + (1−β1)(g − m); v ← β2·v + (1−β2)·g²; p ← p·decay − step_size · m / (√v / √(1−β2ᵗ) + ε)`.

use burn::tensor::Tensor;
use burn_autodiff::Autodiff;
use burn_dispatch::{DispatchKindConversion, DispatchTensor};
use rayon::prelude::*;

use super::adamw::{Moments, StepScalars};
use crate::kernels::cpu::fused::{
    CpuKernel, CpuValues, VALUES_PER_TASK, backend_tensor, host_values, is_f32, on_cpu, with_values,
};

/// What [`update`] hands back when it does not apply: the parameter, its gradient and state.
pub(crate) type NotFused = (Tensor<1>, Tensor<1>, Option<Moments>);

/// The updated parameter and moments, when every tensor is f32 on one CPU backend; the inputs
/// back otherwise (the caller runs the tensor ops).
///
/// # Shapes
/// - `p`, `g`, the moments: `[numel]`
pub(crate) fn update(
    p: Tensor<1>,
    g: Tensor<1>,
    state: Option<Moments>,
    s: &StepScalars,
) -> Result<(Tensor<1>, Moments), NotFused> {
    let all_f32 = is_f32(&p)
        && is_f32(&g)
        && state
            .as_ref()
            .is_none_or(|m| is_f32(&m.exp_avg) && is_f32(&m.exp_avg_sq));
    if !all_f32 {
        return Err((p, g, state));
    }
    on_cpu(&FusedAdamW { s }, (p, g, state))
}

/// The update on one CPU backend.
struct FusedAdamW<'a> {
    s: &'a StepScalars,
}

impl CpuKernel for FusedAdamW<'_> {
    type Inputs = NotFused;
    type Output = (Tensor<1>, Moments);

    fn on_backend<B: CpuValues>(
        &self,
        (p, g, state): NotFused,
    ) -> Result<(Tensor<1>, Moments), NotFused>
    where
        DispatchTensor: DispatchKindConversion<B> + DispatchKindConversion<Autodiff<B>>,
    {
        let s = self.s;
        let n = p.dims()[0];
        let (Ok(param), Ok(grad)) = (
            p.clone().try_into_primitive::<B>(),
            g.clone().try_into_primitive::<B>(),
        ) else {
            return Err((p, g, state));
        };
        let moments = match &state {
            None => None,
            Some(m) => match (
                m.exp_avg.clone().try_into_primitive::<B>(),
                m.exp_avg_sq.clone().try_into_primitive::<B>(),
            ) {
                (Ok(exp_avg), Ok(exp_avg_sq)) => Some((exp_avg, exp_avg_sq)),
                _ => return Err((p, g, state)),
            },
        };
        // The originals go first, so the parameter and moments are taken over without a copy.
        drop((p, state));
        let (mut param, device) = host_values::<B, 1>(param);
        let (mut exp_avg, mut exp_avg_sq) = match moments {
            Some((m, v)) => (host_values::<B, 1>(m).0, host_values::<B, 1>(v).0),
            None => (zeros(n), zeros(n)),
        };
        with_values::<B, 1, _>(&grad, |grad| {
            step(&mut param, grad, &mut exp_avg, &mut exp_avg_sq, s)
        });
        let tensor = |values: Vec<f32>| {
            Tensor::from_primitive::<B>(backend_tensor::<B, 1>(values, [n], &device))
        };
        Ok((
            tensor(param),
            Moments {
                exp_avg: tensor(exp_avg),
                exp_avg_sq: tensor(exp_avg_sq),
            },
        ))
    }
}

/// `n` zeros, written rather than `calloc`ed: fresh zero pages from the kernel are mapped to
/// one shared read-only page, so the update's read-then-write would take a copy-on-write fault
/// and a TLB shoot-down per page (profiled: the first step of a full fine-tuning run spent
/// about a quarter of its time there).
fn zeros(n: usize) -> Vec<f32> {
    let mut values = Vec::new();
    (0..n)
        .into_par_iter()
        .map(|_| 0.0f32)
        .collect_into_vec(&mut values);
    values
}

/// The update over slices of one length, in place, in parallel blocks.
fn step(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], s: &StepScalars) {
    let decay = s.decay as f32;
    let one_minus_beta1 = s.one_minus_beta1 as f32;
    let (beta2, one_minus_beta2) = (s.beta2 as f32, s.one_minus_beta2 as f32);
    let step_size = s.step_size as f32;
    let bias_correction2_sqrt = s.bias_correction2_sqrt as f32;
    let eps = s.eps as f32;
    // As `g * factor` on the tensor: the f32 product (exact when the factor is 1).
    let grad_factor = s.grad_factor as f32;
    p.par_chunks_mut(VALUES_PER_TASK)
        .zip(m.par_chunks_mut(VALUES_PER_TASK))
        .zip(v.par_chunks_mut(VALUES_PER_TASK))
        .zip(g.par_chunks(VALUES_PER_TASK))
        .for_each(|(((p, m), v), g)| {
            for (((p, m), v), &g) in p.iter_mut().zip(m).zip(v).zip(g) {
                let g = g * grad_factor;
                *m += (g - *m) * one_minus_beta1;
                *v = *v * beta2 + g * g * one_minus_beta2;
                let denom = v.sqrt() / bias_correction2_sqrt + eps;
                *p = *p * decay - *m / denom * step_size;
            }
        });
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, Tensor, TensorData};

    use super::super::adamw::{Moments, StepScalars, update_with_tensor_ops};
    use super::update;
    use crate::device::DeviceKind;
    use crate::kernels::values::to_f32_vec;

    /// Step `t`'s scalars; the second step's gradient is clipped (taken at 0.37 of itself).
    fn scalars(t: i32) -> StepScalars {
        let (lr, b1, b2, wd) = (3e-3, 0.9f64, 0.999f64, 0.01);
        StepScalars {
            decay: 1.0 - lr * wd,
            one_minus_beta1: 1.0 - b1,
            beta2: b2,
            one_minus_beta2: 1.0 - b2,
            step_size: lr / (1.0 - b1.powi(t)),
            bias_correction2_sqrt: (1.0 - b2.powi(t)).sqrt(),
            eps: 1e-8,
            grad_factor: if t == 2 { 0.37 } else { 1.0 },
        }
    }

    /// Values spread over several rayon blocks, with signs and magnitudes from 1e-4 to 10.
    fn values(n: usize, seed: u32, device: &Device) -> Tensor<1> {
        let v: Vec<f32> = (0..n as u32)
            .map(|i| {
                let x = ((i.wrapping_mul(2_654_435_761) ^ seed) % 20_001) as f32 / 10_000.0 - 1.0;
                x * 10f32.powi((i % 6) as i32 - 4)
            })
            .collect();
        Tensor::from_data(TensorData::new(v, [n]), device)
    }

    fn assert_close(what: &str, fused: &Tensor<1>, ops: &Tensor<1>) {
        let (a, b) = (to_f32_vec(fused.clone()), to_f32_vec(ops.clone()));
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert!(
                (x - y).abs() <= 1e-6 * y.abs().max(1e-3),
                "{what}[{i}]: fused {x}, tensor ops {y}"
            );
        }
    }

    /// Two steps (fresh moments, then carried ones, the second with a clipping factor) give
    /// what burn's tensor ops give, on every CPU backend compiled in.
    #[test]
    fn fused_update_matches_the_tensor_ops() {
        for kind in DeviceKind::cpu_backends() {
            let device = kind.open().expect("a CPU backend opens");
            let n = 3 * super::VALUES_PER_TASK + 17;
            let p0 = values(n, 1, &device);
            let mut fused = (p0.clone(), None::<Moments>);
            let mut ops = (p0, None::<Moments>);
            for t in 1..=2 {
                let g = values(n, 7 + t as u32, &device);
                let s = scalars(t);
                let (p, m) = update(fused.0, g.clone(), fused.1, &s)
                    .unwrap_or_else(|_| panic!("{kind}: the fused update did not apply"));
                fused = (p, Some(m));
                let (p, m) = update_with_tensor_ops(ops.0, g, ops.1, &s);
                ops = (p, Some(m));
            }
            let (fm, om) = (fused.1.expect("state"), ops.1.expect("state"));
            assert_close("p", &fused.0, &ops.0);
            assert_close("m", &fm.exp_avg, &om.exp_avg);
            assert_close("v", &fm.exp_avg_sq, &om.exp_avg_sq);
        }
    }
}
