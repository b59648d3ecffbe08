//! `x · Wᵀ` for an NF4-quantized W, as a custom autodiff operation that keeps the memory saving.
//!
//! The forward dequantizes W into a transient buffer, multiplies, and drops it. The backward
//! needs `∂x = ∂y · W`: it dequantizes W again from the packed codes instead of keeping the
//! float copy alive between forward and backward (as bitsandbytes' `MatMul4Bit` does). W is
//! frozen, so no weight gradient is ever formed. The only state saved for backward is a
//! reference-counted pointer to the codes that the layer already owns.
//!
//! burn's own autodiff would save the dequantized `[out, in]` matrix for every layer until the
//! backward, i.e. a full-precision copy of the whole model: exactly what QLoRA avoids.
//!
//! Where the transient comes from: on a GPU the codes are resident on the device and a cubecl
//! kernel dequantizes them there (`kernels/gpu/nf4_dequantize.rs`); on the CPU backends the host
//! codes are decoded in place.
//!
//! Compute dtype (bitsandbytes' `compute_dtype`): inside an autocast region on a GPU the
//! kernel dequantizes straight to bf16/f16 and both products run in that dtype, with an f32
//! result. The CPU backends keep f32 (burn Flex's 16-bit GEMM widens to f32: no gain).

use burn::tensor::{Device, FloatDType, Tensor};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn_backend::tensor::FloatTensor;
use burn_backend::{Backend, TensorMetadata};

use burn_dispatch::{DispatchDevice, DispatchKindConversion, DispatchTensor};

use super::autocast::compute_dtype;
use super::lora::LoraAdapter;
use super::matmul_wt::matmul_wt;
use super::nf4_weight::Nf4Weight;
use crate::kernels::gpu::resident_nf4::LoraPath;
use crate::memory::inner_marks;

/// burn marks NdArray deprecated; we keep it for its BLAS GEMM (ARCHITECTURE.md).
#[cfg(feature = "openblas")]
#[allow(deprecated)]
type NdArray = burn_ndarray::NdArray;

/// # Shapes
/// - `x`: `[N, in]`, `weight`: NF4 `[out, in]` → `[N, out]`
pub fn nf4_matmul(x: Tensor<2>, weight: &Nf4Weight) -> Tensor<2> {
    if !x.is_tracked() {
        return nf4_matmul_saving_weight(x, weight);
    }
    // Every backend compiled in gets the memory-true backward; `x` comes back from the ones
    // it does not live on.
    let result = Err(x);
    // Flex multiplies a transposed view without copying it.
    #[cfg(feature = "flex")]
    let result = result.or_else(|x| with_backend_products::<burn_flex::Flex>(x, weight));
    // NdArray would copy a transposed view; BLAS takes it as it is. Both products run on
    // every pool thread (kernels/cpu/gemm.rs).
    #[cfg(feature = "openblas")]
    let result = result.or_else(
        |x| match x.clone().try_into_primitive::<Autodiff<NdArray>>() {
            Ok(p) => {
                use super::matmul_wt::ndarray_gemm::{x_w, x_wt};
                Ok(Tensor::from_primitive::<Autodiff<NdArray>>(tracked::<
                    NdArray,
                >(
                    p, weight, x_wt, x_w,
                )))
            }
            Err(_) => Err(x),
        },
    );
    // The GPU backends (wgpu, WebGPU, CUDA: burn's one cubecl backend type): the transient is
    // dequantized on the device from the resident codes.
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    let result = result.or_else(|x| with_backend_products::<burn::backend::Cube>(x, weight));
    // Any other backend: correct gradients, but autodiff keeps the dequantized weight.
    result.unwrap_or_else(|x| nf4_matmul_saving_weight(x, weight))
}

/// The custom op with backend `B`'s own products when `x` lives on `B` under autodiff; `x`
/// back otherwise.
#[cfg(any(feature = "flex", feature = "wgpu", feature = "cuda"))]
fn with_backend_products<B: Backend>(
    x: Tensor<2>,
    weight: &Nf4Weight,
) -> Result<Tensor<2>, Tensor<2>>
where
    DispatchTensor: DispatchKindConversion<Autodiff<B>> + DispatchKindConversion<B>,
    B::Device: Into<DispatchDevice>,
{
    match x.clone().try_into_primitive::<Autodiff<B>>() {
        Ok(p) => Ok(Tensor::from_primitive::<Autodiff<B>>(tracked::<B>(
            p,
            weight,
            |x, w| B::float_matmul(x, B::float_transpose(w)),
            B::float_matmul,
        ))),
        Err(_) => Err(x),
    }
}

/// The naive way: dequantize, then an ordinary matmul. Under autodiff this keeps the float
/// `[out, in]` weight alive until the backward (burn saves the right operand of a matmul whose
/// left operand needs a gradient). Used for inference, where nothing is saved, for backends
/// without the custom op, and by the memory tests to measure what the custom op saves. A few
/// untracked rows on a GPU (generation) are multiplied straight from the codes instead, with
/// no dequantized weight.
pub fn nf4_matmul_saving_weight(x: Tensor<2>, weight: &Nf4Weight) -> Tensor<2> {
    let device = x.device();
    if let Some(y) = from_codes(&x, weight) {
        // Read with the row and its product alive.
        inner_marks::mark();
        return y;
    }
    let dtype = half_on(&device);
    let w = weight.dequantized(&device, dtype.unwrap_or(FloatDType::F32)); // transient
    // A measurement reads the pool with the weight and the result alive.
    let kept = inner_marks::armed().then(|| w.clone());
    let y = match dtype {
        Some(dtype) => matmul_wt(x.cast(dtype), w).cast(FloatDType::F32),
        None => matmul_wt(x, w),
    };
    if kept.is_some() {
        inner_marks::mark();
    }
    y
}

/// The most rows an untracked product reads straight from the resident codes
/// (`kernels/gpu/nf4_row_product.rs`: KV-cached generation's one new token). The kernel decodes
/// the codes again for each row, so past a few rows dequantizing once and a matrix product win:
/// on lavapipe (`napkin bench gpu --smoke`) the codes were 2.5× faster at 1 row, 1.7× at 4,
/// 0.85× at 8.
pub const ROWS_FROM_CODES: usize = 4;

thread_local! {
    /// Off inside [`dequantizing_every_product`].
    static FROM_CODES: std::cell::Cell<bool> = const { std::cell::Cell::new(true) };
}

/// Runs `f` with every NF4 product dequantizing its weight first, as before the row kernel:
/// the comparison the tests and the benchmark make.
pub fn dequantizing_every_product<R>(f: impl FnOnce() -> R) -> R {
    /// Puts the setting back when dropped, `f` panicking or not.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            FROM_CODES.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(FROM_CODES.with(|c| c.replace(false)));
    f()
}

/// `x · Wᵀ` from the resident codes, for a few untracked rows on a GPU; `None` elsewhere.
fn from_codes(x: &Tensor<2>, weight: &Nf4Weight) -> Option<Tensor<2>> {
    if !few_untracked_rows(x) {
        return None;
    }
    let y = weight
        .resident_on(&x.device())?
        .rows_times_transposed(x, None)?;
    Some(if x.is_autodiff() { y.autodiff() } else { y })
}

/// `x · Wᵀ + s · (x · Aᵀ) · Bᵀ` for a few untracked rows on a GPU and an untracked adapter:
/// the adapter's path added in the row product's own launch (`kernels/gpu/nf4_row_product.rs`;
/// the scaling, the product by B and the sum are three launches fewer). `None` where the row
/// product does not apply: the caller runs the base product and the adapter apart.
///
/// # Shapes
/// - `x`: `[N, in]`, `weight`: NF4 `[out, in]`, A `[r, in]`, B `[out, r]` → `[N, out]`
pub fn nf4_lora_from_codes(
    x: &Tensor<2>,
    weight: &Nf4Weight,
    adapter: &LoraAdapter,
) -> Option<Tensor<2>> {
    if !few_untracked_rows(x) {
        return None;
    }
    let lora_b = adapter.lora_b.val();
    if lora_b.is_tracked() {
        return None;
    }
    let resident = weight.resident_on(&x.device())?;
    let [rows, inp] = x.dims();
    if !resident.reads_rows(rows, inp) {
        return None;
    }
    let path = LoraPath {
        down: adapter.down(x.clone()), // [N, r]
        lora_b,
        scaling: adapter.scaling,
    };
    let y = resident.rows_times_transposed(x, Some(path))?;
    // Read with the row, the adapter's `[N, r]` and the product alive.
    inner_marks::mark();
    Some(if x.is_autodiff() { y.autodiff() } else { y })
}

/// Whether `x` is a few rows that need no gradient, with the row product switched on.
fn few_untracked_rows(x: &Tensor<2>) -> bool {
    !x.is_tracked() && x.dims()[0] <= ROWS_FROM_CODES && FROM_CODES.with(|c| c.get())
}

/// The 16-bit dtype NF4 products compute in on `device`: the autocast dtype on a GPU, else
/// none (f32).
fn half_on(device: &Device) -> Option<FloatDType> {
    compute_dtype().filter(|_| crate::device::is_gpu(device))
}

/// `a · b` on one backend's primitives.
type Product<B> = fn(FloatTensor<B>, FloatTensor<B>) -> FloatTensor<B>;

/// The backward step: `∂x = ∂y · dequant(W)`, with the backend's fastest plain product.
#[derive(Debug)]
struct Nf4MatmulBackward;

impl<B: Backend> Backward<B, 1> for Nf4MatmulBackward
where
    DispatchTensor: DispatchKindConversion<B>,
    B::Device: Into<DispatchDevice>,
{
    /// The packed weight (shared with the layer, not a copy), `a · b`, and the compute dtype
    /// of the forward (None: f32).
    type State = (Nf4Weight, Product<B>, Option<FloatDType>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (weight, x_w, half) = ops.state;
        unary::<B, _>(ops.parents, ops.node, grads, |grad_out| {
            // grad_out: [N, out]; W: [out, in] → ∂x: [N, in]
            product_in::<B>(half, grad_out, &weight, x_w)
        });
    }
}

/// `a · W` (or `a · Wᵀ`, as `product` takes it) with W dequantized on `a`'s device, computed
/// in `half` when given (the result cast back to f32).
fn product_in<B: Backend>(
    half: Option<FloatDType>,
    a: FloatTensor<B>,
    weight: &Nf4Weight,
    product: Product<B>,
) -> FloatTensor<B>
where
    DispatchTensor: DispatchKindConversion<B>,
    B::Device: Into<DispatchDevice>,
{
    let dtype = half.unwrap_or(FloatDType::F32);
    let w = weight_primitive::<B>(weight, &a, dtype); // transient
    // A measurement reads the pool with both operands and the result alive, as they are
    // while the product runs (the product consumes its operands).
    let operands = inner_marks::armed().then(|| (a.clone(), w.clone()));
    let out = match half {
        Some(half) => B::float_cast(product(B::float_cast(a, half), w), FloatDType::F32),
        None => product(a, w),
    };
    if operands.is_some() {
        inner_marks::mark();
    }
    out
}

/// The dequantized `[out, in]` weight in `dtype` as backend `B`'s primitive, on the device of
/// `like` (a transient: dropped after its product).
fn weight_primitive<B: Backend>(
    weight: &Nf4Weight,
    like: &FloatTensor<B>,
    dtype: FloatDType,
) -> FloatTensor<B>
where
    DispatchTensor: DispatchKindConversion<B>,
    B::Device: Into<DispatchDevice>,
{
    let w = weight.dequantized(&Device::new(like.device()), dtype);
    w.try_into_primitive::<B>()
        .expect("the weight is made on the product's own device and backend")
}

/// The forward on a concrete autodiff backend; `x_wt(x, W)` multiplies by the transpose of
/// the `[out, in]` weight and `x_w` by a matrix as it is (the backward's `∂y · W`), each in
/// the way that is cheapest on that backend.
fn tracked<B: Backend>(
    x: FloatTensor<Autodiff<B>>,
    weight: &Nf4Weight,
    x_wt: Product<B>,
    x_w: Product<B>,
) -> FloatTensor<Autodiff<B>>
where
    DispatchTensor: DispatchKindConversion<B>,
    B::Device: Into<DispatchDevice>,
{
    let guard = x.node();
    let inner = x.into_primitive();
    let half = half_on(&Device::new(inner.device()));
    let prep = Nf4MatmulBackward
        .prepare::<NoCheckpointing>([guard])
        .compute_bound()
        .stateful();
    // [N, out]; the transient W ([out, in]) is dropped inside.
    let y = product_in::<B>(half, inner, weight, x_wt);
    match prep {
        OpsKind::Tracked(prep) => prep.finish((weight.clone(), x_w, half), y),
        OpsKind::UnTracked(prep) => prep.finish(y),
    }
}
