//! SwiGLU of a few rows in one launch on a GPU (cubecl): generation's new token's MLP,
//! `silu(gate) ⊙ up`. burn's ops take eight launches for it (its sigmoid is
//! `exp(−ln(1 + exp(−x)))`, five element-wise ops, then two products); launches, not bytes,
//! are a decoded token's cost on a GPU.
//!
//! The same formula as burn's ops, in their order, one unit a value.
//!
//! Only untracked inputs of at most [`ROWS_IN_ONE_LAUNCH`] rows take it: the forwards that the
//! memory predictor replays op by op keep burn's ops.
//!
//! # Shapes
//! - `gate`, `up`: `[B, T, F]` f32 with `B·T ≤ ROWS_IN_ONE_LAUNCH` → `[B, T, F]` f32

use burn::tensor::Tensor;

pub use super::ROWS_IN_ONE_LAUNCH;

/// `silu(gate) ⊙ up` in one launch when both are a few untracked f32 rows on a GPU; `None`
/// otherwise (the caller runs burn's ops).
pub fn few_rows(gate: &Tensor<3>, up: &Tensor<3>) -> Option<Tensor<3>> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        use super::{few_rows_on_gpu, result_like, untracked_f32};
        let [b, t, _] = gate.dims();
        if !few_rows_on_gpu(b * t, &gate.device()) || gate.dims() != up.dims() {
            return None;
        }
        let y = device::swiglu_rows(untracked_f32(gate)?, untracked_f32(up)?);
        Some(result_like(y, gate))
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = (gate, up);
        None
    }
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod device {
    use burn_backend::DType;
    use burn_cubecl::kernel::into_contiguous;
    use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
    use burn_cubecl::tensor::CubeTensor;
    use cubecl::prelude::*;

    /// One unit a value: `g · σ(g) · u` with burn's `σ(g) = exp(−ln(exp(−g) + 1))`.
    #[cube(launch_unchecked)]
    fn swiglu_values(
        gate: &Tensor<f32>,
        up: &Tensor<f32>,
        output: &mut Tensor<f32>,
        values: usize,
    ) {
        let at = ABSOLUTE_POS;
        if at < values {
            let g = gate[at];
            let sigmoid = f32::exp(-f32::ln(f32::exp(-g) + 1.0));
            output[at] = g * sigmoid * up[at];
        }
    }

    /// `gate`, `up`: the same shape, any layout → that shape, contiguous.
    pub(super) fn swiglu_rows(gate: CubeTensor, up: CubeTensor) -> CubeTensor {
        let (gate, up) = (into_contiguous(gate), into_contiguous(up));
        let client = gate.client.clone();
        let values = gate.meta.shape().num_elements();
        let output = empty_device_contiguous_dtype(
            client.clone(),
            gate.device.clone(),
            gate.meta.shape().clone(),
            DType::F32,
        );
        let (cubes, cube_dim) = super::super::one_thread_each(&client, values);
        // Safety: unit `at < values` reads `gate[at]`, `up[at]` and writes `output[at]`, all
        // three contiguous with `values` values.
        unsafe {
            swiglu_values::launch_unchecked(
                &client,
                cubes,
                cube_dim,
                gate.into_tensor_arg(),
                up.into_tensor_arg(),
                output.clone().into_tensor_arg(),
                values,
            );
        }
        output
    }
}
