//! A linear layer in Hugging Face layout, `y = x Wᵀ (+ b)` with `W: [out, in]`, whose base
//! weight is either dense or NF4-quantized, optionally with a LoRA adapter on top:
//! `y = x Wᵀ + s · (dropout(x) Aᵀ) Bᵀ + b`. Llama's linears have no bias; Qwen2's q, k and v
//! do (`LlamaConfig::qkv_bias`), and it is always a float `[out]` vector, NF4 base or not.
//!
//! burn's own `nn::Linear` stores `[in, out]`; keeping HF's layout means checkpoints load
//! without a transpose and LoRA/NF4 shapes read the same as in peft and bitsandbytes.

use std::sync::Arc;

use burn::module::{Module, Param};
use burn::tensor::{Device, Distribution, Tensor};

use super::autocast::linear_matmul;
use super::lora::LoraAdapter;
use super::nf4_matmul::{nf4_lora_from_codes, nf4_matmul};
pub use super::nf4_weight::Nf4Weight;
use crate::quant::nf4::Nf4Tensor;

/// The base weight of a linear layer.
#[derive(Module, Debug)]
pub enum BaseWeight {
    /// A float `[out, in]` parameter (trainable unless frozen).
    Dense(Param<Tensor<2>>),
    /// NF4 codes and scales, always frozen; see `nf4_matmul.rs`.
    Nf4(Nf4Weight),
}

/// `y = x Wᵀ (+ LoRA)`.
#[derive(Module, Debug)]
pub struct Linear {
    /// W: `[out, in]`.
    pub base: BaseWeight,
    /// The optional low-rank adapter.
    pub lora: Option<LoraAdapter>,
    /// b: `[out]`, added last (Qwen2's q, k, v).
    pub bias: Option<Param<Tensor<1>>>,
}

impl Linear {
    /// Wraps an existing dense `[out, in]` weight.
    pub fn from_weight(weight: Tensor<2>) -> Self {
        Linear {
            base: BaseWeight::Dense(Param::from_tensor(weight)),
            lora: None,
            bias: None,
        }
    }

    /// A layer whose `[out, in]` weight is quantized to NF4 straight from its values, so no
    /// float copy of it is ever made on the device (loading for QLoRA); on a GPU the codes are
    /// uploaded to `device` once.
    pub fn nf4_from_values(
        values: &[f32],
        out_features: usize,
        in_features: usize,
        config: &crate::config::Nf4Config,
        device: &Device,
    ) -> crate::error::Result<Self> {
        let quantized = Nf4Tensor::quantize(values, &[out_features, in_features], config)?;
        Ok(Self::nf4(Arc::new(quantized), device))
    }

    /// A layer with an NF4 base of these codes, placed for `device`.
    pub fn nf4(quantized: Arc<Nf4Tensor>, device: &Device) -> Self {
        Linear {
            base: BaseWeight::Nf4(Nf4Weight::new(quantized, device)),
            lora: None,
            bias: None,
        }
    }

    /// A fresh dense layer with HF's initialisation, N(0, 0.02).
    pub fn init(out_features: usize, in_features: usize, device: &Device) -> Self {
        let weight = Tensor::random(
            [out_features, in_features],
            Distribution::Normal(0.0, 0.02),
            device,
        );
        Self::from_weight(weight)
    }

    /// The same layer with a bias `[out]` added after the product.
    pub fn with_bias(mut self, bias: Tensor<1>) -> Self {
        self.bias = Some(Param::from_tensor(bias));
        self
    }

    /// `[out, in]`.
    pub fn dims(&self) -> [usize; 2] {
        match &self.base {
            BaseWeight::Dense(w) => w.shape().dims(),
            BaseWeight::Nf4(w) => w.dims(),
        }
    }

    /// The base weight as a dense tensor (dequantized for NF4): for merging and export only.
    pub fn dense_weight(&self, device: &Device) -> Tensor<2> {
        match &self.base {
            BaseWeight::Dense(w) => w.val(),
            BaseWeight::Nf4(w) => w.dequantized(device, burn::tensor::FloatDType::F32),
        }
    }

    /// `x · Wᵀ` with the base weight alone.
    ///
    /// # Shapes
    /// - `x`: `[N, in]` → `[N, out]`
    fn base_product(&self, x: Tensor<2>) -> Tensor<2> {
        match &self.base {
            BaseWeight::Dense(w) => linear_matmul(x, w.val()),
            BaseWeight::Nf4(w) => nf4_matmul(x, w),
        }
    }

    /// # Shapes
    /// - `x`: `[B, T, in]` → `[B, T, out]`
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let [b, t, d_in] = x.dims();
        let [d_out, _] = self.dims();
        // One 2-D GEMM over all tokens is faster than a batched one on every backend.
        let x = x.reshape([b * t, d_in]); // [B·T, in]
        // Generation's few rows on a GPU: base and adapter in one launch from the codes.
        let fused = match (&self.base, &self.lora) {
            (BaseWeight::Nf4(w), Some(lora)) if lora.magnitude.is_none() => {
                nf4_lora_from_codes(&x, w, lora)
            }
            _ => None,
        };
        let y = match fused {
            Some(y) => y,
            None => {
                let y = self.base_product(x.clone()); // [B·T, out]
                match &self.lora {
                    Some(lora) if lora.magnitude.is_some() => {
                        lora.dora_output(y, x, |x| self.base_product(x))
                    }
                    Some(lora) => lora.add_to(y, x),
                    None => y,
                }
            }
        };
        let y = match &self.bias {
            Some(bias) => {
                let dtype = y.dtype();
                y + bias.val().unsqueeze_dim::<2>(0).cast(dtype) // [1, out]
            }
            None => y,
        };
        y.reshape([b, t, d_out])
    }
}
