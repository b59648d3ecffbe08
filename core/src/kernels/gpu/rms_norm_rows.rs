//! RMSNorm of a few rows in one launch on a GPU (cubecl): generation's norms, one new token at
//! a time. burn's ops take seven launches for it (square, mean, + ε, square root, reciprocal,
//! two products), each a few hundred values; launches, not bytes, are a decoded token's cost
//! on a GPU.
//!
//! `y = g ⊙ (x · 1/√(mean(x²) + ε))`, the order of burn's ops (`kernels/cpu/fused/rms_norm.rs`),
//! equal to them up to the order of the sum of squares.
//!
//! Only untracked inputs of at most [`ROWS_IN_ONE_LAUNCH`] rows take it: the forwards that the
//! memory predictor replays op by op (training's, checkpointing's graph-free block forward)
//! keep burn's ops.
//!
//! # Shapes
//! - `x`: `[B, T, D]` f32 with `B·T ≤ ROWS_IN_ONE_LAUNCH`, `gain`: `[D]` f32 → `[B, T, D]` f32

use burn::tensor::Tensor;

pub use super::ROWS_IN_ONE_LAUNCH;

/// `rms_norm(x, gain, eps)` in one launch when `x` is a few untracked f32 rows on a GPU; `None`
/// otherwise (the caller runs burn's ops).
pub fn few_rows(x: &Tensor<3>, gain: &Tensor<1>, eps: f64) -> Option<Tensor<3>> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        use super::{few_rows_on_gpu, result_like, untracked_f32};
        let [b, t, dim] = x.dims();
        if !few_rows_on_gpu(b * t, &x.device()) || gain.dims() != [dim] {
            return None;
        }
        let x_rows = untracked_f32(x)?;
        let gain_row = untracked_f32(&gain.clone().unsqueeze::<3>())?;
        let y = device::rms_norm_rows(x_rows, gain_row, b * t, dim, eps as f32);
        Some(result_like(y, x))
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = (x, gain, eps);
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

    use crate::kernels::gpu::reduce::{UNITS, halve_to_two};

    /// One cube a row: each unit sums the squares of every 64th value from its own, the 64
    /// sums are added in shared memory (`reduce::halve_to_two`, every barrier at the
    /// kernel's top level), then each unit writes its values.
    #[cube(launch_unchecked)]
    fn rms_norm_of_rows(
        x: &Tensor<f32>,
        gain: &Tensor<f32>,
        output: &mut Tensor<f32>,
        dim: usize,
        eps: f32,
    ) {
        let unit = UNIT_POS_X as usize;
        let start = CUBE_POS_X as usize * dim;
        let mut sum = 0.0f32;
        let mut i = unit;
        while i < dim {
            let value = x[start + i];
            sum += value * value;
            i += 64;
        }
        let mut partial = Shared::<[f32]>::new_slice(64usize);
        partial[unit] = sum;
        sync_cube();
        halve_to_two(&mut partial, unit, false);
        sync_cube();
        let mean_square = (partial[0] + partial[1]) / f32::cast_from(dim);
        let inverse = 1.0f32 / f32::sqrt(mean_square + eps);
        let mut i = unit;
        while i < dim {
            output[start + i] = gain[i] * (x[start + i] * inverse);
            i += 64;
        }
    }

    /// `x`: `rows × dim` values of any layout, `gain`: `dim` values → `[.., dim]` contiguous,
    /// `x`'s shape.
    pub(super) fn rms_norm_rows(
        x: CubeTensor,
        gain: CubeTensor,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> CubeTensor {
        let x = into_contiguous(x);
        let gain = into_contiguous(gain);
        let client = x.client.clone();
        let output = empty_device_contiguous_dtype(
            client.clone(),
            x.device.clone(),
            x.meta.shape().clone(),
            DType::F32,
        );
        // Safety: cube r < rows reads `x[r·dim ..][..dim]` (x is contiguous with rows · dim
        // values), `gain[..dim]`, and writes `output[r·dim ..][..dim]` (x's shape, contiguous);
        // the shared slice is 64 values, indexed below 64.
        unsafe {
            rms_norm_of_rows::launch_unchecked(
                &client,
                CubeCount::Static(rows as u32, 1, 1),
                CubeDim::new_1d(UNITS as u32),
                x.into_tensor_arg(),
                gain.into_tensor_arg(),
                output.clone().into_tensor_arg(),
                dim,
                eps,
            );
        }
        output
    }
}
