//! Rotary position embedding of a few rows in one launch on a GPU (cubecl): generation's new
//! token's queries and keys. burn's rotate-half ops take six launches for each (the negation,
//! the concatenation's allocation and two copies, two products and a sum); launches, not
//! bytes, are a decoded token's cost on a GPU.
//!
//! `rope(x) = x ⊙ cos + cat(−x2, x1) ⊙ sin` for each head, the order of burn's ops
//! (`model/rope.rs::RopeTables::apply`).
//!
//! Only untracked inputs of at most [`ROWS_IN_ONE_LAUNCH`] rows take it: the forwards that the
//! memory predictor replays op by op keep burn's ops.
//!
//! # Shapes
//! - `y`: `[B, T, n·Dh]` f32 (a projection, heads not split yet) with `B·T ≤
//!   ROWS_IN_ONE_LAUNCH`, `cos`, `sin`: `[B, 1, T, Dh]` f32 → `[B, T, n·Dh]` f32

use burn::tensor::Tensor;

pub use super::ROWS_IN_ONE_LAUNCH;

/// Every head of `y` rotated in one launch when `y` is a few untracked f32 rows on a GPU;
/// `None` otherwise (the caller runs burn's ops).
pub fn few_rows(y: &Tensor<3>, cos: &Tensor<4>, sin: &Tensor<4>) -> Option<Tensor<3>> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        use super::{few_rows_on_gpu, result_like, untracked_f32};
        let [b, t, width] = y.dims();
        let [tb, one, tt, head_dim] = cos.dims();
        let takes = few_rows_on_gpu(b * t, &y.device())
            && [tb, one, tt] == [b, 1, t]
            && sin.dims() == cos.dims()
            && head_dim % 2 == 0
            && head_dim > 0
            && width % head_dim == 0;
        if !takes {
            return None;
        }
        let rotated = device::rope_rows(
            untracked_f32(y)?,
            untracked_f32(cos)?,
            untracked_f32(sin)?,
            width,
            head_dim,
        );
        Some(result_like(rotated, y))
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = (y, cos, sin);
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

    /// One unit a value: value `j` of a head in row `r` is `y[j]·cos[r, j]` plus its partner
    /// (`−y[j + Dh/2]` in the first half, `y[j − Dh/2]` in the second) times `sin[r, j]`.
    #[cube(launch_unchecked)]
    fn rotate_rows(
        y: &Tensor<f32>,
        cos: &Tensor<f32>,
        sin: &Tensor<f32>,
        output: &mut Tensor<f32>,
        values: usize,
        width: usize,
        head_dim: usize,
    ) {
        let at = ABSOLUTE_POS;
        if at < values {
            let row = at / width;
            let j = at % head_dim;
            let half = head_dim / 2;
            let table = row * head_dim + j;
            let partner = if j < half {
                -y[at + half]
            } else {
                y[at - half]
            };
            output[at] = y[at] * cos[table] + partner * sin[table];
        }
    }

    /// `y`: `rows × width` values of any layout; `cos`, `sin`: `rows × head_dim` → `y`'s shape,
    /// contiguous.
    pub(super) fn rope_rows(
        y: CubeTensor,
        cos: CubeTensor,
        sin: CubeTensor,
        width: usize,
        head_dim: usize,
    ) -> CubeTensor {
        let y = into_contiguous(y);
        let (cos, sin) = (into_contiguous(cos), into_contiguous(sin));
        let client = y.client.clone();
        let values = y.meta.shape().num_elements();
        let output = empty_device_contiguous_dtype(
            client.clone(),
            y.device.clone(),
            y.meta.shape().clone(),
            DType::F32,
        );
        let (cubes, cube_dim) = super::super::one_thread_each(&client, values);
        // Safety: unit `at < values` reads `y[at]` and its partner in the same head (`at ± Dh/2`
        // stays within the head: j < Dh/2 adds, j ≥ Dh/2 subtracts), `cos`/`sin` at
        // `row · Dh + j` (below rows · Dh, the tables' size), and writes `output[at]` (y's shape).
        unsafe {
            rotate_rows::launch_unchecked(
                &client,
                cubes,
                cube_dim,
                y.into_tensor_arg(),
                cos.into_tensor_arg(),
                sin.into_tensor_arg(),
                output.clone().into_tensor_arg(),
                values,
                width,
                head_dim,
            );
        }
        output
    }
}
