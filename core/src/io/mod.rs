//! Checkpoint formats: safetensors (single and sharded) and Hugging Face model folders.

pub mod hf;
pub mod safetensors;

pub use hf::{llama_from_checkpoint, load_hf_llama};
pub use safetensors::SafetensorsCheckpoint;
