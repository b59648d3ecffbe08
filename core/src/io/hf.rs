//! Loading a Hugging Face `LlamaForCausalLM` (or Mistral, Qwen2, Qwen3, Phi-3) folder (`config.json` +
//! safetensors) into [`Llama`].
//!
//! Every tensor the config implies must be present with the right shape; anything else in the
//! file is an error too (it usually means another architecture), except buffers HF itself
//! ignores (`rotary_emb.inv_freq`) and a redundant `lm_head.weight` in a tied checkpoint.

use std::path::Path;

use burn::module::Param;
use burn::tensor::{Device, Tensor, TensorData};

use super::fused_reader::FusedReader;
use super::safetensors::SafetensorsCheckpoint;
use crate::config::{LlamaConfig, Nf4Config};
use crate::error::{Error, Result};
use crate::model::Llama;
use crate::model::attention::Attention;
use crate::model::block::DecoderBlock;
use crate::model::linear::Linear;
use crate::model::mlp::Mlp;
use crate::model::rms_norm::RmsNorm;

/// Reads `config.json` and the weights of a HF folder onto `device`.
pub fn load_hf_llama(dir: &Path, device: &Device) -> Result<Llama> {
    let config = LlamaConfig::from_hf_file(&dir.join("config.json"))?;
    let checkpoint = SafetensorsCheckpoint::open(dir)?;
    llama_from_checkpoint(&config, &checkpoint, device)
}

/// Builds a [`Llama`] from an open checkpoint, checking names and shapes.
pub fn llama_from_checkpoint(
    config: &LlamaConfig,
    checkpoint: &SafetensorsCheckpoint,
    device: &Device,
) -> Result<Llama> {
    llama_from_checkpoint_with(config, checkpoint, device, None)
}

/// As [`llama_from_checkpoint`]; with `nf4`, each block linear is quantized to NF4 as it is
/// read.
pub fn llama_from_checkpoint_with(
    config: &LlamaConfig,
    checkpoint: &SafetensorsCheckpoint,
    device: &Device,
    nf4: Option<&Nf4Config>,
) -> Result<Llama> {
    let expected = config.stored_parameter_shapes();
    check_no_unexpected(config, checkpoint, &expected)?;
    // Phi-3's fused tensors are read once and split by rows (`fused_reader.rs`).
    let reader = FusedReader::new(config, |name: &str, shape: &[usize]| {
        checkpoint.read_f32(name, shape)
    });

    let tensor2 = |name: &str, rows: usize, cols: usize| -> Result<Tensor<2>> {
        let values = reader.read(name, &[rows, cols])?;
        Ok(Tensor::from_data(
            TensorData::new(values, [rows, cols]),
            device,
        ))
    };
    let tensor1 = |name: &str, dim: usize| -> Result<Tensor<1>> {
        let values = reader.read(name, &[dim])?;
        Ok(Tensor::from_data(TensorData::new(values, [dim]), device))
    };
    let linear =
        |name: &str, rows: usize, cols: usize| reader.linear(name, [rows, cols], nf4, device);
    build_llama(config, &tensor2, &tensor1, &linear)
}

/// Assembles a [`Llama`] from three loaders called with HF tensor names and shapes: `matrix` for
/// the embedding and an untied LM head, `vector` for norm gains and biases, `linear` for the
/// seven linears of each block (which decides dense or NF4). Every loader error is passed on unchanged.
pub fn build_llama(
    config: &LlamaConfig,
    matrix: &dyn Fn(&str, usize, usize) -> Result<Tensor<2>>,
    vector: &dyn Fn(&str, usize) -> Result<Tensor<1>>,
    linear: &dyn Fn(&str, usize, usize) -> Result<Linear>,
) -> Result<Llama> {
    let (v, d) = (config.vocab_size, config.hidden_size);
    let (q, kv, f) = (config.q_dim(), config.kv_dim(), config.intermediate_size);
    let norm = |name: &str| -> Result<RmsNorm> {
        Ok(RmsNorm {
            weight: Param::from_tensor(vector(name, d)?),
            eps: config.rms_norm_eps,
        })
    };
    let mut layers = Vec::with_capacity(config.num_hidden_layers);
    for i in 0..config.num_hidden_layers {
        let p = format!("model.layers.{i}");
        let linear = |name: &str, rows: usize, cols: usize| -> Result<Linear> {
            let layer = linear(&format!("{p}.{name}.weight"), rows, cols)?;
            Ok(match config.linear_has_bias(name) {
                true => layer.with_bias(vector(&format!("{p}.{name}.bias"), rows)?),
                false => layer,
            })
        };
        let head_norm = |name: &str| -> Result<Option<RmsNorm>> {
            if !config.qk_norm {
                return Ok(None);
            }
            Ok(Some(RmsNorm {
                weight: Param::from_tensor(vector(
                    &format!("{p}.self_attn.{name}.weight"),
                    config.head_dim,
                )?),
                eps: config.rms_norm_eps,
            }))
        };
        layers.push(DecoderBlock {
            input_layernorm: norm(&format!("{p}.input_layernorm.weight"))?,
            self_attn: Attention {
                q_proj: linear("self_attn.q_proj", q, d)?,
                k_proj: linear("self_attn.k_proj", kv, d)?,
                v_proj: linear("self_attn.v_proj", kv, d)?,
                o_proj: linear("self_attn.o_proj", d, q)?,
                q_norm: head_norm("q_norm")?,
                k_norm: head_norm("k_norm")?,
                num_heads: config.num_attention_heads,
                num_kv_heads: config.num_key_value_heads,
                head_dim: config.head_dim,
            },
            post_attention_layernorm: norm(&format!("{p}.post_attention_layernorm.weight"))?,
            mlp: Mlp {
                gate_proj: linear("mlp.gate_proj", f, d)?,
                up_proj: linear("mlp.up_proj", f, d)?,
                down_proj: linear("mlp.down_proj", d, f)?,
            },
        });
    }
    let lm_head = if config.tie_word_embeddings {
        None
    } else {
        Some(Linear::from_weight(matrix("lm_head.weight", v, d)?))
    };
    Ok(Llama {
        embed_tokens: Param::from_tensor(matrix("model.embed_tokens.weight", v, d)?),
        layers,
        norm: norm("model.norm.weight")?,
        lm_head,
        embed_lora: None,
        config: config.clone(),
        attention: Default::default(),
    })
}

fn check_no_unexpected(
    config: &LlamaConfig,
    checkpoint: &SafetensorsCheckpoint,
    expected: &[(String, Vec<usize>)],
) -> Result<()> {
    let known: std::collections::HashSet<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
    let unexpected: Vec<&str> = checkpoint
        .names()
        .filter(|n| !known.contains(n))
        .filter(|n| !n.ends_with("rotary_emb.inv_freq"))
        .filter(|n| !(config.tie_word_embeddings && *n == "lm_head.weight"))
        .collect();
    if unexpected.is_empty() {
        return Ok(());
    }
    let mut names = unexpected
        .iter()
        .take(5)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    if unexpected.len() > 5 {
        names.push_str(&format!(" and {} more", unexpected.len() - 5));
    }
    Err(Error::UnexpectedTensors {
        path: checkpoint.location.clone(),
        names,
    })
}

/// Writes `model` as a Hugging Face folder: `config.json` and an f32 `model.safetensors` with
/// HF names (NF4 linears are written dequantized), each file atomically.
pub fn save_hf_llama(model: &Llama, dir: &Path) -> Result<()> {
    for (name, bytes) in hf_files(model)? {
        super::atomic::write_atomic(&dir.join(name), &bytes)?;
    }
    Ok(())
}

/// The files of a Hugging Face folder for `model`, by name, in memory (Phi-3's projections
/// fused again, as its checkpoints store them).
pub fn hf_files(model: &Llama) -> Result<Vec<(String, Vec<u8>)>> {
    let mut tensors = std::collections::BTreeMap::new();
    for (name, shape) in model.config.stored_parameter_shapes() {
        let param = model
            .stored_tensor(&name, false)
            .ok_or_else(|| Error::Internal(format!("the model has no tensor `{name}`")))?;
        let bytes: Vec<u8> = param
            .to_vec()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        tensors.insert(name, (shape, bytes));
    }
    let config = serde_json::to_string_pretty(&model.config.to_hf_json()).unwrap_or_default();
    Ok(vec![
        (
            "model.safetensors".into(),
            super::peft::serialize_f32(&tensors)?,
        ),
        ("config.json".into(), config.into_bytes()),
    ])
}
