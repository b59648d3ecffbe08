//! Training's fused element-wise kernels on the cubecl backends (wgpu, WebGPU, CUDA), as
//! custom autodiff operations: the GPU side of `kernels/cpu/fused/`, whose CPU formulas are their
//! reference and whose keeps they share (so the predictor's fused rules hold on a GPU pool too;
//! RoPE's backward reads the batch's device tables where the CPU's reads host copies).
//!
//! - `cross_entropy.rs`: the causal-LM loss, forward one launch and a sum, backward one launch
//!   (burn's ops: about ten and twelve), keeping the logits, a log-sum-exp a row and the labels;
//! - `rms_norm.rs`: RMSNorm, forward one launch (burn's ops: seven), backward one launch, two
//!   when the gain trains;
//! - `rope.rs`: the rotary embedding of a whole projection, forward and backward one launch
//!   each (burn's ops: about six each way), keeping nothing of the projection;
//! - `scaled_add.rs`: a LoRA linear's `base + s·(x·Aᵀ·Bᵀ)` in one launch (burn's ops: two);
//! - `softmax.rs`: the eager attention's scale, mask and softmax, forward and backward one
//!   launch each (burn's ops: seven and about fourteen), keeping the probabilities only;
//! - `swiglu.rs`: `silu(g) ⊙ u`, forward one launch (burn's ops: three, keeping two more
//!   `[B, T, F]` tensors), backward one launch;
//! - `strided.rs`: where a value of a `[B, T, C]` tensor lies, for the row-padded layouts
//!   burn's CUDA allocator gives (the last axis is always unit-stride).
//!
//! They take f32 inputs on `burn::backend::Cube` (under autodiff or not; the softmax f16 and
//! bf16 too) and hand anything else back, for the caller to run burn's ops.

pub mod cross_entropy;
pub mod rms_norm;
pub mod rope;
pub mod scaled_add;
pub mod softmax;
mod strided;
pub mod swiglu;

use burn::backend::Cube;
use burn::tensor::{DType, Tensor};
use burn_autodiff::Autodiff;
use burn_backend::tensor::FloatTensor;

/// Launches of this folder's kernels since the program started, counted at each launch.
static LAUNCHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many times a kernel of this folder has been launched (all devices, all threads).
pub fn launches() -> u64 {
    LAUNCHES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Where a kernel writes a result shaped like its input `x`: over `x` itself when nothing else
/// holds it, else into a new buffer of its dtype in the allocator's layout. Returns `(read, out, in_place)`:
/// in place the kernel reads the values from `out` (each unit reads a value before it writes
/// it), and `stand_in`, another tensor of the launch that is never read there, takes the
/// input's binding, so no buffer is bound twice.
fn over_or_new(
    x: burn_cubecl::tensor::CubeTensor,
    stand_in: &burn_cubecl::tensor::CubeTensor,
) -> (
    burn_cubecl::tensor::CubeTensor,
    burn_cubecl::tensor::CubeTensor,
    bool,
) {
    if x.can_mut() {
        return (stand_in.clone(), x, true);
    }
    let out = burn_cubecl::ops::numeric::empty_device_dtype(
        x.client.clone(),
        x.device.clone(),
        x.meta.shape().clone(),
        x.dtype,
    );
    (x, out, false)
}

fn count_launch() {
    LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Two f32 tensors of rank 3 and `D` as cubecl primitives: under autodiff when both live on
/// the autodiff cubecl device, plain when both live on the plain one.
pub(crate) enum Taken<const D: usize> {
    Tracked(FloatTensor<Autodiff<Cube>>, FloatTensor<Autodiff<Cube>>),
    Plain(FloatTensor<Cube>, FloatTensor<Cube>),
}

/// `a` and `b` as one of the [`Taken`] pairs, or both back when they are not f32 on a cubecl
/// device (or live on different kinds).
pub(crate) fn take<const D: usize>(
    a: Tensor<3>,
    b: Tensor<D>,
) -> Result<Taken<D>, (Tensor<3>, Tensor<D>)> {
    if a.dtype() != DType::F32 || b.dtype() != DType::F32 {
        return Err((a, b));
    }
    if let (Ok(pa), Ok(pb)) = (
        a.clone().try_into_primitive::<Autodiff<Cube>>(),
        b.clone().try_into_primitive::<Autodiff<Cube>>(),
    ) {
        return Ok(Taken::Tracked(pa, pb));
    }
    match (
        a.clone().try_into_primitive::<Cube>(),
        b.clone().try_into_primitive::<Cube>(),
    ) {
        (Ok(pa), Ok(pb)) => Ok(Taken::Plain(pa, pb)),
        _ => Err((a, b)),
    }
}
