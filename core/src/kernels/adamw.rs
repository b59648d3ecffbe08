//! AdamW's update of one parameter as one cubecl kernel, for the GPU backends.
//!
//! As burn tensor ops ([`crate::train::adamw`]'s `update_with_tensor_ops`) the update is about
//! thirteen kernels per parameter — burn's cubecl backend launches one per op — and on a GPU
//! each launch costs host time whatever its size: measured on an H200 (wgpu/Vulkan), SmolLM2's
//! 420 LoRA tensors took 0.75–0.80 s of AdamW per step, ~150 µs a launch. Here one launch
//! reads `p, g, m, v` once and writes the new three.
//!
//! Per value, in the order and precision (f32) of the tensor-op version:
//! `m ← m + (1−β1)(g − m); v ← β2·v + (1−β2)·g²; p ← p·decay − (m / (√v / √(1−β2ᵗ) + ε))·step_size`.
//! Each intermediate is stored in a variable of its own, as the tensor ops store each in a
//! buffer; a GPU compiler may still contract a product and a sum into one fused multiply-add,
//! so values can differ from the CPU's in the last bit (the test bounds the difference).

use std::sync::atomic::{AtomicU64, Ordering};

use burn_backend::DType;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

/// The scalars of one step (see `train::adamw::StepScalars`), in f32.
#[derive(Debug, Clone, Copy)]
pub struct AdamWScalars {
    /// `1 − lr·wd`.
    pub decay: f32,
    /// `1 − β1`.
    pub one_minus_beta1: f32,
    /// β2.
    pub beta2: f32,
    /// `1 − β2`.
    pub one_minus_beta2: f32,
    /// `lr / (1 − β1ᵗ)`.
    pub step_size: f32,
    /// `√(1 − β2ᵗ)`.
    pub bias_correction2_sqrt: f32,
    /// ε.
    pub eps: f32,
}

/// One thread per value. With `first`, the moments are zero and `m`, `v` are not read.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn adamw_values(
    p: &Tensor<f32>,
    g: &Tensor<f32>,
    m: &Tensor<f32>,
    v: &Tensor<f32>,
    p_out: &mut Tensor<f32>,
    m_out: &mut Tensor<f32>,
    v_out: &mut Tensor<f32>,
    decay: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    step_size: f32,
    bias_correction2_sqrt: f32,
    eps: f32,
    #[comptime] first: bool,
) {
    let i = ABSOLUTE_POS;
    if i >= p.len() {
        terminate!();
    }
    let grad = g[i];
    let mut m_old = 0.0f32;
    let mut v_old = 0.0f32;
    if !first {
        m_old = m[i];
        v_old = v[i];
    }
    let toward = grad - m_old;
    let moved = toward * one_minus_beta1;
    let m_new = m_old + moved;
    let v_kept = v_old * beta2;
    let squared = grad * grad;
    let v_added = squared * one_minus_beta2;
    let v_new = v_kept + v_added;
    let root = f32::sqrt(v_new);
    let corrected = root / bias_correction2_sqrt;
    let denom = corrected + eps;
    let decayed = p[i] * decay;
    let ratio = m_new / denom;
    let step = ratio * step_size;
    p_out[i] = decayed - step;
    m_out[i] = m_new;
    v_out[i] = v_new;
}

/// Launches of the update kernel since the program started, counted at each launch.
static LAUNCHES: AtomicU64 = AtomicU64::new(0);

/// How many times the update kernel has been launched (all devices, all threads).
pub fn launches() -> u64 {
    LAUNCHES.load(Ordering::Relaxed)
}

/// The updated parameter and moments `(p, m, v)`, three new `[n]` f32 tensors on the
/// parameter's device; `moments` is None on a parameter's first step.
///
/// # Shapes
/// - `p`, `g`, `moments`: `[n]`, f32, contiguous
pub fn update(
    p: CubeTensor,
    g: CubeTensor,
    moments: Option<(CubeTensor, CubeTensor)>,
    s: &AdamWScalars,
) -> (CubeTensor, CubeTensor, CubeTensor) {
    let client = p.client.clone();
    let device = p.device.clone();
    let n = p.meta.shape().num_elements();
    let new =
        || empty_device_contiguous_dtype(client.clone(), device.clone(), [n].into(), DType::F32);
    let (p_out, m_out, v_out) = (new(), new(), new());
    let first = moments.is_none();
    // Unread when `first`: any f32 tensor of the launch stands in.
    let (m, v) = moments.unwrap_or_else(|| (g.clone(), g.clone()));
    let (cube_count, cube_dim) = super::one_thread_each(&client, n);
    // Safety: one thread per value; thread i reads index i of four tensors of n values and
    // writes index i of three new ones of n values; threads past n return first.
    unsafe {
        adamw_values::launch_unchecked(
            &client,
            cube_count,
            cube_dim,
            p.into_tensor_arg(),
            g.into_tensor_arg(),
            m.into_tensor_arg(),
            v.into_tensor_arg(),
            p_out.clone().into_tensor_arg(),
            m_out.clone().into_tensor_arg(),
            v_out.clone().into_tensor_arg(),
            s.decay,
            s.one_minus_beta1,
            s.beta2,
            s.one_minus_beta2,
            s.step_size,
            s.bias_correction2_sqrt,
            s.eps,
            first,
        );
    }
    LAUNCHES.fetch_add(1, Ordering::Relaxed);
    (p_out, m_out, v_out)
}
