//! Causal self-attention with RoPE and grouped-query heads (HF "eager" semantics).
//!
//! Grouped-query attention is computed without repeating K and V: the H query heads are
//! viewed as Hkv groups of H/Hkv heads, so each group's queries meet their one shared K/V
//! head in a single batched matmul. No `[B, H, T, Dh]` copy of K or V is ever made.
//!
//! With a [`AttentionMask::Tiled`] mask the softmax runs tile by tile instead
//! (`efficient_attention.rs`) and the `[B, H, T, T]` scores never exist.
//!
//! Under autocast on a GPU the eager attention computes in the 16-bit dtype: RoPE's kernel
//! writes q and k in it, v is cast once, both products and the fused scale, mask and softmax
//! (`kernels/gpu/fused/softmax.rs`, f32 arithmetic) run on 16-bit values, and the output is
//! cast back to f32. The scores, probabilities and their gradients are then half the bytes; the
//! two casts (and their gradients' two) are 4 more launches a layer and step.

use burn::module::Module;
use burn::tensor::{Device, FloatDType, Tensor, activation::softmax};

pub use super::kv_cache::LayerKvCache;
use super::linear::Linear;
use super::rms_norm::RmsNorm;
use super::rope::RopeTables;
use crate::config::LlamaConfig;
use crate::kernels::efficient_attention::{TiledMask, efficient_attention};

/// Which keys each query sees, in the form the chosen attention consumes.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // one mask per forward, moved rarely
pub enum AttentionMask {
    /// Additive, `[1 or B, 1, T, S]`: the eager attention.
    Dense(Tensor<4>),
    /// Causal within segments, built tile by tile: the memory-efficient attention.
    Tiled(TiledMask),
}

/// The attention half of a decoder block.
#[derive(Module, Debug)]
pub struct Attention {
    /// `[H·Dh, D]`.
    pub q_proj: Linear,
    /// `[Hkv·Dh, D]`.
    pub k_proj: Linear,
    /// `[Hkv·Dh, D]`.
    pub v_proj: Linear,
    /// `[D, H·Dh]`.
    pub o_proj: Linear,
    /// Qwen3's RMSNorm of each query head (`[Dh]` gain), before RoPE; `None` for a Llama.
    pub q_norm: Option<RmsNorm>,
    /// Qwen3's RMSNorm of each key head (`[Dh]` gain), before RoPE; `None` for a Llama.
    pub k_norm: Option<RmsNorm>,
    /// H.
    pub num_heads: usize,
    /// Hkv.
    pub num_kv_heads: usize,
    /// Dh.
    pub head_dim: usize,
}

impl Attention {
    /// Fresh projections with HF's initialisation: weights N(0, 0.02), biases (Qwen2's q, k,
    /// v) zero, head norms (Qwen3's) ones.
    pub fn init(config: &LlamaConfig, device: &Device) -> Self {
        let d = config.hidden_size;
        let linear = |module: &str, out: usize, inp: usize| {
            let layer = Linear::init(out, inp, device);
            match config.linear_has_bias(module) {
                true => layer.with_bias(Tensor::zeros([out], device)),
                false => layer,
            }
        };
        let head_norm = || {
            config
                .qk_norm
                .then(|| RmsNorm::init(config.head_dim, config.rms_norm_eps, device))
        };
        Attention {
            q_proj: linear("self_attn.q_proj", config.q_dim(), d),
            k_proj: linear("self_attn.k_proj", config.kv_dim(), d),
            v_proj: linear("self_attn.v_proj", config.kv_dim(), d),
            o_proj: linear("self_attn.o_proj", d, config.q_dim()),
            q_norm: head_norm(),
            k_norm: head_norm(),
            num_heads: config.num_attention_heads,
            num_kv_heads: config.num_key_value_heads,
            head_dim: config.head_dim,
        }
    }

    /// # Shapes
    /// - `x`: `[B, T, D]`
    /// - `rope`: tables `[B, 1, T, Dh]`
    /// - `mask`: dense `[1 or B, 1, T, T]`, or tiled
    /// - returns `[B, T, D]`
    pub fn forward(&self, x: Tensor<3>, rope: &RopeTables, mask: &AttentionMask) -> Tensor<3> {
        match mask {
            AttentionMask::Dense(mask) => self.forward_cached(x, rope, mask, None),
            AttentionMask::Tiled(mask) => {
                let [b, t, _] = x.dims();
                let (q, k, v) = self.project(x, rope, None);
                let out = efficient_attention(q, k, v, mask); // [B, H, T, Dh]
                self.merge_heads(out, b, t)
            }
        }
    }

    /// Queries, keys and values split into heads, the head norms (Qwen3's) and RoPE applied
    /// to the first two, which come out in `half` when given (the GPU's RoPE kernel writes
    /// them so; v stays f32).
    ///
    /// # Shapes
    /// - `x`: `[B, T, D]` → q `[B, H, T, Dh]`, k and v `[B, Hkv, T, Dh]`
    fn project(
        &self,
        x: Tensor<3>,
        rope: &RopeTables,
        half: Option<FloatDType>,
    ) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
        let [b, t, _] = x.dims();
        let (h, hkv, dh) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let heads = |y: Tensor<3>, n: usize| y.reshape([b, t, n, dh]).swap_dims(1, 2); // [B, n, T, Dh]
        let q = norm_heads(self.q_norm.as_ref(), self.q_proj.forward(x.clone()), h);
        let k = norm_heads(self.k_norm.as_ref(), self.k_proj.forward(x.clone()), hkv);
        let q = rope.rotate_heads_as(q, h, half);
        let k = rope.rotate_heads_as(k, hkv, half);
        let v = heads(self.v_proj.forward(x), hkv);
        (q, k, v)
    }

    /// The heads side by side again, through the output projection.
    ///
    /// # Shapes
    /// - `out`: `[B, H, T, Dh]` → `[B, T, D]`
    fn merge_heads(&self, out: Tensor<4>, b: usize, t: usize) -> Tensor<3> {
        let merged = out
            .swap_dims(1, 2)
            .reshape([b, t, self.num_heads * self.head_dim]); // [B, T, H·Dh]
        self.o_proj.forward(merged)
    }

    /// The forward pass with an optional key/value cache: the new keys and values are appended
    /// to the cached ones and the queries attend to all of them (generation).
    ///
    /// # Shapes
    /// - `x`: `[B, T, D]` (the new tokens only)
    /// - `mask`: additive, `[1 or B, 1, T, S]` with S = cached + T keys
    /// - returns `[B, T, D]`
    pub fn forward_cached(
        &self,
        x: Tensor<3>,
        rope: &RopeTables,
        mask: &Tensor<4>,
        cache: Option<&mut LayerKvCache>,
    ) -> Tensor<3> {
        let [b, t, _] = x.dims();
        let (h, hkv, dh) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let group = h / hkv; // query heads per K/V head

        // Under autocast on a GPU the `[B, H, T, S]` tensors are 16-bit, as PyTorch's
        // attention under autocast: q and k rotated into 16 bits by RoPE's kernel, v cast
        // once, both products and the fused softmax in the low precision (the softmax's
        // arithmetic in f32), the output cast back. Not with a KV cache (generation), which
        // keeps f32 keys and values.
        let half = match cache {
            None => sixteen_bit_attention(&x.device()),
            Some(_) => None,
        };
        let (q, k, v) = self.project(x, rope, half); // [B, H, T, Dh], [B, Hkv, T, Dh] ×2
        let (k, v) = match cache {
            Some(cache) => cache.append(k, v), // [B, Hkv, S, Dh]
            None => (k, v),
        };
        // Generation's new token on a GPU: one launch instead of nine.
        if let Some(out) = crate::kernels::gpu::attention_rows::few_rows(&q, &k, &v, mask) {
            return self.o_proj.forward(out); // [B, T, H·Dh] → [B, T, D]
        }
        let s = k.dims()[2];

        let v = match half {
            Some(dtype) => v.cast(dtype),
            None => v,
        };
        // Query head h_q = g·group + r uses K/V head g: fold the group into the row axis.
        let q = q.reshape([b, hkv, group * t, dh]); // [B, Hkv, group·T, Dh]
        let scale = (dh as f64).powf(-0.5);
        let scores = q.matmul(k.swap_dims(2, 3)).reshape([b, h, t, s]); // [B, H, T, S]
        let probs = scaled_masked_softmax(scores, scale, mask).reshape([b, hkv, group * t, s]);
        let out = probs.matmul(v); // [B, Hkv, group·T, Dh]
        let out = match half {
            Some(_) => out.cast(FloatDType::F32),
            None => out,
        };
        self.merge_heads(out.reshape([b, h, t, dh]), b, t)
    }
}

/// The 16-bit dtype the eager attention computes in: autocast's, on a GPU backend (where the
/// fused softmax reads and writes it); None elsewhere (the CPU backends' softmax is burn's f32
/// ops, and their 16-bit products widen to f32 anyway, `model/autocast.rs`).
fn sixteen_bit_attention(device: &Device) -> Option<FloatDType> {
    let dtype = super::autocast::compute_dtype()?;
    crate::device::is_gpu(device).then_some(dtype)
}

/// `softmax(scores · scale + mask)` over the keys: one fused op each way on a GPU
/// (`kernels::gpu::fused::softmax`), burn's ops elsewhere.
///
/// # Shapes
/// - `scores`: `[B, H, T, S]`, `mask`: `[1 or B, 1, T, S]` → `[B, H, T, S]`
fn scaled_masked_softmax(scores: Tensor<4>, scale: f64, mask: &Tensor<4>) -> Tensor<4> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    let scores =
        match crate::kernels::gpu::fused::softmax::scaled_masked_softmax(scores, scale, mask) {
            Ok(probs) => return probs,
            Err(scores) => scores,
        };
    softmax(scores * scale + mask.clone(), 3)
}

/// Qwen3's RMSNorm over each head's `Dh` values, if the model has one: the projection's rows
/// viewed as one row per (token, head).
///
/// # Shapes
/// - `y`: `[B, T, n·Dh]` → `[B, T, n·Dh]`
fn norm_heads(norm: Option<&RmsNorm>, y: Tensor<3>, heads: usize) -> Tensor<3> {
    let Some(norm) = norm else { return y };
    let [b, t, width] = y.dims();
    norm.forward(y.reshape([b, t * heads, width / heads])) // [B, T·n, Dh]
        .reshape([b, t, width])
}
