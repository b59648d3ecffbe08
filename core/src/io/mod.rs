//! Checkpoint formats: safetensors (single and sharded), Hugging Face model folders, peft
//! adapters, and crash-safe writing.

pub mod atomic;
pub mod hf;
pub mod peft;
pub mod safetensors;

pub use hf::{llama_from_checkpoint, load_hf_llama};
pub use safetensors::SafetensorsCheckpoint;
