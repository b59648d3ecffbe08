//! A float [`Llama`] as a [`QuantizedLlama`] for generation: block linears with an NF4 base
//! keep its codes (the `Nf4` products, `kernels/cpu/quantized/nf4.rs`), every other weight is
//! held in f32 as it is (the embedding, the norms, the head, dense linears). A napkin NF4
//! checkpoint, or a float checkpoint quantized to NF4 under a QLoRA adapter, then decodes from
//! 4.5 bits a weight instead of dequantizing every NF4 weight to f32 for every token.

use burn::tensor::Tensor;

use super::Llama;
use super::linear::{BaseWeight, Linear};
use super::quantized_llama::{QuantizedBlockWeights, QuantizedLlama};
use crate::error::{Error, Result};
use crate::kernels::cpu::quantized::QuantizedMatrix;
use crate::kernels::values::to_f32_vec;

/// A `[rows, cols]` tensor as an f32 matrix.
fn f32_matrix(tensor: Tensor<2>) -> QuantizedMatrix {
    let [rows, cols] = tensor.dims();
    QuantizedMatrix::from_f32(rows, cols, to_f32_vec(tensor))
}

/// A linear's base weight: its NF4 codes when it has them and their blocks fit the products
/// (rows and blocks multiples of 64), else its f32 values (the NF4 ones dequantized). A dense
/// weight's values are taken over, not copied, when nothing else holds them.
fn base_matrix(linear: Linear) -> QuantizedMatrix {
    match linear.base {
        BaseWeight::Nf4(w) => QuantizedMatrix::from_nf4(&w.quantized).unwrap_or_else(|_| {
            let [rows, cols] = w.dims();
            QuantizedMatrix::from_f32(rows, cols, w.quantized.dequantize())
        }),
        BaseWeight::Dense(p) => f32_matrix(p.into_value()),
    }
}

impl QuantizedLlama {
    /// The model's weights as described in the module docs, each part of `model` dropped once
    /// it is converted (the two models are never whole at once). Adapters are not carried:
    /// attach them from their files (`io::peft::load_lora_quantized`); a model that has any is
    /// refused rather than run without them.
    pub fn from_llama(model: Llama) -> Result<Self> {
        if model
            .block_linears()
            .iter()
            .any(|l| l.linear.lora.is_some())
            || model.embed_lora.is_some()
            || model.lm_head.as_ref().is_some_and(|h| h.lora.is_some())
        {
            return Err(Error::Input(
                "the model carries LoRA adapters: convert its base, then attach them from their \
                 files"
                    .into(),
            ));
        }
        let vector = |weight: &burn::module::Param<Tensor<1>>| to_f32_vec(weight.val());
        let Llama {
            embed_tokens,
            layers,
            norm,
            lm_head,
            config,
            ..
        } = model;
        let embed = f32_matrix(embed_tokens.into_value());
        let head = lm_head.map(base_matrix);
        let blocks = layers
            .into_iter()
            .map(|b| QuantizedBlockWeights {
                attn_norm: vector(&b.input_layernorm.weight),
                ffn_norm: vector(&b.post_attention_layernorm.weight),
                qkv_bias: match (
                    &b.self_attn.q_proj.bias,
                    &b.self_attn.k_proj.bias,
                    &b.self_attn.v_proj.bias,
                ) {
                    (Some(q), Some(k), Some(v)) => Some([vector(q), vector(k), vector(v)]),
                    _ => None,
                },
                qk_norm: match (&b.self_attn.q_norm, &b.self_attn.k_norm) {
                    (Some(q), Some(k)) => Some([vector(&q.weight), vector(&k.weight)]),
                    _ => None,
                },
                q: base_matrix(b.self_attn.q_proj),
                k: base_matrix(b.self_attn.k_proj),
                v: base_matrix(b.self_attn.v_proj),
                o: base_matrix(b.self_attn.o_proj),
                gate: base_matrix(b.mlp.gate_proj),
                up: base_matrix(b.mlp.up_proj),
                down: base_matrix(b.mlp.down_proj),
            })
            .collect();
        QuantizedLlama::new(
            config,
            embed,
            blocks,
            vector(&norm.weight),
            head,
            "the model",
        )
    }
}
