//! One decoder block: pre-norm attention and pre-norm SwiGLU, each added to the residual.

use burn::module::Module;
use burn::tensor::{Device, Tensor};

use super::attention::{Attention, AttentionMask, LayerKvCache};
use super::linear::Linear;
use super::mlp::Mlp;
use super::rms_norm::RmsNorm;
use super::rope::RopeTables;
use crate::config::LlamaConfig;

/// `x = x + attn(norm₁(x)); x = x + mlp(norm₂(x))`.
#[derive(Module, Debug)]
pub struct DecoderBlock {
    /// RMSNorm before attention.
    pub input_layernorm: RmsNorm,
    /// Causal grouped-query self-attention.
    pub self_attn: Attention,
    /// RMSNorm before the MLP.
    pub post_attention_layernorm: RmsNorm,
    /// SwiGLU MLP.
    pub mlp: Mlp,
}

impl DecoderBlock {
    /// The seven linears, mutably, in module order (`LoraTarget::ALL`'s order: q, k, v, o,
    /// gate, up, down).
    pub fn linears_mut(&mut self) -> [&mut Linear; 7] {
        let a = &mut self.self_attn;
        let m = &mut self.mlp;
        [
            &mut a.q_proj,
            &mut a.k_proj,
            &mut a.v_proj,
            &mut a.o_proj,
            &mut m.gate_proj,
            &mut m.up_proj,
            &mut m.down_proj,
        ]
    }

    /// A fresh block.
    pub fn init(config: &LlamaConfig, device: &Device) -> Self {
        DecoderBlock {
            input_layernorm: RmsNorm::init(config.hidden_size, config.rms_norm_eps, device),
            self_attn: Attention::init(config, device),
            post_attention_layernorm: RmsNorm::init(
                config.hidden_size,
                config.rms_norm_eps,
                device,
            ),
            mlp: Mlp::init(config, device),
        }
    }

    /// # Shapes
    /// - `x`: `[B, T, D]` → `[B, T, D]`
    pub fn forward(&self, x: Tensor<3>, rope: &RopeTables, mask: &AttentionMask) -> Tensor<3> {
        let attn = self
            .self_attn
            .forward(self.input_layernorm.forward(x.clone()), rope, mask);
        self.add_mlp(x + attn)
    }

    /// The forward pass with an optional key/value cache (generation).
    pub fn forward_cached(
        &self,
        x: Tensor<3>,
        rope: &RopeTables,
        mask: &Tensor<4>,
        cache: Option<&mut LayerKvCache>,
    ) -> Tensor<3> {
        let attn = self.self_attn.forward_cached(
            self.input_layernorm.forward(x.clone()),
            rope,
            mask,
            cache,
        );
        self.add_mlp(x + attn)
    }

    /// `x + mlp(norm₂(x))`.
    fn add_mlp(&self, x: Tensor<3>) -> Tensor<3> {
        x.clone() + self.mlp.forward(self.post_attention_layernorm.forward(x))
    }
}
