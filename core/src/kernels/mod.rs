//! The kernels floor: the performance code below the model, so that `model/` reads as the math.
//! The model calls these; nothing here knows the model. Split by where the code runs:
//!
//! - `cpu/`: kernels on host values (burn Flex or NdArray): the fused training kernels, the
//!   OpenBLAS GEMM, generation's quantized products, its KV-cache attention and thread team.
//! - `gpu/`: cubecl kernels for the GPU backends (wgpu: Vulkan, Metal, DX12, WebGPU; CUDA):
//!   the fused training kernels, AdamW, the resident NF4 weights and generation's few-row ops.
//! - `efficient_attention.rs`: memory-efficient attention as a custom autodiff op on every
//!   backend (its host-value tiles are `cpu/fused/tiled_attention.rs`).
//! - `norm_and_gating.rs`: RMSNorm and SwiGLU on whichever of those holds the tensors, burn's
//!   ops otherwise.
//! - `values.rs`: reading tensor values back to the host (`to_f32_vec`, `scalar`).

pub mod cpu;
pub mod efficient_attention;
pub mod gpu;
mod norm_and_gating;
pub mod values;

pub use norm_and_gating::{rms_norm, swiglu};
