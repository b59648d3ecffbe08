//! `x · Wᵀ` for a weight stored `[out, in]` (Hugging Face layout) without ever materialising
//! `Wᵀ`.
//!
//! burn NdArray's matmul reshapes both operands into row-major 3-D arrays first, so a
//! transposed weight view is copied on every call: for SmolLM2 that is the whole model
//! (and the 49152 × 576 tied LM head) once per forward, 60 % of generation time as
//! profiled. BLAS multiplies transposed operands natively (`sgemm` with `TransB`), so on
//! NdArray this module calls ndarray's GEMM on strided views directly, forward and backward,
//! as a custom autodiff operation:
//!
//! - forward: `y = x · Wᵀ`
//! - backward: `∂x = ∂y · W` and `∂W = ∂yᵀ · x`
//!
//! Flex multiplies strided operands without copying (`kernels/cpu/fused/x_wt.rs`). On wgpu and CUDA
//! burn's matmul takes the transposed view, under a custom backward that forms `∂W` as
//! `[out, in]` (burn's own hands back a transposed view, copied when flattened).

use burn::tensor::Tensor;
#[cfg(feature = "openblas")]
use burn_autodiff::Autodiff;
#[cfg(feature = "openblas")]
use burn_autodiff::checkpoint::strategy::NoCheckpointing;

/// # Shapes
/// - `x`: `[N, in]`, `w`: `[out, in]` → `[N, out]`
pub fn matmul_wt(x: Tensor<2>, w: Tensor<2>) -> Tensor<2> {
    #[cfg(feature = "openblas")]
    {
        use ndarray_gemm::NdArray;
        type Ad = Autodiff<NdArray, NoCheckpointing>;
        // Cloning a tensor handle shares its buffer; it copies nothing.
        if let (Ok(xp), Ok(wp)) = (
            x.clone().try_into_primitive::<NdArray>(),
            w.clone().try_into_primitive::<NdArray>(),
        ) {
            return Tensor::from_primitive::<NdArray>(ndarray_gemm::x_wt(xp, wp));
        }
        if let (Ok(xp), Ok(wp)) = (
            x.clone().try_into_primitive::<Ad>(),
            w.clone().try_into_primitive::<Ad>(),
        ) {
            return Tensor::from_primitive::<Ad>(ndarray_gemm::tracked(xp, wp));
        }
    }
    #[cfg(feature = "flex")]
    let (x, w) = match crate::kernels::cpu::fused::x_wt::x_wt_on_flex(x, w) {
        Ok(y) => return y,
        Err(inputs) => inputs,
    };
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    let (x, w) = match cube_products::x_wt(x, w) {
        Ok(y) => return y,
        Err(inputs) => inputs,
    };
    x.matmul(w.transpose())
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod cube_products {
    //! The GPU backends (burn's cubecl backend): burn's own products, with a backward that
    //! forms `∂W` in the weight's `[out, in]` layout. Through `x.matmul(w.transpose())` burn's
    //! autodiff forms `∂(Wᵀ)` and hands back its transposed view, which every optimizer step
    //! copied to flatten it: one copy launch per trained weight a step (56 of a tiny-smol LoRA
    //! step's 705 launches, counted on lavapipe).

    use burn::backend::Cube;
    use burn::tensor::Tensor;
    use burn_autodiff::Autodiff;
    use burn_autodiff::checkpoint::base::Checkpointer;
    use burn_autodiff::checkpoint::strategy::NoCheckpointing;
    use burn_autodiff::grads::Gradients;
    use burn_autodiff::ops::{Backward, Ops, OpsKind, binary};
    use burn_backend::ops::FloatTensorOps;
    use burn_backend::tensor::FloatTensor;

    /// `x · Wᵀ` as the custom op when both live on the autodiff cubecl device; both back
    /// otherwise (a product without autodiff needs no backward of its own).
    pub fn x_wt(x: Tensor<2>, w: Tensor<2>) -> Result<Tensor<2>, (Tensor<2>, Tensor<2>)> {
        match (
            x.clone().try_into_primitive::<Autodiff<Cube>>(),
            w.clone().try_into_primitive::<Autodiff<Cube>>(),
        ) {
            (Ok(xp), Ok(wp)) => Ok(Tensor::from_primitive::<Autodiff<Cube>>(tracked(xp, wp))),
            _ => Err((x, w)),
        }
    }

    /// The backward step of `y = x · Wᵀ`.
    #[derive(Debug)]
    struct XWtBackward;

    impl Backward<Cube, 2> for XWtBackward {
        /// x (kept when W needs a gradient) and W (kept when x needs one), as burn's matmul
        /// keeps its operands.
        type State = (Option<FloatTensor<Cube>>, Option<FloatTensor<Cube>>);

        fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
            let (x, w) = ops.state;
            binary::<Cube, _, _>(
                ops.parents,
                ops.node,
                grads,
                // ∂x [N, in] = ∂y [N, out] · W [out, in]
                |grad| Cube::float_matmul(grad, w.expect("W saved for ∂x")),
                // ∂W [out, in] = ∂yᵀ [out, N] · x [N, in]
                |grad| {
                    let x = x.expect("x saved for ∂W");
                    Cube::float_matmul(Cube::float_transpose(grad), x)
                },
            );
        }
    }

    fn tracked(
        x: FloatTensor<Autodiff<Cube>>,
        w: FloatTensor<Autodiff<Cube>>,
    ) -> FloatTensor<Autodiff<Cube>> {
        let (x_needs_grad, w_needs_grad) = (x.is_tracked(), w.is_tracked());
        let prep = XWtBackward
            .prepare::<NoCheckpointing>([x.node(), w.node()])
            .compute_bound()
            .stateful();
        let y = Cube::float_matmul(
            x.primitive().clone(),
            Cube::float_transpose(w.primitive().clone()),
        );
        match prep {
            OpsKind::Tracked(prep) => {
                let state = (
                    w_needs_grad.then(|| x.into_primitive()),
                    x_needs_grad.then(|| w.into_primitive()),
                );
                prep.finish(state, y)
            }
            OpsKind::UnTracked(prep) => prep.finish(y),
        }
    }
}

// burn marks NdArray deprecated; we keep it for its BLAS GEMM (ARCHITECTURE.md).
#[cfg(feature = "openblas")]
#[allow(deprecated)]
pub mod ndarray_gemm {
    //! The NdArray kernels: BLAS on strided 2-D views, which takes row- or column-major
    //! operands as they are, split over rayon's threads (`kernels/cpu/gemm.rs`).

    use burn_autodiff::Autodiff;
    use burn_autodiff::checkpoint::base::Checkpointer;
    use burn_autodiff::checkpoint::strategy::NoCheckpointing;
    use burn_autodiff::grads::Gradients;
    use burn_autodiff::ops::{Backward, Ops, OpsKind, binary};
    use burn_backend::tensor::FloatTensor;
    use burn_ndarray::NdArrayTensor;
    use ndarray::{ArrayView2, Ix2};

    /// The backend these kernels serve.
    pub type NdArray = burn_ndarray::NdArray;

    /// Which way an operand enters the product.
    #[derive(Debug, Clone, Copy)]
    enum Op {
        AsIs,
        Transposed,
    }

    /// `op(a) · op(b)` for f32 tensors; other dtypes go through burn's matmul.
    fn gemm(a: &NdArrayTensor, op_a: Op, b: &NdArrayTensor, op_b: Op) -> NdArrayTensor {
        use burn_backend::ops::FloatTensorOps;
        match (a, b) {
            (NdArrayTensor::F32(a), NdArrayTensor::F32(b)) => {
                let (a, b) = (a.view(), b.view());
                let (Ok(a), Ok(b)) = (
                    a.into_dimensionality::<Ix2>(),
                    b.into_dimensionality::<Ix2>(),
                ) else {
                    unreachable!("matmul_wt takes 2-D tensors")
                };
                let (a, b) = (oriented(a, op_a), oriented(b, op_b));
                let mut out = crate::kernels::cpu::gemm::zeroed_output(a.nrows(), b.ncols());
                crate::kernels::cpu::gemm::gemm_add(a, b, out.view_mut());
                NdArrayTensor::from(out.into_dyn().into_shared())
            }
            _ => {
                let orient = |t: &NdArrayTensor, op| match op {
                    Op::AsIs => t.clone(),
                    Op::Transposed => NdArray::float_transpose(t.clone()),
                };
                NdArray::float_matmul(orient(a, op_a), orient(b, op_b))
            }
        }
    }

    fn oriented(m: ArrayView2<'_, f32>, op: Op) -> ArrayView2<'_, f32> {
        match op {
            Op::AsIs => m,
            Op::Transposed => m.reversed_axes(),
        }
    }

    /// `x · Wᵀ` without autodiff.
    pub fn x_wt(x: NdArrayTensor, w: NdArrayTensor) -> NdArrayTensor {
        gemm(&x, Op::AsIs, &w, Op::Transposed)
    }

    /// `x · W` without autodiff (a plain product, on every pool thread).
    pub fn x_w(x: NdArrayTensor, w: NdArrayTensor) -> NdArrayTensor {
        gemm(&x, Op::AsIs, &w, Op::AsIs)
    }

    /// The backward step of `y = x · Wᵀ`.
    #[derive(Debug)]
    struct XWtBackward;

    impl Backward<NdArray, 2> for XWtBackward {
        /// x (kept when W needs a gradient) and W (kept when x needs one).
        type State = (Option<NdArrayTensor>, Option<NdArrayTensor>);

        fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
            let (x, w) = ops.state;
            binary::<NdArray, _, _>(
                ops.parents,
                ops.node,
                grads,
                // ∂x [N, in] = ∂y [N, out] · W [out, in]
                |grad| gemm(&grad, Op::AsIs, &w.expect("W saved for ∂x"), Op::AsIs),
                // ∂W [out, in] = ∂yᵀ [out, N] · x [N, in]
                |grad| gemm(&grad, Op::Transposed, &x.expect("x saved for ∂W"), Op::AsIs),
            );
        }
    }

    /// `x · Wᵀ` on the autodiff NdArray backend.
    pub fn tracked(
        x: FloatTensor<Autodiff<NdArray, NoCheckpointing>>,
        w: FloatTensor<Autodiff<NdArray, NoCheckpointing>>,
    ) -> FloatTensor<Autodiff<NdArray, NoCheckpointing>> {
        let (x_needs_grad, w_needs_grad) = (x.is_tracked(), w.is_tracked());
        let prep = XWtBackward
            .prepare::<NoCheckpointing>([x.node(), w.node()])
            .compute_bound()
            .stateful();
        let y = x_wt(x.primitive().clone(), w.primitive().clone());
        match prep {
            OpsKind::Tracked(prep) => {
                let state = (
                    w_needs_grad.then(|| x.into_primitive()),
                    x_needs_grad.then(|| w.into_primitive()),
                );
                prep.finish(state, y)
            }
            OpsKind::UnTracked(prep) => prep.finish(y),
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Distribution, Tensor};

    use super::matmul_wt;
    use crate::device::DeviceKind;
    use crate::kernels::values::max_abs_diff;

    /// Against burn's matmul on the transposed view, for one row (the matrix-vector path) and
    /// many, on every CPU backend compiled in.
    #[test]
    fn forward_matches_burn_matmul() {
        for kind in DeviceKind::cpu_backends() {
            let device = kind.open().unwrap();
            for rows in [1, 7] {
                let x = Tensor::<2>::random([rows, 48], Distribution::Normal(0.0, 1.0), &device);
                let w = Tensor::<2>::random([40, 48], Distribution::Normal(0.0, 1.0), &device);
                let ours = matmul_wt(x.clone(), w.clone());
                let burn = x.matmul(w.transpose());
                assert_eq!(ours.dims(), [rows, 40]);
                let err = max_abs_diff(ours, burn);
                assert!(err < 1e-4, "{kind}, {rows} rows: max |diff| {err}");
            }
        }
    }

    /// ∂x and ∂W of sum(y ⊙ g) against burn's autodiff of the plain matmul.
    #[test]
    fn gradients_match_burn_autodiff() {
        // The second shape's output is large enough for napkin's own op on Flex
        // (`x_wt::SMALLEST_OUTPUT_BYTES`); the first stays with burn's matmul there.
        let large = crate::kernels::cpu::fused::x_wt::SMALLEST_OUTPUT_BYTES / (4 * 8);
        for (kind, (rows, out)) in DeviceKind::cpu_backends()
            .into_iter()
            .flat_map(|kind| [(kind, (5, 16)), (kind, (8, large))])
        {
            let device = kind.open().unwrap().autodiff();
            let x0 = Tensor::<2>::random([rows, 24], Distribution::Normal(0.0, 1.0), &device);
            let w0 = Tensor::<2>::random([out, 24], Distribution::Normal(0.0, 1.0), &device);
            let g = Tensor::<2>::random([rows, out], Distribution::Normal(0.0, 1.0), &device);
            let grads_of = |ours: bool| {
                let x = x0.clone().require_grad();
                let w = w0.clone().require_grad();
                let y = if ours {
                    matmul_wt(x.clone(), w.clone())
                } else {
                    x.clone().matmul(w.clone().transpose())
                };
                let grads = (y * g.clone()).sum().backward();
                (x.grad(&grads).unwrap(), w.grad(&grads).unwrap())
            };
            let (dx, dw) = grads_of(true);
            let (dx_ref, dw_ref) = grads_of(false);
            assert_eq!(dw.dims(), [out, 24]);
            let err = max_abs_diff(dx, dx_ref).max(max_abs_diff(dw, dw_ref));
            assert!(err < 1e-4, "{kind}, [{rows}, {out}]: max |grad diff| {err}");
        }
    }
}
