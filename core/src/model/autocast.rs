//! Mixed precision, the way `torch.autocast` does it: inside an autocast region the linear
//! layers (block projections, LoRA adapters, the LM head) cast their input and weight to a low
//! precision (bf16 or f16), multiply there, and hand an f32 result back. On a GPU the eager
//! attention runs there too (`attention.rs`: q, k, v cast once; the `[B, H, T, T]` scores and
//! probabilities 16-bit, the fused softmax's arithmetic f32). Everything else — norms, the
//! loss, the trainable parameters and the optimizer state — stays f32.
//! NF4 products compute in the low precision on a GPU (the kernel dequantizes straight to it)
//! and in f32 on the CPU backends.
//!
//! What a product keeps for its backward is then its operands' 16-bit copies: its input when
//! the weight trains, and the weight's cast copy when the input needs a gradient (for the tied
//! head that is a 16-bit copy of the whole embedding). The predictor replays exactly this
//! (`predict/activations.rs`, `LinearCompute`); on lavapipe it matches the device pool to
//! 0.01 % (`tests/tests/gpu/device_pool.rs`). Kept bytes do not halve: the f32 tensors other ops
//! keep stay, and full fine-tuning keeps both casts beside them (tiny-smol: +32 %).
//!
//! What it saves, measured (tests/memory): with LoRA the frozen base is stored in the low
//! precision (`Llama::cast_frozen_base`), half the bytes of the block linears. The step's
//! activation peak does not fall on the CPU: the f32 tensors of norms, softmax and the loss
//! dominate, the low-precision casts of matmul inputs are saved beside them, and burn Flex's
//! bf16 GEMM widens to f32 internally (no speed-up either). On GPUs with native bf16/f16 GEMMs
//! the compute gets faster; there the attention's `[B, H, T, T]` tensors are 16-bit too
//! (tiny-smol LoRA, f16, T = 512 on lavapipe: kept activations 52.96 → 34.02 MB), while the
//! norms' f32 tensors stay.
//!
//! The region is a per-thread setting held by a guard, so the model code needs no extra
//! parameter and a recomputation in the backward (gradient checkpointing) runs under the same
//! precision as the forward it repeats.

use std::cell::Cell;

use burn::tensor::{FloatDType, Tensor};

thread_local! {
    static COMPUTE: Cell<Option<FloatDType>> = const { Cell::new(None) };
}

/// Restores the previous precision when dropped.
#[derive(Debug)]
pub struct AutocastGuard {
    previous: Option<FloatDType>,
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        COMPUTE.with(|c| c.set(self.previous));
    }
}

/// Computes linear layers in `dtype` (None: f32) until the guard is dropped.
pub fn autocast(dtype: Option<FloatDType>) -> AutocastGuard {
    let previous = COMPUTE.with(|c| c.replace(dtype));
    AutocastGuard { previous }
}

/// The 16-bit dtype autocast uses on `device`: bf16 where the device has it, else f16 (Mesa's
/// lavapipe, for one, has f16 only).
pub fn half_dtype(device: &burn::tensor::Device) -> FloatDType {
    if device.supports_dtype(burn::tensor::DType::BF16) {
        FloatDType::BF16
    } else {
        FloatDType::F16
    }
}

/// The precision linear layers compute in on this thread (None: f32).
pub fn compute_dtype() -> Option<FloatDType> {
    COMPUTE.with(Cell::get)
}

/// `x · Wᵀ` in the autocast precision, returned in f32.
///
/// # Shapes
/// - `x`: `[N, in]`, `w`: `[out, in]` → `[N, out]`
pub fn linear_matmul(x: Tensor<2>, w: Tensor<2>) -> Tensor<2> {
    match compute_dtype() {
        // A half-precision base outside autocast (evaluating a model trained that way).
        None if w.dtype() != x.dtype() => {
            let dtype = x.dtype();
            super::matmul_wt::matmul_wt(x, w.cast(dtype))
        }
        None => super::matmul_wt::matmul_wt(x, w),
        Some(dtype) => {
            super::matmul_wt::matmul_wt(x.cast(dtype), w.cast(dtype)).cast(FloatDType::F32)
        }
    }
}
