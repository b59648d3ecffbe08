//! Checkpoint formats: safetensors (single and sharded), Hugging Face model folders, GGUF, peft
//! adapters, napkin's NF4 checkpoint, and crash-safe writing.

pub mod atomic;
pub mod gguf;
pub mod hf;
pub mod peft;
pub mod quantized;
pub mod safetensors;

pub use hf::{llama_from_checkpoint, load_hf_llama, save_hf_llama};
pub use safetensors::SafetensorsCheckpoint;

use std::path::Path;

use burn::tensor::Device;

use crate::error::Result;
use crate::model::Llama;

/// Loads a model from a `.gguf` file, a Hugging Face folder or a napkin NF4 checkpoint folder.
pub fn load_model(path: &Path, device: &Device) -> Result<Llama> {
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        gguf::load_gguf_llama(&gguf::GgufFile::open(path)?, device)
    } else if quantized::is_quantized_checkpoint(path) {
        Ok(quantized::load_quantized(path, device)?.0)
    } else {
        load_hf_llama(path, device)
    }
}
