//! A model as a llama.cpp GGUF file: llama.cpp's tensor names, Q and K rows permuted the way
//! its converter permutes them (arch `llama`; a Qwen2 is written as arch `qwen2`, rows as they
//! are, with its biases, a Qwen3 as arch `qwen3` with its head norms), the architecture keys,
//! Llama 3's RoPE schedule as its divisors (`rope_freqs.weight`), the caller's tokenizer
//! metadata, and each 2-D weight in the type llama.cpp's quantizer would give it for the chosen
//! file type (`type_mix`; norms stay F32). Tensors are made one at a time
//! ([`Llama::hf_tensor`]; LoRA adapters folded in when asked), so the model is never held whole.

use std::path::Path;

use super::dequant::GgmlType;
use super::llama::{gguf_arch, gguf_name, permute_rows, permuted_heads};
use super::quantize::quantize;
use super::rope_factors::{ROPE_FREQS, llama3_divisors};
use super::type_mix::tensor_type;
use super::writer::{MetaValue, TensorEntry, write_gguf};
use crate::config::{LlamaConfig, spellings};
use crate::error::{Error, Result};
use crate::model::Llama;

/// The file type of an exported GGUF: llama.cpp's `llama_ftype`s, each with llama.cpp's
/// per-tensor mix (`type_mix`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgufQuant {
    /// Every weight in f32.
    F32,
    /// The 2-D weights in f16.
    F16,
    /// The 2-D weights in Q8_0.
    Q8_0,
    /// Q4_0, the head in Q6_K.
    Q4_0,
    /// Q4_K_S: Q4_K, the first four `attn_v` and the first eighth of `ffn_down` in Q5_K.
    Q4KS,
    /// Q4_K_M (llama.cpp's and Ollama's default): Q4_K, half the `attn_v` and `ffn_down` in
    /// Q6_K.
    Q4KM,
    /// Q5_K_S: Q5_K.
    Q5KS,
    /// Q5_K_M: Q5_K, half the `attn_v` and `ffn_down` in Q6_K.
    Q5KM,
    /// Q6_K: every 2-D weight in Q6_K.
    Q6K,
}

impl GgufQuant {
    /// The type every 2-D weight starts from before the mix (`llama_ftype_get_default_type`).
    pub fn base_type(self) -> GgmlType {
        match self {
            GgufQuant::F32 => GgmlType::F32,
            GgufQuant::F16 => GgmlType::F16,
            GgufQuant::Q8_0 => GgmlType::Q8_0,
            GgufQuant::Q4_0 => GgmlType::Q4_0,
            GgufQuant::Q4KS | GgufQuant::Q4KM => GgmlType::Q4K,
            GgufQuant::Q5KS | GgufQuant::Q5KM => GgmlType::Q5K,
            GgufQuant::Q6K => GgmlType::Q6K,
        }
    }

    /// `general.file_type` (llama.cpp's `llama_ftype`).
    fn file_type(self) -> u32 {
        match self {
            GgufQuant::F32 => 0,
            GgufQuant::F16 => 1,
            GgufQuant::Q4_0 => 2,
            GgufQuant::Q8_0 => 7,
            GgufQuant::Q4KS => 14,
            GgufQuant::Q4KM => 15,
            GgufQuant::Q5KS => 16,
            GgufQuant::Q5KM => 17,
            GgufQuant::Q6K => 18,
        }
    }
}

spellings! {
    GgufQuant, "GGUF type", "quant", serde;
    F32 => "f32" []: "every weight in f32",
    F16 => "f16" []: "the 2-D weights in f16",
    Q8_0 => "q8_0" []: "8-bit blocks of 32",
    Q4_0 => "q4_0" []: "4-bit blocks of 32, the head in Q6_K",
    Q4KS => "q4_k_s" ["q4_k"]: "4-bit K-quants, a few attn_v and ffn_down in Q5_K",
    Q4KM => "q4_k_m" []: "4-bit K-quants, half the attn_v and ffn_down in Q6_K (llama.cpp's default)",
    Q5KS => "q5_k_s" ["q5_k"]: "5-bit K-quants",
    Q5KM => "q5_k_m" []: "5-bit K-quants, half the attn_v and ffn_down in Q6_K",
    Q6K => "q6_k" []: "6-bit K-quants",
}

/// The weights of a `quant` export of a model of `config`, in file order (the RoPE divisors
/// aside): each Hugging Face name with its GGUF entry (name, shape, and the type llama.cpp's
/// quantizer would give it, `type_mix`).
pub fn tensor_plan(config: &LlamaConfig, quant: GgufQuant) -> Result<Vec<(String, TensorEntry)>> {
    // llama.cpp treats the embedding as the head when the file has no `output.weight`.
    let tied = config.tie_word_embeddings;
    config
        .stored_parameter_shapes()
        .into_iter()
        .map(|(hf, shape)| {
            let name = gguf_name(&hf)
                .ok_or_else(|| Error::Internal(format!("no GGUF name for tensor `{hf}`")))?;
            let ggml_type = tensor_type(quant, &name, &shape, config.num_hidden_layers, tied);
            Ok((
                hf,
                TensorEntry {
                    name,
                    shape,
                    ggml_type,
                },
            ))
        })
        .collect()
}

/// What an export wrote: how many tensors of each type.
#[derive(Debug, Clone, Default)]
pub struct ExportSummary {
    /// (ggml type, tensors) in the order first met.
    pub tensors_by_type: Vec<(GgmlType, usize)>,
    /// Bytes of the file.
    pub file_bytes: u64,
}

/// Writes `model` to `path` as a llama (or qwen2) GGUF with `tokenizer` metadata (`tokenizer.ggml.*`,
/// from [`crate::tokenizer::TextTokenizer::gguf_metadata`]), named `name`.
pub fn export_gguf(
    model: &Llama,
    tokenizer: Vec<(String, MetaValue)>,
    path: &Path,
    quant: GgufQuant,
    merge_lora: bool,
    name: &str,
) -> Result<ExportSummary> {
    let c = &model.config;
    // Llama 3's schedule as llama.cpp's converter writes it: divisors, no parameters.
    let rope_divisors = llama3_divisors(&c.rope_scaling, c.rope_theta, c.head_dim);
    let u32_of = |v: usize| MetaValue::U32(v as u32);
    let arch = gguf_arch(c);
    let key = |k: &str| format!("{arch}.{k}");
    let mut metadata: Vec<(String, MetaValue)> = vec![
        ("general.architecture".into(), MetaValue::Str(arch.into())),
        ("general.name".into(), MetaValue::Str(name.into())),
        (
            "general.file_type".into(),
            MetaValue::U32(quant.file_type()),
        ),
        ("general.quantization_version".into(), MetaValue::U32(2)),
        (key("vocab_size"), u32_of(c.vocab_size)),
        // GGUF's llama has no window: a windowed model (Mistral v0.1) is exact up to its
        // window only, so that is the context the file states (llama.cpp warns past it).
        // Phi-3's arch states its window (below).
        (
            key("context_length"),
            u32_of(match (arch, c.sliding_window) {
                ("phi3", _) | (_, None) => c.max_position_embeddings,
                (_, Some(w)) => w.min(c.max_position_embeddings),
            }),
        ),
        (key("embedding_length"), u32_of(c.hidden_size)),
        (key("block_count"), u32_of(c.num_hidden_layers)),
        (key("feed_forward_length"), u32_of(c.intermediate_size)),
        (key("rope.dimension_count"), u32_of(c.head_dim)),
        (key("attention.key_length"), u32_of(c.head_dim)),
        (key("attention.value_length"), u32_of(c.head_dim)),
        (key("attention.head_count"), u32_of(c.num_attention_heads)),
        (
            key("attention.head_count_kv"),
            u32_of(c.num_key_value_heads),
        ),
        (
            key("attention.layer_norm_rms_epsilon"),
            MetaValue::F32(c.rms_norm_eps as f32),
        ),
        (key("rope.freq_base"), MetaValue::F32(c.rope_theta as f32)),
    ];
    if arch == "phi3" {
        // As llama.cpp's converter writes a Phi-3 without LongRoPE (0: no window).
        metadata.push((
            key("rope.scaling.original_context_length"),
            u32_of(c.max_position_embeddings),
        ));
        metadata.push((
            key("attention.sliding_window"),
            u32_of(c.sliding_window.unwrap_or(0)),
        ));
    }
    metadata.extend(tokenizer);

    let mut entries = Vec::new();
    let mut hf_names = Vec::new();
    if let Some(divisors) = &rope_divisors {
        entries.push(TensorEntry {
            name: ROPE_FREQS.into(),
            shape: vec![divisors.len()],
            ggml_type: GgmlType::F32,
        });
        hf_names.push(String::new());
    }
    for (hf, entry) in tensor_plan(c, quant)? {
        entries.push(entry);
        hf_names.push(hf);
    }
    let mut summary = ExportSummary::default();
    for e in &entries {
        match summary
            .tensors_by_type
            .iter_mut()
            .find(|(t, _)| *t == e.ggml_type)
        {
            Some((_, n)) => *n += 1,
            None => summary.tensors_by_type.push((e.ggml_type, 1)),
        }
    }
    let hf_of: std::collections::HashMap<&str, &str> = entries
        .iter()
        .map(|e| e.name.as_str())
        .zip(hf_names.iter().map(String::as_str))
        .collect();
    write_gguf(path, &metadata, &entries, |entry| {
        if let (ROPE_FREQS, Some(divisors)) = (entry.name.as_str(), &rope_divisors) {
            return quantize(GgmlType::F32, divisors).map_err(Error::Internal);
        }
        let hf = hf_of[entry.name.as_str()];
        let tensor = model
            .stored_tensor(hf, merge_lora)
            .ok_or_else(|| Error::Internal(format!("the model has no tensor `{hf}`")))?;
        let mut values = tensor.to_vec();
        let cols = entry.shape.last().copied().unwrap_or(1);
        if let Some(heads) = permuted_heads(c, hf) {
            values = permute_rows(&values, heads, cols);
        }
        quantize(entry.ggml_type, &values)
            .map_err(|e| Error::Input(format!("tensor `{}`: {e}", entry.name)))
    })?;
    summary.file_bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    Ok(summary)
}
