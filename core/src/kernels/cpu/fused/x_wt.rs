//! `y = x · Wᵀ` on burn Flex as napkin's own op, forward and backward, with every output
//! written into one `Vec<f32>`.
//!
//! Why: burn Flex makes each product's output with `FlexTensor::empty`, a `vec![0u8; n]` that
//! the bytes container then copies into a 16-byte-aligned allocation — every output is
//! allocated twice, and for a step the largest one, the logits (`[B·T, V]`, 12.6 MB for
//! SmolLM2 at T = 64), set the peak: the page measured 1.71× the predicted step peak. Such an
//! aligned buffer also cannot become a `Vec<f32>` without another copy, which every fused
//! kernel reading a product's output paid. Here the outputs are `Vec<f32>`s handed to Flex
//! as they are (no copy either way), so a product holds one output, as the predictor says.
//!
//! - forward: `y [N, out] = x [N, in] · Wᵀ`
//! - backward: `∂x = ∂y · W`, `∂W = ∂yᵀ · x` (each only when its input needs it)
//!
//! The GEMM is the `gemm` crate on rayon's threads (`small_gemm::gemm_on_rayon`), the one Flex itself runs (in the browser
//! rayon has one thread). Not OpenBLAS where it is compiled in: Debian's 0.3.21 runs its
//! Haswell (AVX2) kernel on an AVX-512 Zen core, and a SmolLM2 QLoRA step on Flex took 8 %
//! longer with it (measured against burn's matmul, alternated).

use burn::tensor::{Device, Tensor};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind, binary};
use burn_backend::tensor::FloatTensor;
use burn_dispatch::{DispatchKindConversion, DispatchTensor};

use super::small_gemm::{Operand, gemm_on_rayon, gemm_on_rayon_in_row_blocks};
use super::{CpuKernel, CpuValues, backend_tensor, is_f32, tracked_or_plain, with_values};

/// Outputs smaller than this stay with burn Flex's matmul: their second copy is too small to
/// matter, and the op's own cost per call (~12 µs) made tiny-smol's QLoRA step in the page 11 %
/// slower when every product took it.
pub const SMALLEST_OUTPUT_BYTES: usize = 256 << 10;

/// `x · Wᵀ` when both live on burn Flex in f32 (tracked or not) and the output is at least
/// [`SMALLEST_OUTPUT_BYTES`]; both back otherwise.
///
/// # Shapes
/// - `x`: `[N, in]`, `w`: `[out, in]` → `[N, out]`
#[cfg(feature = "flex")]
pub fn x_wt_on_flex(x: Tensor<2>, w: Tensor<2>) -> Result<Tensor<2>, (Tensor<2>, Tensor<2>)> {
    let output_bytes = x.dims()[0] * w.dims()[0] * 4;
    if !is_f32(&x) || !is_f32(&w) || output_bytes < SMALLEST_OUTPUT_BYTES {
        return Err((x, w));
    }
    XWt.on_backend::<burn_flex::Flex>((x, w))
}

/// Output rows per product of a weight gradient over `tokens` tokens: the block of `∂y` the
/// GEMM packs stays within [`PACKED_GRADIENT_BYTES`] (at least 256 rows, so each product is
/// still large enough to keep every thread busy).
fn weight_gradient_rows(tokens: usize) -> usize {
    (PACKED_GRADIENT_BYTES / (4 * tokens.max(1))).max(256)
}

/// The most bytes of `∂y` a weight gradient's GEMM packs at once.
const PACKED_GRADIENT_BYTES: usize = 4 << 20;

/// `x · Wᵀ` on host values.
fn forward(x: &[f32], w: &[f32], [n, input]: [usize; 2], out: usize) -> Vec<f32> {
    gemm_on_rayon(
        (n, out, input),
        Operand::plain(x, input),
        Operand::transposed(w, input),
    )
}

/// The op on one CPU backend.
struct XWt;

impl CpuKernel for XWt {
    type Inputs = (Tensor<2>, Tensor<2>);
    type Output = Tensor<2>;

    fn on_backend<B: CpuValues>(&self, inputs: Self::Inputs) -> Result<Tensor<2>, Self::Inputs>
    where
        DispatchTensor: DispatchKindConversion<B> + DispatchKindConversion<Autodiff<B>>,
    {
        tracked_or_plain::<B, _, _>(
            inputs,
            |(x, w)| Tensor::from_primitive::<Autodiff<B>>(tracked::<B>(x, w)),
            |(x, w)| Tensor::from_primitive::<B>(plain::<B>(&x, &w)),
        )
    }
}

/// The forward on backend tensors.
fn plain<B: CpuValues>(x: &FloatTensor<B>, w: &FloatTensor<B>) -> FloatTensor<B>
where
    DispatchTensor: DispatchKindConversion<B>,
{
    let xt = Tensor::<2>::from_primitive::<B>(x.clone());
    let (shape, device) = (xt.dims(), xt.device());
    let out = Tensor::<2>::from_primitive::<B>(w.clone()).dims()[0];
    let y = with_values::<B, 2, _>(x, |x| {
        with_values::<B, 2, _>(w, |w| forward(x, w, shape, out))
    });
    backend_tensor::<B, 2>(y, [shape[0], out], &device)
}

/// What the backward needs: x (when W needs a gradient), W (when x needs one), the shapes.
#[derive(Debug, Clone)]
struct Saved<B: CpuValues> {
    x: Option<FloatTensor<B>>,
    w: Option<FloatTensor<B>>,
    /// `[N, in]` and `out`.
    shape: ([usize; 2], usize),
    device: Device,
}

#[derive(Debug)]
struct XWtBackward;

impl<B: CpuValues> Backward<B, 2> for XWtBackward
where
    DispatchTensor: DispatchKindConversion<B>,
{
    type State = Saved<B>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let Saved {
            x,
            w,
            shape: ([n, input], out),
            device,
        } = ops.state;
        binary::<B, _, _>(
            ops.parents,
            ops.node,
            grads,
            // ∂x [N, in] = ∂y [N, out] · W [out, in]
            |grad| {
                let w = w.expect("W kept for ∂x");
                let dx = with_values::<B, 2, _>(&grad, |dy| {
                    with_values::<B, 2, _>(&w, |w| {
                        gemm_on_rayon(
                            (n, input, out),
                            Operand::plain(dy, out),
                            Operand::plain(w, input),
                        )
                    })
                });
                backend_tensor::<B, 2>(dx, [n, input], &device)
            },
            // ∂W [out, in] = ∂yᵀ [out, N] · x [N, in], in blocks of output rows so that the
            // GEMM never packs all of ∂y at once.
            |grad| {
                let x = x.expect("x kept for ∂W");
                let dw = with_values::<B, 2, _>(&grad, |dy| {
                    with_values::<B, 2, _>(&x, |x| {
                        gemm_on_rayon_in_row_blocks(
                            (out, input, n),
                            Operand::transposed(dy, out),
                            Operand::plain(x, input),
                            weight_gradient_rows(n),
                        )
                    })
                });
                backend_tensor::<B, 2>(dw, [out, input], &device)
            },
        );
    }
}

fn tracked<B: CpuValues>(
    x: FloatTensor<Autodiff<B>>,
    w: FloatTensor<Autodiff<B>>,
) -> FloatTensor<Autodiff<B>>
where
    DispatchTensor: DispatchKindConversion<B>,
{
    let (x_needs_grad, w_needs_grad) = (x.is_tracked(), w.is_tracked());
    let prep = XWtBackward
        .prepare::<NoCheckpointing>([x.node(), w.node()])
        .compute_bound()
        .stateful();
    let y = plain::<B>(x.primitive(), w.primitive());
    match prep {
        OpsKind::Tracked(prep) => {
            let xt = Tensor::<2>::from_primitive::<B>(x.primitive().clone());
            let (shape, device) = (xt.dims(), xt.device());
            let out = Tensor::<2>::from_primitive::<B>(w.primitive().clone()).dims()[0];
            let state = Saved {
                x: w_needs_grad.then(|| x.into_primitive()),
                w: x_needs_grad.then(|| w.into_primitive()),
                shape: (shape, out),
                device,
            };
            prep.finish(state, y)
        }
        OpsKind::UnTracked(prep) => prep.finish(y),
    }
}
