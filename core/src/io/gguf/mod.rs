//! GGUF, llama.cpp's checkpoint format: reading (`reader`), dequantizing (`dequant`) and
//! turning a llama-architecture file into a [`crate::model::Llama`] (`llama`) or, its blocks kept,
//! a [`crate::model::quantized_llama::QuantizedLlama`] for generation (`quantized_llama`);
//! Llama 3's RoPE schedule as llama.cpp stores it (`rope_factors`).

pub mod dequant;
pub mod export;
pub mod llama;
pub mod quantize;
mod quantize_k;
pub mod quantized_llama;
pub mod reader;
pub mod rope_factors;
pub mod type_mix;
pub mod writer;

pub use llama::{gguf_config, load_gguf_llama, load_gguf_llama_with};
pub use quantized_llama::{load_gguf_quantized, load_gguf_quantized_with};
pub use reader::{GgufFile, GgufValue};
