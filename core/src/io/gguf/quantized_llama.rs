//! A llama-, qwen2-, qwen3- or phi3-architecture GGUF as a [`QuantizedLlama`] (Phi-3's fused
//! `attn_qkv` and `ffn_up` split by rows, each part's rows read in place):
//! - Q4_0, Q4_1, Q8_0, Q4_K, Q5_K and Q6_K tensors keep their blocks, read in place from the
//!   file's memory map (no copy; the Q/K rows' HF order is a row order the products apply to
//!   their results): the formats of llama.cpp's common `Q4_0`, `Q4_K_M`, `Q5_K_M`, `Q6_K` and
//!   `Q8_0` files;
//! - the other quantized types (Q5_0, Q5_1, Q2_K, Q3_K) are converted to Q8_0 row by row when
//!   their rows are whole blocks of 32: each value moves by at most half a Q8_0 step (1/254 of
//!   its block's largest) and the products run on the Q8_0 kernel at 8.5 bits a weight (their
//!   own kernels are not written);
//! - F32, F16 and BF16 tensors (and rows that are not whole blocks) are kept as f32, exactly;
//! - with an NF4 configuration (an adapter trained on an NF4 base), every block linear is
//!   dequantized and quantized to NF4 as training did (`load_gguf_llama_with`: HF row order,
//!   the same blocks), one tensor at a time, and kept as NF4 codes; the embedding and the head
//!   keep the file's blocks, as they are the float model's values.
//!
//! A tensor converted to a copy has its mapped pages released after it is read
//! ([`GgufFile::release`]), so the process's resident size is what the model holds.

use super::dequant::GgmlType;
use super::llama::{
    find_tensor, gguf_config, hf_row_order, permuted_heads, read_stored, refuse_unexpected_tensors,
};
use super::quantize::quantize;
use super::reader::GgufFile;
use crate::config::Nf4Config;
use crate::error::{Error, Result};
use crate::io::fused_reader::FusedReader;
use crate::kernels::cpu::quantized::{BLOCK, BlockFormat, QuantizedMatrix};
use crate::model::quantized_llama::{QuantizedBlockWeights, QuantizedLlama};

/// Loads a llama or qwen2 GGUF for generation with its weights kept quantized.
pub fn load_gguf_quantized(gguf: &GgufFile) -> Result<QuantizedLlama> {
    load_gguf_quantized_with(gguf, None)
}

/// As [`load_gguf_quantized`]; with `nf4`, the block linears are the NF4 base QLoRA trained on
/// (see the module docs).
pub fn load_gguf_quantized_with(
    gguf: &GgufFile,
    nf4: Option<&Nf4Config>,
) -> Result<QuantizedLlama> {
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
    // A block linear as the NF4 base: HF's row order, quantized as the float model's loader
    // does (a fused part keeps its blocks of the fused tensor's quantization); a matrix whose
    // rows or blocks are not multiples of 64 is kept as the base's f32 values.
    let reader = FusedReader::new(&config, |hf: &str, shape: &[usize]| {
        let values = read_stored(gguf, &config, hf, shape)?;
        if let Ok((_, info)) = find_tensor(gguf, hf, shape) {
            gguf.release(info);
        }
        Ok(values)
    });
    let nf4_matrix = |hf: &str, rows: usize, cols: usize, nf4: &Nf4Config| {
        let tensor = reader
            .read_nf4(hf, [rows, cols], nf4)
            .map_err(|e| Error::Input(format!("{hf}: {e}")))?;
        Ok(QuantizedMatrix::from_nf4(&tensor)
            .unwrap_or_else(|_| QuantizedMatrix::from_f32(rows, cols, tensor.dequantize())))
    };
    let matrix = |hf: &str, rows: usize, cols: usize| -> Result<QuantizedMatrix> {
        if let Some(nf4) = nf4
            && hf.starts_with("model.layers.")
        {
            return nf4_matrix(hf, rows, cols, nf4);
        }
        // The stored tensor and the rows of it this matrix is (all of them unless fused).
        let (stored, first, total) = match config.stored_rows(hf) {
            Some(part) => (part.tensor, part.start, part.total),
            None => (hf.to_string(), 0, rows),
        };
        let (name, info) = find_tensor(gguf, &stored, &[total, cols])?;
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
        let values = || -> Result<Vec<f32>> {
            let (_, values) = gguf.read_f32(&name)?;
            gguf.release(info);
            Ok(values[first * cols..(first + rows) * cols].to_vec())
        };
        let matrix = match format {
            Some(format) => {
                let row_bytes = info.size as usize / total.max(1);
                let bytes = gguf
                    .shared_tensor_range(info, first * row_bytes..(first + rows) * row_bytes)
                    .ok_or_else(|| in_file(format!("no rows {first}..{}", first + rows)))?;
                QuantizedMatrix::new(format, rows, cols, bytes).map_err(in_file)?
            }
            None if !exact && cols.is_multiple_of(BLOCK) => {
                let bytes = quantize(GgmlType::Q8_0, &values()?).map_err(in_file)?;
                QuantizedMatrix::new(BlockFormat::Q8_0, rows, cols, bytes).map_err(in_file)?
            }
            None => QuantizedMatrix::from_f32(rows, cols, values()?),
        };
        // Undo the converter's rotary reordering of the query and key rows.
        Ok(match permuted_heads(&config, hf) {
            Some(heads) => matrix.with_rows_in_order(&hf_row_order(rows, heads)),
            None => matrix,
        })
    };
    let vector_of = |hf: &str, len: usize| -> Result<Vec<f32>> {
        let (name, _) = find_tensor(gguf, hf, &[len])?;
        Ok(gguf.read_f32(&name)?.1)
    };
    let vector = |hf: &str| vector_of(hf, d);
    let blocks = (0..config.num_hidden_layers)
        .map(|i| {
            let p = |part: &str| format!("model.layers.{i}.{part}.weight");
            let bias = |part: &str, len: usize| {
                vector_of(&format!("model.layers.{i}.self_attn.{part}.bias"), len)
            };
            let qkv_bias = match config.qkv_bias {
                true => Some([
                    bias("q_proj", h * dh)?,
                    bias("k_proj", hkv * dh)?,
                    bias("v_proj", hkv * dh)?,
                ]),
                false => None,
            };
            let qk_norm = match config.qk_norm {
                true => Some([
                    vector_of(&p("self_attn.q_norm"), dh)?,
                    vector_of(&p("self_attn.k_norm"), dh)?,
                ]),
                false => None,
            };
            Ok(QuantizedBlockWeights {
                attn_norm: vector(&p("input_layernorm"))?,
                qkv_bias,
                qk_norm,
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
