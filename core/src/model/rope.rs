//! Rotary position embedding in Hugging Face's "rotate half" convention.
//!
//! For a head vector `x` of width Dh, with `x1 = x[..Dh/2]` and `x2 = x[Dh/2..]`:
//! `rope(x) = x ⊙ cos + cat(−x2, x1) ⊙ sin`, where `cos[p, j] = cos(p · inv_freq[j mod Dh/2])`.
//! The tables are computed on the host, in float32 exactly as transformers does (the angle is
//! an f32 product), only for the positions a batch uses.

use std::sync::Arc;

use burn::tensor::{DType, Device, FloatDType, Tensor, TensorData};

use crate::config::{LlamaConfig, RopeScaling};
use crate::device::link::{self, Traffic};
use crate::kernels::cpu::fused::rope::{HostTables, rope};

/// The Dh/2 inverse frequencies of a config, in float32, with Llama 3 scaling applied.
pub fn inverse_frequencies(config: &LlamaConfig) -> Vec<f32> {
    let dim = config.head_dim;
    let theta = config.rope_theta as f32;
    let plain = (0..dim / 2).map(|j| 1.0 / theta.powf((2 * j) as f32 / dim as f32));
    match config.rope_scaling {
        RopeScaling::Default => plain.collect(),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            let (factor, low, high, old_len) = (
                factor as f32,
                low_freq_factor as f32,
                high_freq_factor as f32,
                original_max_position_embeddings as f32,
            );
            let low_freq_wavelen = old_len / low;
            let high_freq_wavelen = old_len / high;
            plain
                .map(|f| {
                    let wavelen = 2.0 * std::f32::consts::PI / f;
                    if wavelen < high_freq_wavelen {
                        f // high frequency: kept
                    } else if wavelen > low_freq_wavelen {
                        f / factor // low frequency: slowed down
                    } else {
                        // In between: interpolate smoothly between the two.
                        let smooth = (old_len / wavelen - low) / (high - low);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect()
        }
    }
}

/// Host-side cos/sin tables, `[N, Dh]` each, for a list of N positions.
pub fn tables(inv_freq: &[f32], positions: &[u32]) -> (Vec<f32>, Vec<f32>) {
    let half = inv_freq.len();
    let mut cos = Vec::with_capacity(positions.len() * 2 * half);
    let mut sin = Vec::with_capacity(positions.len() * 2 * half);
    for &p in positions {
        // The frequencies are repeated twice along the head axis.
        for _ in 0..2 {
            for &f in inv_freq {
                let angle = p as f32 * f; // f32 product, as transformers computes it
                cos.push((angle as f64).cos() as f32);
                sin.push((angle as f64).sin() as f32);
            }
        }
    }
    (cos, sin)
}

/// The cos/sin tables of a batch as tensors ready to broadcast over heads.
#[derive(Debug, Clone)]
pub struct RopeTables {
    /// `[B, 1, T, Dh]`.
    pub cos: Tensor<4>,
    /// `[B, 1, T, Dh]`.
    pub sin: Tensor<4>,
    /// The same values on the host, for the fused CPU op.
    host: HostTables,
}

impl RopeTables {
    /// Tables for `positions` laid out `[B, T]` row-major.
    pub fn new(
        inv_freq: &[f32],
        positions: &[u32],
        batch: usize,
        seq: usize,
        device: &Device,
    ) -> Self {
        let head_dim = 2 * inv_freq.len();
        let (cos, sin) = tables(inv_freq, positions);
        let host = HostTables {
            cos: Arc::from(cos.as_slice()),
            sin: Arc::from(sin.as_slice()),
            head_dim,
        };
        let [cos, sin] = Self::data_of(cos, sin, batch, seq, head_dim);
        RopeTables {
            cos: link::upload(cos, device, Traffic::Data),
            sin: link::upload(sin, device, Traffic::Data),
            host,
        }
    }

    /// The cos and sin tables of [`RopeTables::new`] as `[B, 1, T, Dh]` host data.
    pub fn data(inv_freq: &[f32], positions: &[u32], batch: usize, seq: usize) -> [TensorData; 2] {
        let (cos, sin) = tables(inv_freq, positions);
        Self::data_of(cos, sin, batch, seq, 2 * inv_freq.len())
    }

    fn data_of(
        cos: Vec<f32>,
        sin: Vec<f32>,
        batch: usize,
        seq: usize,
        head_dim: usize,
    ) -> [TensorData; 2] {
        let shape = [batch, 1, seq, head_dim];
        [TensorData::new(cos, shape), TensorData::new(sin, shape)]
    }

    /// The tables on the host.
    pub fn host_tables(&self) -> HostTables {
        self.host.clone()
    }

    /// Splits a projection into heads and rotates them: one fused pass on the CPU backends
    /// ([`crate::kernels::cpu::fused::rope`]), for generation's few rows on a GPU
    /// ([`crate::kernels::gpu::rope_rows`]) and for the rest on a GPU (`kernels::gpu::fused::rope`,
    /// which writes the heads contiguous, so no copy precedes the products that read them),
    /// [`RopeTables::apply`] elsewhere.
    ///
    /// # Shapes
    /// - `y`: `[B, T, n·Dh]` → `[B, n, T, Dh]`
    pub fn rotate_heads(&self, y: Tensor<3>, heads: usize) -> Tensor<4> {
        self.rotate_heads_as(y, heads, None)
    }

    /// [`RopeTables::rotate_heads`] whose heads come out in `dtype` (None: f32): on a GPU the
    /// kernel writes them so (the attention under autocast), elsewhere they are cast.
    ///
    /// # Shapes
    /// - `y`: `[B, T, n·Dh]` → `[B, n, T, Dh]`
    pub fn rotate_heads_as(
        &self,
        y: Tensor<3>,
        heads: usize,
        dtype: Option<FloatDType>,
    ) -> Tensor<4> {
        let rotated = self.rotate_heads_maybe_in(y, heads, dtype);
        match dtype {
            Some(dtype) if rotated.dtype() != DType::from(dtype) => rotated.cast(dtype),
            _ => rotated,
        }
    }

    /// The rotated heads, in `dtype` where the GPU kernel wrote them so, else in f32.
    fn rotate_heads_maybe_in(
        &self,
        y: Tensor<3>,
        heads: usize,
        dtype: Option<FloatDType>,
    ) -> Tensor<4> {
        let [b, t, _] = y.dims();
        let heads_of = |y: Tensor<3>| y.reshape([b, t, heads, self.host.head_dim]).swap_dims(1, 2);
        // Generation's new token on a GPU: one launch instead of six.
        if let Some(rotated) = crate::kernels::gpu::rope_rows::few_rows(&y, &self.cos, &self.sin) {
            return heads_of(rotated);
        }
        let y = match rope(y, &self.host) {
            Ok(rotated) => return heads_of(rotated),
            Err(y) => y,
        };
        // The GPU backends: the same rotation and keeps as a cubecl kernel, which writes the
        // heads' layout itself (no copy before the products read them).
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        let y = {
            let out = dtype.map_or(DType::F32, DType::from);
            match crate::kernels::gpu::fused::rope::rope_heads(y, &self.cos, &self.sin, heads, out)
            {
                Ok(rotated) => return rotated,
                Err(y) => y,
            }
        };
        #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
        let _ = dtype;
        self.apply(heads_of(y))
    }

    /// Rotates every head of `x`.
    ///
    /// # Shapes
    /// - `x`: `[B, H, T, Dh]` → `[B, H, T, Dh]`
    pub fn apply(&self, x: Tensor<4>) -> Tensor<4> {
        let [_, _, _, dh] = x.dims();
        let half = dh / 2;
        let x1 = x.clone().narrow(3, 0, half); // [B, H, T, Dh/2]
        let x2 = x.clone().narrow(3, half, half); // [B, H, T, Dh/2]
        let rotated = Tensor::cat(vec![x2.neg(), x1], 3); // [B, H, T, Dh]
        x * self.cos.clone() + rotated * self.sin.clone()
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Distribution, Tensor};

    use super::RopeTables;
    use crate::device::DeviceKind;
    use crate::kernels::cpu::fused::rope::rope;
    use crate::kernels::values::max_abs_diff;

    /// Values and `∂x` of the fused rotation equal burn's rotate-half ops
    /// ([`RopeTables::apply`]), for two batch rows at different positions and three heads, on
    /// every CPU backend; the graph-free path gives the same values.
    #[test]
    fn fused_rope_matches_the_tensor_ops() {
        let (b, t, n, dh) = (2, 5, 3, 8);
        let inv_freq: Vec<f32> = (0..dh / 2)
            .map(|j| 1.0 / 10_000f32.powf((2 * j) as f32 / dh as f32))
            .collect();
        let positions: Vec<u32> = (0..5).chain(700..705).collect();
        for kind in DeviceKind::cpu_backends() {
            let device = kind.open().unwrap().autodiff();
            let tables = RopeTables::new(&inv_freq, &positions, b, t, &device);
            let x0 = Tensor::<3>::random([b, t, n * dh], Distribution::Normal(0.0, 1.0), &device);
            let w = Tensor::<4>::random([b, n, t, dh], Distribution::Normal(0.0, 1.0), &device);
            let run = |fused: bool| {
                let x = x0.clone().require_grad();
                let y = if fused {
                    let rotated = rope(x.clone(), &tables.host_tables())
                        .unwrap_or_else(|_| panic!("{kind}: the fused op did not apply"));
                    rotated.reshape([b, t, n, dh]).swap_dims(1, 2)
                } else {
                    tables.apply(x.clone().reshape([b, t, n, dh]).swap_dims(1, 2))
                };
                let grads = (y.clone() * w.clone()).sum().backward();
                (y, x.grad(&grads).expect("a gradient"))
            };
            let ((y, grad), (y_ref, grad_ref)) = (run(true), run(false));
            assert!(
                max_abs_diff(y.clone().inner(), y_ref.inner()) < 1e-6,
                "{kind}: values"
            );
            assert!(max_abs_diff(grad, grad_ref) < 1e-6, "{kind}: ∂x");
            let graph_free = rope(x0.clone().inner(), &tables.host_tables()).expect("fused");
            let graph_free = graph_free.reshape([b, t, n, dh]).swap_dims(1, 2);
            assert!(
                max_abs_diff(graph_free, y.inner()) < 1e-6,
                "{kind}: graph-free"
            );
        }
    }
}
