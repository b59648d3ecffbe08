//! RMSNorm and SwiGLU on whatever backend holds the tensors: napkin's fused CPU kernel on host
//! values, its cubecl kernel on a GPU backend, burn's ops otherwise (16-bit tensors, or a build
//! without the GPU kernels). Each path has the same formula; the fused ones keep less for the
//! backward (`config::Kernels` tells the predictor which ran).

use burn::tensor::Tensor;
use burn::tensor::activation::silu;

use super::cpu;

/// `w ⊙ x / √(mean(x²) + ε)` over the last axis; differentiable.
///
/// # Shapes
/// - `x`: `[B, T, D]`, `gain`: `[D]` → `[B, T, D]`
pub fn rms_norm(x: Tensor<3>, gain: Tensor<1>, eps: f64) -> Tensor<3> {
    let (x, gain) = match cpu::fused::rms_norm::rms_norm(x, gain, eps) {
        Ok(y) => return y,
        Err(inputs) => inputs,
    };
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    let (x, gain) = match super::gpu::fused::rms_norm::rms_norm(x, gain, eps) {
        Ok(y) => return y,
        Err(inputs) => inputs,
    };
    let mean_square = x.clone().square().mean_dim(2); // [B, T, 1]
    let inv_rms = (mean_square + eps).sqrt().recip(); // [B, T, 1]
    gain.unsqueeze::<3>() * (x * inv_rms)
}

/// `silu(gate) ⊙ up`; differentiable.
///
/// # Shapes
/// - `gate`, `up`: `[B, T, F]` → `[B, T, F]`
pub fn swiglu(gate: Tensor<3>, up: Tensor<3>) -> Tensor<3> {
    let (gate, up) = match cpu::fused::swiglu::swiglu(gate, up) {
        Ok(h) => return h,
        Err(inputs) => inputs,
    };
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    let (gate, up) = match super::gpu::fused::swiglu::swiglu(gate, up) {
        Ok(h) => return h,
        Err(inputs) => inputs,
    };
    silu(gate) * up
}
