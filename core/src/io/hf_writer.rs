//! Writing a model as a Hugging Face folder tensor by tensor: weights in f32, f16 or bf16,
//! split into shards past a size (`model-00001-of-00003.safetensors` and
//! `model.safetensors.index.json`, as transformers' `save_pretrained` names them).
//!
//! The tensors are the ones the checkpoint stores (Phi-3's q, k, v and gate, up fused again,
//! `config/fused.rs`). Every tensor's shape is known from the config before anything is computed, so each shard's
//! safetensors header is written first and its tensors are then made and written one at a
//! time (a LoRA-merged linear is dequantized and merged alone): the memory peak is one tensor,
//! not the model. Each file is written beside its final name and renamed when complete.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::atomic::{write_atomic, write_atomic_with};
use crate::config::spellings;
use crate::error::{Error, Result};
use crate::model::Llama;

/// The float type weights are stored in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightDtype {
    /// 32-bit IEEE float.
    F32,
    /// 16-bit IEEE half (rounded to nearest even).
    F16,
    /// bfloat16 (rounded to nearest even, as torch's `.to(torch.bfloat16)`).
    Bf16,
}

impl WeightDtype {
    /// Bytes per value.
    pub fn bytes(self) -> usize {
        match self {
            WeightDtype::F32 => 4,
            WeightDtype::F16 | WeightDtype::Bf16 => 2,
        }
    }

    /// The safetensors dtype name.
    fn safetensors_name(self) -> &'static str {
        match self {
            WeightDtype::F32 => "F32",
            WeightDtype::F16 => "F16",
            WeightDtype::Bf16 => "BF16",
        }
    }

    /// torch's name (`config.json`'s `dtype`).
    pub fn torch_name(self) -> &'static str {
        match self {
            WeightDtype::F32 => "float32",
            WeightDtype::F16 => "float16",
            WeightDtype::Bf16 => "bfloat16",
        }
    }

    /// Appends `values` in this dtype, little-endian.
    fn extend_bytes(self, values: &[f32], out: &mut Vec<u8>) {
        match self {
            WeightDtype::F32 => values.iter().for_each(|v| out.extend(v.to_le_bytes())),
            WeightDtype::F16 => values
                .iter()
                .for_each(|&v| out.extend(half::f16::from_f32(v).to_le_bytes())),
            WeightDtype::Bf16 => values
                .iter()
                .for_each(|&v| out.extend(half::bf16::from_f32(v).to_le_bytes())),
        }
    }
}

spellings! {
    WeightDtype, "weight dtype", "dtype", serde;
    F32 => "f32" ["fp32", "float32"]: "32-bit IEEE float",
    F16 => "f16" ["fp16", "float16"]: "16-bit IEEE half",
    Bf16 => "bf16" ["bfloat16"]: "bfloat16, as torch's .to(torch.bfloat16)",
}

/// How a folder's weights are written.
#[derive(Debug, Clone, Copy)]
pub struct WeightLayout {
    /// The stored float type.
    pub dtype: WeightDtype,
    /// A shard is closed before a tensor would take it past this many bytes (a tensor larger
    /// than this gets a shard of its own).
    pub max_shard_bytes: u64,
    /// Fold each LoRA adapter into its weight (`W + s·B·A`); otherwise the base weights.
    pub merge_lora: bool,
}

/// The name, shape and shard of each tensor, in the order they are written.
struct ShardPlan {
    shards: Vec<Vec<(String, Vec<usize>)>>,
}

impl ShardPlan {
    fn new(tensors: Vec<(String, Vec<usize>)>, bytes_per_value: usize, max: u64) -> Self {
        let mut shards: Vec<Vec<(String, Vec<usize>)>> = vec![Vec::new()];
        let mut filled = 0u64;
        for (name, shape) in tensors {
            let size = tensor_bytes(&shape, bytes_per_value);
            let current = shards.last().map_or(0, Vec::len);
            if current > 0 && filled + size > max {
                shards.push(Vec::new());
                filled = 0;
            }
            filled += size;
            if let Some(shard) = shards.last_mut() {
                shard.push((name, shape));
            }
        }
        ShardPlan { shards }
    }

    fn file_name(&self, i: usize) -> String {
        match self.shards.len() {
            1 => "model.safetensors".into(),
            n => format!("model-{:05}-of-{n:05}.safetensors", i + 1),
        }
    }
}

fn tensor_bytes(shape: &[usize], bytes_per_value: usize) -> u64 {
    shape.iter().product::<usize>() as u64 * bytes_per_value as u64
}

/// Writes `model`'s weights and `config.json` (with `dtype`) into `dir`, tensor by tensor, and
/// removes weight files of another layout left there by an earlier write. Returns the files
/// written.
pub fn write_hf_weights(model: &Llama, dir: &Path, layout: WeightLayout) -> Result<Vec<PathBuf>> {
    fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let bytes_per_value = layout.dtype.bytes();
    let plan = ShardPlan::new(
        model.config.stored_parameter_shapes(),
        bytes_per_value,
        layout.max_shard_bytes.max(1),
    );
    let mut written = Vec::new();
    let mut weight_map = BTreeMap::new();
    let mut total = 0u64;
    for (i, shard) in plan.shards.iter().enumerate() {
        let name = plan.file_name(i);
        let path = dir.join(&name);
        write_shard(model, shard, &path, layout)?;
        for (tensor, shape) in shard {
            weight_map.insert(tensor.clone(), name.clone());
            total += tensor_bytes(shape, bytes_per_value);
        }
        written.push(path);
    }
    let index = dir.join("model.safetensors.index.json");
    if plan.shards.len() > 1 {
        let json = json!({ "metadata": { "total_size": total }, "weight_map": weight_map });
        write_atomic(&index, pretty(&json).as_bytes())?;
        written.push(index);
    }
    remove_stale_weights(dir, &written)?;
    let mut config = model.config.to_hf_json();
    config["dtype"] = layout.dtype.torch_name().into();
    config["torch_dtype"] = layout.dtype.torch_name().into();
    let config_path = dir.join("config.json");
    write_atomic(&config_path, pretty(&config).as_bytes())?;
    written.push(config_path);
    Ok(written)
}

/// One safetensors file: the header from the plan, then each tensor made and written in turn.
fn write_shard(
    model: &Llama,
    tensors: &[(String, Vec<usize>)],
    path: &Path,
    layout: WeightLayout,
) -> Result<()> {
    let dtype = layout.dtype;
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), json!({ "format": "pt" }));
    let mut offset = 0u64;
    for (name, shape) in tensors {
        let end = offset + tensor_bytes(shape, dtype.bytes());
        header.insert(
            name.clone(),
            json!({ "dtype": dtype.safetensors_name(), "shape": shape, "data_offsets": [offset, end] }),
        );
        offset = end;
    }
    let mut header = serde_json::to_vec(&Value::Object(header))
        .map_err(|e| Error::Input(format!("safetensors header: {e}")))?;
    // The data starts on an 8-byte boundary; the header is padded with spaces.
    header.resize(header.len().next_multiple_of(8), b' ');
    write_atomic_with(path, |out, tmp| {
        let io = |e| Error::io(tmp, e);
        out.write_all(&(header.len() as u64).to_le_bytes())
            .map_err(io)?;
        out.write_all(&header).map_err(io)?;
        let mut bytes = Vec::new();
        for (name, shape) in tensors {
            let tensor = model
                .stored_tensor(name, layout.merge_lora)
                .ok_or_else(|| {
                    Error::Input(format!("the model has no tensor `{name}` to write"))
                })?;
            if &tensor.dims() != shape {
                return Err(Error::Input(format!(
                    "tensor `{name}` has shape {:?}, the config says {shape:?}",
                    tensor.dims()
                )));
            }
            bytes.clear();
            dtype.extend_bytes(&tensor.to_vec(), &mut bytes);
            out.write_all(&bytes).map_err(io)?;
        }
        Ok(())
    })
}

/// Removes `model.safetensors`, the index and `model-*-of-*.safetensors` files in `dir` that
/// this write did not produce (a folder written sharded, then whole, must not keep both).
fn remove_stale_weights(dir: &Path, written: &[PathBuf]) -> Result<()> {
    let entries = fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let weights = name == "model.safetensors"
            || name == "model.safetensors.index.json"
            || (name.starts_with("model-") && name.ends_with(".safetensors"));
        if weights && !written.contains(&entry.path()) {
            fs::remove_file(entry.path()).map_err(|e| Error::io(entry.path(), e))?;
        }
    }
    Ok(())
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default()
}

/// The float dtype a checkpoint stores its weights in, for writing a model "in the base's
/// dtype": a Hugging Face folder's embedding dtype; a GGUF's F32/BF16 embedding, else f16 (the
/// dtype llama.cpp's converter writes unquantized tensors in); napkin's NF4 folder keeps f32.
pub fn base_weight_dtype(path: &Path) -> Result<WeightDtype> {
    let path = &super::resolve_model_path(path)?;
    use super::gguf::GgufFile;
    use super::gguf::dequant::GgmlType;
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        let gguf = GgufFile::open(path)?;
        return Ok(
            match gguf.tensors.get("token_embd.weight").map(|t| t.ggml_type) {
                Some(GgmlType::F32) => WeightDtype::F32,
                Some(GgmlType::Bf16) => WeightDtype::Bf16,
                _ => WeightDtype::F16,
            },
        );
    }
    if super::quantized::is_quantized_checkpoint(path) {
        return Ok(WeightDtype::F32);
    }
    let checkpoint = super::SafetensorsCheckpoint::open(path)?;
    Ok(
        match checkpoint
            .info("model.embed_tokens.weight")?
            .map(|i| i.dtype)
        {
            Some(safetensors::Dtype::F16) => WeightDtype::F16,
            Some(safetensors::Dtype::BF16) => WeightDtype::Bf16,
            _ => WeightDtype::F32,
        },
    )
}

/// `generation_config.json` for a folder: the BOS id and the ids that end generation.
pub fn generation_config_json(bos: Option<u32>, eos: &[u32]) -> Vec<u8> {
    let eos: Value = match eos {
        [] => Value::Null,
        [one] => (*one).into(),
        many => many.iter().map(|&id| Value::from(id)).collect(),
    };
    pretty(&json!({ "bos_token_id": bos, "eos_token_id": eos })).into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_close_before_the_limit_and_a_big_tensor_gets_its_own() {
        let t = |n: &str, s: &[usize]| (n.to_string(), s.to_vec());
        let plan = ShardPlan::new(
            vec![t("a", &[10]), t("b", &[10]), t("c", &[30]), t("d", &[5])],
            4,
            80,
        );
        let names: Vec<Vec<&str>> = plan
            .shards
            .iter()
            .map(|s| s.iter().map(|(n, _)| n.as_str()).collect())
            .collect();
        // a+b = 80 bytes fill the first; c (120 bytes) is over the limit alone; d follows.
        assert_eq!(names, vec![vec!["a", "b"], vec!["c"], vec!["d"]]);
        assert_eq!(plan.file_name(1), "model-00002-of-00003.safetensors");
        let one = ShardPlan::new(vec![t("a", &[10])], 4, 80);
        assert_eq!(one.file_name(0), "model.safetensors");
    }

    #[test]
    fn bf16_and_f16_round_to_nearest_even() {
        let mut out = Vec::new();
        // 1 + 2^-8 is halfway between two bf16 values: it rounds to the even one, 1.0.
        WeightDtype::Bf16.extend_bytes(&[1.0 + 1.0 / 256.0], &mut out);
        assert_eq!(out, half::bf16::from_f32(1.0).to_le_bytes());
        out.clear();
        WeightDtype::F16.extend_bytes(&[65504.0], &mut out);
        assert_eq!(out, half::f16::MAX.to_le_bytes());
    }
}
