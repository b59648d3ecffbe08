//! Attention of a few new queries over the KV cache in one launch on a GPU (cubecl):
//! generation's attention, one new token at a time. burn's ops take nine launches for it (the
//! scores' product, the scale, the mask, a four-op softmax, the values' product and the heads'
//! merge), each over a few hundred values; launches, not bytes, are a decoded token's cost on
//! a GPU.
//!
//! Per query row and head: `s_j = (q·k_j)·(1/√Dh) + mask_j`, `p_j = exp(s_j − max s) / Σ exp`,
//! `out = Σ_j p_j·v_j` — the order of burn's softmax (`softmax` in `burn::tensor::activation`),
//! equal to it up to the order of the sums. Query head `h` reads K/V head `h / (H / Hkv)`
//! (grouped-query attention, no repeated K/V).
//!
//! Only untracked inputs of at most [`ROWS_IN_ONE_LAUNCH`] new tokens take it: training's and
//! checkpointing's forwards, which the memory predictor replays op by op, have no cache and keep
//! burn's ops.
//!
//! # Shapes
//! - `q`: `[B, H, T, Dh]`, `keys`, `values`: `[B, Hkv, S, Dh]`, `mask`: additive
//!   `[1 or B, 1, T, S]`, all f32 of any layout, `B·T ≤ ROWS_IN_ONE_LAUNCH` → `[B, T, H·Dh]`
//!   f32, the heads side by side (the output projection's input)

use burn::tensor::Tensor;

pub use super::ROWS_IN_ONE_LAUNCH;

/// The attention of `q` over `keys`/`values` in one launch when they are a few untracked f32
/// rows on a GPU; `None` otherwise (the caller runs burn's ops).
pub fn few_rows(
    q: &Tensor<4>,
    keys: &Tensor<4>,
    values: &Tensor<4>,
    mask: &Tensor<4>,
) -> Option<Tensor<3>> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        use super::{few_rows_on_gpu, result_like, untracked_f32};
        let [b, h, t, dh] = q.dims();
        let [kb, hkv, s, kdh] = keys.dims();
        let [mb, mh, mt, ms] = mask.dims();
        let shapes_agree = kb == b
            && kdh == dh
            && hkv > 0
            && h % hkv == 0
            && values.dims() == keys.dims()
            && (mb == 1 || mb == b)
            && [mh, mt, ms] == [1, t, s]
            && s > 0;
        if !shapes_agree || !few_rows_on_gpu(b * t, &q.device()) {
            return None;
        }
        let out = device::attention_rows(
            untracked_f32(q)?,
            untracked_f32(keys)?,
            untracked_f32(values)?,
            untracked_f32(mask)?,
            (dh as f64).powf(-0.5) as f32,
        );
        Some(result_like(out, q))
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = (q, keys, values, mask);
        None
    }
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod device {
    use burn_backend::DType;
    use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
    use burn_cubecl::tensor::CubeTensor;
    use cubecl::prelude::*;

    use crate::kernels::gpu::reduce::{UNITS, halve_to_two};

    /// One cube per (batch row, head, new token). Each unit scores every 64th key from its own
    /// (writing the scores to `scores`, its row of the scratch), the cube takes their maximum,
    /// each unit turns its scores into `exp(s − max)` and the cube sums them; then each unit
    /// sums `p_j·v_j` for every 64th value of the head. The reductions are
    /// `reduce::halve_to_two`'s (every barrier at the kernel's top level); the last barrier
    /// before the values' sum is a storage one, as each unit reads the probabilities the others
    /// wrote.
    #[cube(launch_unchecked)]
    fn attend_rows(
        q: &Tensor<f32>,
        keys: &Tensor<f32>,
        values: &Tensor<f32>,
        mask: &Tensor<f32>,
        scores: &mut Tensor<f32>,
        output: &mut Tensor<f32>,
        scale: f32,
    ) {
        let unit = UNIT_POS_X as usize;
        let row = CUBE_POS_X as usize;
        let heads = q.shape(1);
        let tokens = q.shape(2);
        let head_dim = q.shape(3);
        let seen = keys.shape(2);
        let group = heads / keys.shape(1);
        let b = row / (heads * tokens);
        let h = (row / tokens) % heads;
        let t = row % tokens;
        let kv_head = h / group;
        let q_at = b * q.stride(0) + h * q.stride(1) + t * q.stride(2);
        let k_at = b * keys.stride(0) + kv_head * keys.stride(1);
        let v_at = b * values.stride(0) + kv_head * values.stride(1);
        let mask_row = if mask.shape(0) == 1 { 0usize } else { b };
        let mask_at = mask_row * mask.stride(0) + t * mask.stride(2);
        let score_at = row * scores.stride(0);

        // A finite floor, not −∞: WGSL has no infinite literals. Masked scores are −1e9.
        let mut largest = f32::new(-3.0e38);
        let mut j = unit;
        while j < seen {
            let key = k_at + j * keys.stride(2);
            let mut dot = 0.0f32;
            for d in 0..head_dim {
                dot += q[q_at + d * q.stride(3)] * keys[key + d * keys.stride(3)];
            }
            let score = dot * scale + mask[mask_at + j * mask.stride(3)];
            scores[score_at + j] = score;
            largest = max(largest, score);
            j += 64;
        }
        let mut partial = Shared::<[f32]>::new_slice(64usize);
        partial[unit] = largest;
        sync_cube();
        halve_to_two(&mut partial, unit, true);
        sync_cube();
        let top = max(partial[0], partial[1]);
        sync_cube();

        let mut sum = 0.0f32;
        let mut j = unit;
        while j < seen {
            let e = f32::exp(scores[score_at + j] - top);
            scores[score_at + j] = e;
            sum += e;
            j += 64;
        }
        partial[unit] = sum;
        sync_cube();
        halve_to_two(&mut partial, unit, false);
        sync_storage();
        let total = partial[0] + partial[1];

        let out_step = output.stride(2);
        let out_at = b * output.stride(0) + t * output.stride(1) + h * head_dim * out_step;
        let mut d = unit;
        while d < head_dim {
            let mut acc = 0.0f32;
            for j in 0..seen {
                let p = scores[score_at + j] / total;
                acc += p * values[v_at + j * values.stride(2) + d * values.stride(3)];
            }
            output[out_at + d * out_step] = acc;
            d += 64;
        }
    }

    /// `q`: `[B, H, T, Dh]`, `keys`, `values`: `[B, Hkv, S, Dh]`, `mask`: `[1 or B, 1, T, S]`,
    /// any layout → `[B, T, H·Dh]` contiguous.
    pub(super) fn attention_rows(
        q: CubeTensor,
        keys: CubeTensor,
        values: CubeTensor,
        mask: CubeTensor,
        scale: f32,
    ) -> CubeTensor {
        let [b, h, t, dh] = [0, 1, 2, 3].map(|i| q.meta.shape()[i]);
        let seen = keys.meta.shape()[2];
        let client = q.client.clone();
        let device = q.device.clone();
        let rows = b * h * t;
        let scores = empty_device_contiguous_dtype(
            client.clone(),
            device.clone(),
            [rows, seen].into(),
            DType::F32,
        );
        let output = empty_device_contiguous_dtype(
            client.clone(),
            device,
            [b, t, h * dh].into(),
            DType::F32,
        );
        // Safety: cube `row < B·H·T` reads q's row `(b, h, t)` (`d < Dh`), the keys and values
        // of K/V head `h / (H / Hkv) < Hkv` (`j < S`, `d < Dh`) and the mask's row `(b or 0, t)`
        // (`j < S`) through their own shapes and strides (checked to agree by `few_rows`);
        // writes its own row of `scores` (`[B·H·T, S]`, `j < S`) and `output[b, t, h·Dh + d]`
        // (`[B, T, H·Dh]`); the shared slice is 64 values, indexed below 64.
        unsafe {
            attend_rows::launch_unchecked(
                &client,
                CubeCount::Static(rows as u32, 1, 1),
                CubeDim::new_1d(UNITS as u32),
                q.into_tensor_arg(),
                keys.into_tensor_arg(),
                values.into_tensor_arg(),
                mask.into_tensor_arg(),
                scores.into_tensor_arg(),
                output.clone().into_tensor_arg(),
                scale,
            );
        }
        output
    }
}
