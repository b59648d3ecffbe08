//! Kernels on host values: what runs when the tensors live in the CPU's memory.
//!
//! - `fused/`: the CPU kernel runtime (custom autodiff ops on Flex/NdArray host values) and the
//!   fused element-wise kernels (RMSNorm, RoPE, SwiGLU, the loss, tiled attention).
//! - `gemm.rs`: f32 GEMM split over rayon's threads (OpenBLAS builds).
//! - `quantized/`: products with weights kept in ggml's Q4_0, Q4_1, Q8_0, Q4_K, Q5_K and Q6_K
//!   blocks or as NF4 codes, and 16- or 8-bit activations (integer SIMD dot products, as
//!   llama.cpp), for generation from a GGUF or a QLoRA base.
//! - `cached_attention.rs`: generation's attention of new queries over a host KV cache kept in
//!   tiles of eight positions (SSE2 or AVX2, the same bits).
//! - `team.rs`: compute threads kept spinning between the parallel passes of one forward pass
//!   (generation's products and attention), instead of sleeping and waking ~90 times a token.

pub mod cached_attention;
pub mod fused;
#[cfg(feature = "openblas")]
pub mod gemm;
pub mod quantized;
pub mod team;
