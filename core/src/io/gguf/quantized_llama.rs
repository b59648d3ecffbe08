//! A llama-architecture GGUF as a [`QuantizedLlama`]:
//! - Q4_0, Q4_1, Q8_0, Q4_K, Q5_K and Q6_K tensors keep their blocks, read in place from the
//!   file's memory map (no copy; the Q/K rows' HF order is a row order the products apply to
//!   their results): the formats of llama.cpp's common `Q4_0`, `Q4_K_M`, `Q5_K_M`, `Q6_K` and
//!   `Q8_0` files;
//! - the other quantized types (Q5_0, Q5_1, Q2_K, Q3_K) are converted to Q8_0 row by row when
//!   their rows are whole blocks of 32: each value moves by at most half a Q8_0 step (1/254 of
//!   its block's largest) and the products run on the Q8_0 kernel at 8.5 bits a weight (their
//!   own kernels are not written);
//! - F32, F16 and BF16 tensors (and rows that are not whole blocks) are kept as f32, exactly.

use super::dequant::GgmlType;
use super::llama::{find_tensor, gguf_config, hf_row_order, refuse_unexpected_tensors};
use super::quantize::quantize;
use super::reader::GgufFile;
use crate::error::{Error, Result};
use crate::kernels::quantized::{BLOCK, BlockFormat, QuantizedMatrix};
use crate::model::quantized_llama::{QuantizedBlockWeights, QuantizedLlama};

/// Loads a llama GGUF for generation with its weights kept quantized.
pub fn load_gguf_quantized(gguf: &GgufFile) -> Result<QuantizedLlama> {
    let config = gguf_config(gguf)?;
    refuse_unexpected_tensors(gguf, &config)?;
    let source = gguf.path.display().to_string();
    let (d, f, v) = (
        config.hidden_size,
        config.intermediate_size,
        config.vocab_size,
    );
    let (h, hkv, dh) = (
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
    );
    let matrix = |hf: &str, rows: usize, cols: usize| -> Result<QuantizedMatrix> {
        let (name, info) = find_tensor(gguf, hf, &[rows, cols])?;
        let format = match info.ggml_type {
            GgmlType::Q4_0 => Some(BlockFormat::Q4_0),
            GgmlType::Q4_1 => Some(BlockFormat::Q4_1),
            GgmlType::Q8_0 => Some(BlockFormat::Q8_0),
            GgmlType::Q4K => Some(BlockFormat::Q4K),
            GgmlType::Q5K => Some(BlockFormat::Q5K),
            GgmlType::Q6K => Some(BlockFormat::Q6K),
            _ => None,
        };
        let in_file = |m: String| Error::checkpoint(&gguf.path, format!("tensor `{name}`: {m}"));
        let exact = matches!(
            info.ggml_type,
            GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16
        );
        let matrix = match format {
            Some(format) => {
                QuantizedMatrix::new(format, rows, cols, gguf.shared_tensor_bytes(info))
                    .map_err(in_file)?
            }
            None if !exact && cols.is_multiple_of(BLOCK) => {
                let (_, values) = gguf.read_f32(&name)?;
                let bytes = quantize(GgmlType::Q8_0, &values).map_err(in_file)?;
                QuantizedMatrix::new(BlockFormat::Q8_0, rows, cols, bytes).map_err(in_file)?
            }
            None => {
                let (_, values) = gguf.read_f32(&name)?;
                QuantizedMatrix::from_f32(rows, cols, &values)
            }
        };
        // Undo the converter's rotary reordering of the query and key rows.
        Ok(if hf.ends_with("self_attn.q_proj.weight") {
            matrix.with_rows_in_order(&hf_row_order(rows, h))
        } else if hf.ends_with("self_attn.k_proj.weight") {
            matrix.with_rows_in_order(&hf_row_order(rows, hkv))
        } else {
            matrix
        })
    };
    let vector = |hf: &str| -> Result<Vec<f32>> {
        let (name, _) = find_tensor(gguf, hf, &[d])?;
        Ok(gguf.read_f32(&name)?.1)
    };
    let blocks = (0..config.num_hidden_layers)
        .map(|i| {
            let p = |part: &str| format!("model.layers.{i}.{part}.weight");
            Ok(QuantizedBlockWeights {
                attn_norm: vector(&p("input_layernorm"))?,
                q: matrix(&p("self_attn.q_proj"), h * dh, d)?,
                k: matrix(&p("self_attn.k_proj"), hkv * dh, d)?,
                v: matrix(&p("self_attn.v_proj"), hkv * dh, d)?,
                o: matrix(&p("self_attn.o_proj"), d, h * dh)?,
                ffn_norm: vector(&p("post_attention_layernorm"))?,
                gate: matrix(&p("mlp.gate_proj"), f, d)?,
                up: matrix(&p("mlp.up_proj"), f, d)?,
                down: matrix(&p("mlp.down_proj"), d, f)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let head = if config.tie_word_embeddings {
        None
    } else {
        Some(matrix("lm_head.weight", v, d)?)
    };
    QuantizedLlama::new(
        config.clone(),
        matrix("model.embed_tokens.weight", v, d)?,
        blocks,
        vector("model.norm.weight")?,
        head,
        &source,
    )
}
