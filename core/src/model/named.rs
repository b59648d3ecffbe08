//! The model's parameters under their Hugging Face names, for checkpoint writers, gradient
//! reports and tests. The order is the module order of `LlamaForCausalLM.named_parameters()`.

use burn::tensor::Tensor;

use super::llama::Llama;
use crate::values::to_f32_vec;

/// A parameter tensor of rank 1 (norm gains) or 2 (matrices).
#[derive(Debug, Clone)]
pub enum ParamTensor {
    /// `[D]`.
    Vector(Tensor<1>),
    /// `[rows, cols]`.
    Matrix(Tensor<2>),
}

impl ParamTensor {
    /// The shape.
    pub fn dims(&self) -> Vec<usize> {
        match self {
            ParamTensor::Vector(t) => t.dims().to_vec(),
            ParamTensor::Matrix(t) => t.dims().to_vec(),
        }
    }

    /// The values, row-major, as f32.
    pub fn to_vec(&self) -> Vec<f32> {
        match self {
            ParamTensor::Vector(t) => to_f32_vec(t.clone()),
            ParamTensor::Matrix(t) => to_f32_vec(t.clone()),
        }
    }

    /// The gradient of this parameter in `grads`, if it has one.
    pub fn grad(&self, grads: &burn::tensor::Gradients) -> Option<ParamTensor> {
        match self {
            ParamTensor::Vector(t) => t.grad(grads).map(ParamTensor::Vector),
            ParamTensor::Matrix(t) => t.grad(grads).map(ParamTensor::Matrix),
        }
    }
}

impl Llama {
    /// Every base parameter with its HF name (`model.layers.0.self_attn.q_proj.weight`, ...).
    /// A tied model has no `lm_head.weight` entry: its head is `model.embed_tokens.weight`.
    pub fn hf_parameters(&self) -> Vec<(String, ParamTensor)> {
        use ParamTensor::{Matrix, Vector};
        let mut out = vec![(
            "model.embed_tokens.weight".to_string(),
            Matrix(self.embed_tokens.val()),
        )];
        for (i, block) in self.layers.iter().enumerate() {
            let p = format!("model.layers.{i}");
            let attn = &block.self_attn;
            let mlp = &block.mlp;
            out.push((
                format!("{p}.input_layernorm.weight"),
                Vector(block.input_layernorm.weight.val()),
            ));
            for (name, linear) in [
                ("self_attn.q_proj", &attn.q_proj),
                ("self_attn.k_proj", &attn.k_proj),
                ("self_attn.v_proj", &attn.v_proj),
                ("self_attn.o_proj", &attn.o_proj),
                ("mlp.gate_proj", &mlp.gate_proj),
                ("mlp.up_proj", &mlp.up_proj),
                ("mlp.down_proj", &mlp.down_proj),
            ] {
                out.push((format!("{p}.{name}.weight"), Matrix(linear.weight.val())));
            }
            out.push((
                format!("{p}.post_attention_layernorm.weight"),
                Vector(block.post_attention_layernorm.weight.val()),
            ));
        }
        out.push((
            "model.norm.weight".to_string(),
            Vector(self.norm.weight.val()),
        ));
        if let Some(lm_head) = &self.lm_head {
            out.push(("lm_head.weight".to_string(), Matrix(lm_head.weight.val())));
        }
        out
    }
}
