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

use std::sync::Arc;

use burn::tensor::{Device, Tensor, TensorData};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn_backend::tensor::FloatTensor;
use burn_backend::{Backend, TensorMetadata};

use super::matmul_wt::matmul_wt;
use crate::tricks::nf4::Nf4Tensor;

/// burn marks NdArray deprecated; we keep it for its BLAS GEMM (ARCHITECTURE.md).
#[cfg(feature = "openblas")]
#[allow(deprecated)]
type NdArray = burn_ndarray::NdArray;

/// The dequantized `[out, in]` weight as a tensor on `device` (a transient).
pub fn dequantized_weight(weight: &Nf4Tensor, device: &Device) -> Tensor<2> {
    let shape = [weight.shape[0], weight.shape[1]];
    Tensor::from_data(TensorData::new(weight.dequantize(), shape), device)
}

/// # Shapes
/// - `x`: `[N, in]`, `weight`: NF4 `[out, in]` → `[N, out]`
pub fn nf4_matmul(x: Tensor<2>, weight: &Arc<Nf4Tensor>) -> Tensor<2> {
    if x.is_tracked() {
        // Each CPU backend compiled in gets the memory-true backward.
        #[cfg(feature = "flex")]
        let x = match x
            .clone()
            .try_into_primitive::<Autodiff<burn_flex::Flex, NoCheckpointing>>()
        {
            Ok(p) => {
                use burn_backend::ops::FloatTensorOps;
                type Flex = burn_flex::Flex;
                // Flex multiplies a transposed view without copying it.
                return Tensor::from_primitive::<Autodiff<Flex>>(tracked::<Flex>(
                    p,
                    weight,
                    |x, w| Flex::float_matmul(x, Flex::float_transpose(w)),
                    Flex::float_matmul,
                ));
            }
            Err(_) => x,
        };
        #[cfg(feature = "openblas")]
        let x = match x
            .clone()
            .try_into_primitive::<Autodiff<NdArray, NoCheckpointing>>()
        {
            Ok(p) => {
                // NdArray would copy a transposed view; BLAS takes it as it is. Both products
                // run on every pool thread (cpu_gemm.rs).
                use super::matmul_wt::ndarray_gemm::{x_w, x_wt};
                return Tensor::from_primitive::<Autodiff<NdArray>>(tracked::<NdArray>(
                    p, weight, x_wt, x_w,
                ));
            }
            Err(_) => x,
        };
        // The GPU backends (wgpu, WebGPU, CUDA: burn's one cubecl backend type). The codes
        // stay on the host: each product dequantizes there and uploads the transient weight.
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        let x = match x
            .clone()
            .try_into_primitive::<Autodiff<burn::backend::Cube, NoCheckpointing>>()
        {
            Ok(p) => {
                use burn_backend::ops::FloatTensorOps;
                type Cube = burn::backend::Cube;
                return Tensor::from_primitive::<Autodiff<Cube>>(tracked::<Cube>(
                    p,
                    weight,
                    |x, w| Cube::float_matmul(x, Cube::float_transpose(w)),
                    Cube::float_matmul,
                ));
            }
            Err(_) => x,
        };
        // Any other backend: correct gradients, but autodiff keeps the dequantized weight.
        return nf4_matmul_saving_weight(x, weight);
    }
    nf4_matmul_saving_weight(x, weight)
}

/// The naive way: dequantize, then an ordinary matmul. Under autodiff this keeps the float
/// `[out, in]` weight alive until the backward (burn saves the right operand of a matmul whose
/// left operand needs a gradient). Used for inference, where nothing is saved, for backends
/// without the custom op, and by the memory tests to measure what the custom op saves.
pub fn nf4_matmul_saving_weight(x: Tensor<2>, weight: &Nf4Tensor) -> Tensor<2> {
    let device = x.device();
    matmul_wt(x, dequantized_weight(weight, &device))
}

/// `a · b` on one backend's primitives.
type Product<B> = fn(FloatTensor<B>, FloatTensor<B>) -> FloatTensor<B>;

/// The backward step: `∂x = ∂y · dequant(W)`, with the backend's fastest plain product.
#[derive(Debug)]
struct Nf4MatmulBackward;

impl<B: Backend> Backward<B, 1> for Nf4MatmulBackward {
    /// The packed weight (shared with the layer, not a copy), and `a · b`.
    type State = (Arc<Nf4Tensor>, Product<B>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (weight, x_w) = ops.state;
        unary::<B, _>(ops.parents, ops.node, grads, |grad_out| {
            // grad_out: [N, out]; W: [out, in] → ∂x: [N, in]
            let device = grad_out.device();
            let w = B::float_from_data(weight_data(&weight), &device);
            x_w(grad_out, w)
        });
    }
}

fn weight_data(weight: &Nf4Tensor) -> TensorData {
    TensorData::new(weight.dequantize(), [weight.shape[0], weight.shape[1]])
}

/// The forward on a concrete autodiff backend; `x_wt(x, W)` multiplies by the transpose of
/// the `[out, in]` weight and `x_w` by a matrix as it is (the backward's `∂y · W`), each in
/// the way that is cheapest on that backend.
fn tracked<B: Backend>(
    x: FloatTensor<Autodiff<B>>,
    weight: &Arc<Nf4Tensor>,
    x_wt: Product<B>,
    x_w: Product<B>,
) -> FloatTensor<Autodiff<B>> {
    let guard = x.node();
    let device = x.primitive().device();
    let w = B::float_from_data(weight_data(weight), &device); // [out, in], transient
    let prep = Nf4MatmulBackward
        .prepare::<NoCheckpointing>([guard])
        .compute_bound()
        .stateful();
    let y = x_wt(x.into_primitive(), w); // [N, out]; the transient W is dropped here
    match prep {
        OpsKind::Tracked(prep) => prep.finish((weight.clone(), x_w), y),
        OpsKind::UnTracked(prep) => prep.finish(y),
    }
}
