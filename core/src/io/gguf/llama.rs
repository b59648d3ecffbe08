//! A llama-, qwen2-, qwen3- or phi3-architecture GGUF as a [`Llama`]: the config from the
//! `<arch>.*` metadata (Llama 3's RoPE schedule from `rope_freqs.weight`, Phi-3's window from
//! `phi3.attention.sliding_window`), llama.cpp's tensor names mapped to HF ones (Qwen2's
//! `attn_q.bias`, Qwen3's `attn_q_norm.weight`, Phi-3's fused `attn_qkv` and `ffn_up`
//! split by rows, ... included), and the Q/K row permutation undone.
//!
//! For arch `llama`, llama.cpp's converter reorders the rows of `q_proj` and `k_proj` within each head from HF's
//! "rotate half" layout (first half of the head's dims, then second) to interleaved pairs, for its
//! own RoPE kernel. Undoing it here keeps one RoPE implementation (HF's) in napkin:
//! `hf[h·Dh + j·Dh/2 + i] = gguf[h·Dh + 2i + j]` for head h, i < Dh/2, j ∈ {0, 1}. For arch
//! `qwen2`, `qwen3` and `phi3` it writes HF's rows as they are (llama.cpp runs them with
//! rotate-half RoPE).

use burn::tensor::{Device, Tensor, TensorData};

use super::reader::{GgufFile, GgufTensorInfo};
use super::rope_factors::{ROPE_FREQS, scaling_from_divisors};
use crate::config::{LlamaConfig, Nf4Config, RopeScaling};
use crate::error::{Error, Result};
use crate::io::fused_reader::FusedReader;
use crate::io::hf::build_llama;
use crate::model::Llama;

/// llama.cpp's architecture name for a model of `config`: Qwen2's biases make it `qwen2`,
/// Qwen3's head norms `qwen3`, Phi-3's fused projections `phi3`.
pub fn gguf_arch(config: &LlamaConfig) -> &'static str {
    if config.fused_projections {
        return "phi3";
    }
    match (config.qkv_bias, config.qk_norm) {
        (_, true) => "qwen3",
        (true, false) => "qwen2",
        (false, false) => "llama",
    }
}

/// Whether llama.cpp's converter reorders this architecture's Q and K rows (arch `llama` only).
pub fn permutes_qk(config: &LlamaConfig) -> bool {
    gguf_arch(config) == "llama"
}

/// Which permutation, if any, the converter applied to the HF tensor `hf`: the head count of
/// its rows for Q's and K's weights of arch `llama`.
pub fn permuted_heads(config: &LlamaConfig, hf: &str) -> Option<usize> {
    if !permutes_qk(config) {
        None
    } else if hf.ends_with("self_attn.q_proj.weight") {
        Some(config.num_attention_heads)
    } else if hf.ends_with("self_attn.k_proj.weight") {
        Some(config.num_key_value_heads)
    } else {
        None
    }
}

/// The HF config of a llama-, qwen2-, qwen3- or phi3-architecture GGUF.
pub fn gguf_config(gguf: &GgufFile) -> Result<LlamaConfig> {
    let arch = gguf
        .require("general.architecture")?
        .as_str()
        .unwrap_or_default()
        .to_string();
    if !matches!(arch.as_str(), "llama" | "qwen2" | "qwen3" | "phi3") {
        return Err(Error::checkpoint(
            &gguf.path,
            format!("architecture `{arch}` is not supported (llama, qwen2, qwen3 and phi3 only)"),
        ));
    }
    let key = |k: &str| format!("{arch}.{k}");
    let u = |k: &str| -> Result<usize> { Ok(gguf.require_u64(&key(k))? as usize) };
    let f = |k: &str, default: f64| -> f64 {
        gguf.metadata
            .get(&key(k))
            .and_then(|v| v.as_f64())
            .unwrap_or(default)
    };
    let hidden_size = u("embedding_length")?;
    let heads = u("attention.head_count")?;
    let vocab_size = match gguf
        .metadata
        .get(&key("vocab_size"))
        .and_then(|v| v.as_u64())
    {
        Some(v) => v as usize,
        None => gguf
            .require("tokenizer.ggml.tokens")?
            .as_array()
            .map(<[_]>::len)
            .unwrap_or(0),
    };
    let token = |key: &str| {
        gguf.metadata
            .get(key)
            .and_then(|v| v.as_u64())
            .and_then(|v| u32::try_from(v).ok())
    };
    // A head's width: the converter states it as the key length (Qwen2) or the rotary
    // dimension (Llama); napkin rotates whole heads of equal key and value widths.
    let optional = |k: &str| {
        gguf.metadata
            .get(&key(k))
            .and_then(|v| v.as_u64())
            .map(|v| v as usize)
    };
    let (key_length, value_length, rotary) = (
        optional("attention.key_length"),
        optional("attention.value_length"),
        optional("rope.dimension_count"),
    );
    let head_dim = key_length.or(rotary).unwrap_or(hidden_size / heads.max(1));
    for (name, found) in [
        ("attention.value_length", value_length),
        ("rope.dimension_count", rotary),
    ] {
        if let Some(found) = found
            && found != head_dim
        {
            return Err(Error::checkpoint(
                &gguf.path,
                format!(
                    "`{arch}.{name}` is {found}, the heads are {head_dim} wide: napkin \
                     implements equal key and value widths and RoPE on the whole head"
                ),
            ));
        }
    }
    let rope_theta = f("rope.freq_base", 10_000.0);
    let config = LlamaConfig {
        vocab_size,
        hidden_size,
        intermediate_size: u("feed_forward_length")?,
        num_hidden_layers: u("block_count")?,
        num_attention_heads: heads,
        num_key_value_heads: gguf
            .metadata
            .get(&key("attention.head_count_kv"))
            .and_then(|v| v.as_u64())
            .map_or(heads, |v| v as usize),
        head_dim,
        rms_norm_eps: f("attention.layer_norm_rms_epsilon", 1e-5),
        rope_theta,
        rope_scaling: rope_scaling(gguf, &arch, rope_theta, head_dim)?,
        max_position_embeddings: u("context_length").unwrap_or(2048),
        tie_word_embeddings: !gguf.tensors.contains_key("output.weight"),
        bos_token_id: token("tokenizer.ggml.bos_token_id"),
        eos_token_ids: token("tokenizer.ggml.eos_token_id").into_iter().collect(),
        // llama.cpp's converter writes no window for an arch `llama`, `qwen2` or `qwen3` file;
        // for `phi3` it writes Phi-3's (0 for none).
        sliding_window: match arch.as_str() {
            "phi3" => optional("attention.sliding_window").filter(|&w| w > 0),
            _ => None,
        },
        qkv_bias: arch == "qwen2",
        qk_norm: arch == "qwen3",
        fused_projections: arch == "phi3",
    };
    config.validate(&gguf.path.display().to_string())?;
    Ok(config)
}

/// The RoPE schedule: plain, or Llama 3's from `rope_freqs.weight` (`rope_factors.rs`). The
/// scalings llama.cpp names in metadata (linear, YaRN, LongRoPE) are refused by name.
fn rope_scaling(gguf: &GgufFile, arch: &str, theta: f64, head_dim: usize) -> Result<RopeScaling> {
    let refuse = |what: String| {
        Err(Error::checkpoint(
            &gguf.path,
            format!("{what} is not supported: napkin implements plain RoPE and Llama 3's"),
        ))
    };
    let text = |key: &str| gguf.metadata.get(key).and_then(|v| v.as_str());
    let number = |key: &str| gguf.metadata.get(key).and_then(|v| v.as_f64());
    // The converter writes Phi-3's LongRoPE (its 128k models, Phi-3.5) as per-frequency
    // factors with no scaling type.
    for factors in ["rope_factors_long.weight", "rope_factors_short.weight"] {
        if gguf.tensors.contains_key(factors) {
            return refuse(format!("LongRoPE (`{factors}`)"));
        }
    }
    match text(&format!("{arch}.rope.scaling.type")) {
        None | Some("none") => {}
        Some(kind) => {
            return refuse(format!("RoPE scaling `{kind}` ({arch}.rope.scaling.type)"));
        }
    }
    // Without a type, llama.cpp reads a factor as linear scaling.
    for key in [
        format!("{arch}.rope.scaling.factor"),
        format!("{arch}.rope.scale_linear"),
    ] {
        if let Some(factor) = number(&key)
            && factor != 0.0
            && factor != 1.0
        {
            return refuse(format!("linear RoPE scaling by {factor} ({key})"));
        }
    }
    if !gguf.tensors.contains_key(ROPE_FREQS) {
        return Ok(RopeScaling::Default);
    }
    let (_, divisors) = gguf.read_f32(ROPE_FREQS)?;
    scaling_from_divisors(&divisors, theta, head_dim).ok_or_else(|| {
        Error::checkpoint(
            &gguf.path,
            format!(
                "`{ROPE_FREQS}` holds {} per-frequency RoPE divisors that no Llama 3 schedule \
                 gives (head_dim {head_dim} has {} frequencies); napkin implements plain RoPE \
                 and Llama 3's",
                divisors.len(),
                head_dim / 2
            ),
        )
    })
}

/// llama.cpp's name for an HF parameter name.
pub fn gguf_name(hf: &str) -> Option<String> {
    let fixed = match hf {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(name) = fixed {
        return Some(name.to_string());
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, module) = rest.split_once('.')?;
    let (module, kind) = module.rsplit_once('.')?;
    if !matches!(kind, "weight" | "bias") {
        return None;
    }
    let short = match module {
        "input_layernorm" => "attn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "post_attention_layernorm" => "ffn_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        // Phi-3's fused tensors (`config/fused.rs`); llama.cpp splits `ffn_up` in halves.
        "self_attn.qkv_proj" => "attn_qkv",
        "mlp.gate_up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        _ => return None,
    };
    Some(format!("blk.{layer}.{short}.{kind}"))
}

/// Undoes llama.cpp's Q/K permutation of a `[heads·Dh, cols]` row-major matrix.
pub fn unpermute_rows(values: &[f32], heads: usize, cols: usize) -> Vec<f32> {
    move_rows(values, heads, cols, false)
}

/// The inverse of [`unpermute_rows`]: what llama.cpp's converter does (for writers and tests).
pub fn permute_rows(values: &[f32], heads: usize, cols: usize) -> Vec<f32> {
    move_rows(values, heads, cols, true)
}

/// Row `h·Dh + j·Dh/2 + i` (HF) ↔ row `h·Dh + 2i + j` (llama.cpp); `to_gguf` picks the direction.
fn move_rows(values: &[f32], heads: usize, cols: usize, to_gguf: bool) -> Vec<f32> {
    let mut out = vec![0.0f32; values.len()];
    for (hf, gguf) in hf_row_order(values.len() / cols, heads)
        .into_iter()
        .enumerate()
    {
        let (src, dst) = if to_gguf { (hf, gguf) } else { (gguf, hf) };
        out[dst * cols..(dst + 1) * cols].copy_from_slice(&values[src * cols..(src + 1) * cols]);
    }
    out
}

/// Refuses a GGUF holding tensors a Llama of `config` has no place for (the first five named).
pub(super) fn refuse_unexpected_tensors(gguf: &GgufFile, config: &LlamaConfig) -> Result<()> {
    let known: std::collections::HashSet<String> = config
        .stored_parameter_shapes()
        .iter()
        .filter_map(|(n, _)| gguf_name(n))
        .collect();
    let extra: Vec<&str> = gguf
        .tensors
        .keys()
        .map(String::as_str)
        .filter(|n| !known.contains(*n) && *n != ROPE_FREQS)
        .take(5)
        .collect();
    if extra.is_empty() {
        Ok(())
    } else {
        Err(Error::UnexpectedTensors {
            path: gguf.path.clone(),
            names: extra.join(", "),
        })
    }
}

/// The GGUF name and entry of the HF parameter `hf`, checked to have `shape` (PyTorch order).
pub(super) fn find_tensor<'a>(
    gguf: &'a GgufFile,
    hf: &str,
    shape: &[usize],
) -> Result<(String, &'a GgufTensorInfo)> {
    let name = gguf_name(hf).ok_or_else(|| Error::Internal(format!("no GGUF name for `{hf}`")))?;
    let info = gguf
        .tensors
        .get(&name)
        .ok_or_else(|| Error::MissingTensor {
            path: gguf.path.clone(),
            name: name.clone(),
            expected: shape.to_vec(),
        })?;
    if info.shape() != shape {
        return Err(Error::ShapeMismatch {
            path: gguf.path.clone(),
            name,
            found: info.shape(),
            expected: shape.to_vec(),
        });
    }
    Ok((name, info))
}

/// For each row in HF's order, the GGUF row llama.cpp's converter moved it to (`[heads·Dh, ·]`
/// Q or K): `order[h·Dh + j·Dh/2 + i] = h·Dh + 2i + j`.
pub fn hf_row_order(rows: usize, heads: usize) -> Vec<usize> {
    let dh = rows / heads;
    let half = dh / 2;
    let mut order = vec![0; rows];
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                order[h * dh + j * half + i] = h * dh + 2 * i + j;
            }
        }
    }
    order
}

/// Loads a llama or qwen2 GGUF into a float [`Llama`] on `device` (quantized tensors are dequantized).
pub fn load_gguf_llama(gguf: &GgufFile, device: &Device) -> Result<Llama> {
    load_gguf_llama_with(gguf, device, None)
}

/// As [`load_gguf_llama`]; with `nf4`, each block linear is quantized to NF4 as it is read,
/// so the float weights never exist all at once (QLoRA's base, at a fraction of the peak).
pub fn load_gguf_llama_with(
    gguf: &GgufFile,
    device: &Device,
    nf4: Option<&Nf4Config>,
) -> Result<Llama> {
    let config = gguf_config(gguf)?;
    refuse_unexpected_tensors(gguf, &config)?;
    let reader = FusedReader::new(&config, |hf: &str, shape: &[usize]| {
        read_stored(gguf, &config, hf, shape)
    });
    let read = |hf: &str, shape: &[usize]| reader.read(hf, shape);
    let matrix = |name: &str, rows: usize, cols: usize| -> Result<Tensor<2>> {
        Ok(Tensor::from_data(
            TensorData::new(read(name, &[rows, cols])?, [rows, cols]),
            device,
        ))
    };
    let vector = |name: &str, dim: usize| -> Result<Tensor<1>> {
        Ok(Tensor::from_data(
            TensorData::new(read(name, &[dim])?, [dim]),
            device,
        ))
    };
    let linear =
        |name: &str, rows: usize, cols: usize| reader.linear(name, [rows, cols], nf4, device);
    build_llama(&config, &matrix, &vector, &linear)
}

/// The values of the tensor stored under the HF name `hf` (a fused one's whole), checked
/// finite, in HF's row order (the converter's Q/K reordering undone).
pub(super) fn read_stored(
    gguf: &GgufFile,
    config: &LlamaConfig,
    hf: &str,
    shape: &[usize],
) -> Result<Vec<f32>> {
    let (name, _) = find_tensor(gguf, hf, shape)?;
    let (_, values) = gguf.read_f32(&name)?;
    if let Some(i) = values.iter().position(|v| !v.is_finite()) {
        return Err(Error::checkpoint(
            &gguf.path,
            format!("tensor `{name}` holds a non-finite value at {i}"),
        ));
    }
    // Undo the converter's rotary reordering of the query and key rows.
    Ok(match permuted_heads(config, hf) {
        Some(heads) => unpermute_rows(&values, heads, shape[1]),
        None => values,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_round_trips_and_matches_llama_cpp_layout() {
        // One head of width 4, one column: HF rows [a0, a1, b0, b1] (halves a, b) become
        // interleaved [a0, b0, a1, b1] in llama.cpp's layout.
        let hf = [10.0, 11.0, 20.0, 21.0];
        assert_eq!(permute_rows(&hf, 1, 1), vec![10.0, 20.0, 11.0, 21.0]);
        let values: Vec<f32> = (0..2 * 8 * 3).map(|i| i as f32).collect();
        assert_eq!(unpermute_rows(&permute_rows(&values, 2, 3), 2, 3), values);
    }

    #[test]
    fn names_map_both_ways_for_every_parameter() {
        let config = LlamaConfig::tiny_mha();
        let names: Vec<String> = config
            .hf_parameter_shapes()
            .iter()
            .map(|(n, _)| gguf_name(n).unwrap())
            .collect();
        assert!(names.contains(&"blk.1.ffn_down.weight".to_string()));
        assert!(names.contains(&"output.weight".to_string()));
        let unique: std::collections::HashSet<_> = names.iter().collect();
        assert_eq!(unique.len(), names.len());
    }
}
