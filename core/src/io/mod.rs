//! Checkpoint formats: safetensors (single and sharded), Hugging Face model folders, GGUF, peft
//! adapters, napkin's NF4 checkpoint, and crash-safe writing.

pub mod atomic;
pub mod fused_reader;
pub mod gguf;
pub mod hf;
pub mod hf_writer;
pub mod peft;
pub mod peft_fused;
pub mod quantized;
pub mod safetensors;

pub use hf::{llama_from_checkpoint, load_hf_llama, save_hf_llama};
pub use safetensors::SafetensorsCheckpoint;

use std::path::Path;

use burn::tensor::Device;

use crate::config::Nf4Config;
use crate::error::Result;
use crate::model::Llama;

/// The model folder a path names: a Hugging Face cache folder (`models--org--name`, as
/// `huggingface_hub` downloads into `~/.cache/huggingface/hub`) becomes the snapshot its
/// `refs/main` points at (or its only snapshot); any other path is itself. A snapshot folder's
/// files are symlinks into `blobs/`, which reading follows.
pub fn resolve_model_path(path: &Path) -> Result<std::path::PathBuf> {
    let snapshots = path.join("snapshots");
    if !snapshots.is_dir() {
        return Ok(path.to_path_buf());
    }
    if let Ok(reference) = std::fs::read_to_string(path.join("refs").join("main")) {
        let snapshot = snapshots.join(reference.trim());
        if snapshot.is_dir() {
            return Ok(snapshot);
        }
    }
    let found: Vec<_> = std::fs::read_dir(&snapshots)
        .map_err(|e| crate::Error::io(&snapshots, e))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    match found.as_slice() {
        [one] => Ok(one.clone()),
        _ => Err(crate::Error::Input(format!(
            "{}: a Hugging Face cache folder with {} snapshots and no usable refs/main; pass the snapshot folder (snapshots/<hash>)",
            path.display(),
            found.len()
        ))),
    }
}

/// Loads a model from a `.gguf` file, a Hugging Face folder or a napkin NF4 checkpoint folder.
pub fn load_model(path: &Path, device: &Device) -> Result<Llama> {
    load_model_with(path, device, None)
}

/// As [`load_model`]; with `nf4`, the block linears are quantized to NF4 one by one as they
/// are read (a napkin NF4 checkpoint is loaded as it was saved).
pub fn load_model_with(path: &Path, device: &Device, nf4: Option<&Nf4Config>) -> Result<Llama> {
    let path = &resolve_model_path(path)?;
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        gguf::llama::load_gguf_llama_with(&gguf::GgufFile::open(path)?, device, nf4)
    } else if quantized::is_quantized_checkpoint(path) {
        Ok(quantized::load_quantized(path, device)?.0)
    } else {
        let config = crate::config::LlamaConfig::from_hf_file(&path.join("config.json"))?;
        let checkpoint = SafetensorsCheckpoint::open(path)?;
        hf::llama_from_checkpoint_with(&config, &checkpoint, device, nf4)
    }
}
