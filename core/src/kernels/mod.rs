//! The kernels floor: the performance code below the model, so that `model/` reads as the math.
//! The model calls these; nothing here knows the model.
//!
//! - `values.rs`: reading tensor values back to the host (`to_f32_vec`, `scalar`).
//! - `fused/`: the CPU kernel runtime (custom autodiff ops on Flex/NdArray host values) and the
//!   fused element-wise kernels (RMSNorm, RoPE, SwiGLU, the loss, tiled attention).
//! - `cube_fused/`: training's fused RMSNorm, RoPE, SwiGLU, eager-attention softmax, loss and
//!   LoRA sum on the GPU backends (cubecl custom autodiff ops with `fused/`'s formulas and keeps), forward and
//!   backward.
//! - `cpu_gemm.rs`: f32 GEMM split over rayon's threads (OpenBLAS builds).
//! - `efficient_attention.rs`: memory-efficient attention as a custom autodiff op on every backend.
//! - `quantized/`: products with weights kept in ggml's Q4_0, Q4_1, Q8_0, Q4_K, Q5_K and Q6_K
//!   blocks or as NF4 codes, and 16- or 8-bit activations (integer SIMD dot products, as
//!   llama.cpp), for generation from a GGUF or a QLoRA base;
//! - `resident_nf4.rs`: an NF4 weight's codes and scales on a GPU device, uploaded once;
//! - `nf4_dequantize.rs`: their dequantization there (cubecl), bit-exact with the CPU;
//! - `nf4_row_product.rs`: a few rows times such a weight straight from its codes (cubecl),
//!   KV-cached generation's products, with no dequantized transient (and a LoRA adapter's
//!   path in the same launch);
//! - `rms_norm_rows.rs`, `rope_rows.rs`, `swiglu_rows.rs`: generation's RMSNorm, rotary
//!   embedding and SwiGLU of a few rows in one launch each (cubecl), instead of seven, six and
//!   eight;
//! - `attention_rows.rs`: generation's attention of a few new queries over the KV cache in one
//!   launch (cubecl), instead of nine;
//! - `cube_reduce.rs`: the 64-unit halving reduction (sum or maximum) those kernels share;
//! - `adamw.rs`: AdamW's update of four parameters in one launch (cubecl; one a launch where
//!   a device offers too few bindings), instead of ~13 ops each.
//! - `cached_attention.rs`: generation's attention of new queries over a host KV cache (SSE2
//!   or AVX2, the same bits).
//! - `team.rs`: compute threads kept spinning between the parallel passes of one forward pass
//!   (generation's products and attention), instead of sleeping and waking ~90 times a token.

#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod adamw;
pub mod attention_rows;
pub mod cached_attention;
#[cfg(feature = "openblas")]
pub mod cpu_gemm;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod cube_fused;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod cube_reduce;
pub mod efficient_attention;
pub mod fused;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod nf4_dequantize;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod nf4_row_product;
pub mod quantized;
pub mod resident_nf4;
pub mod rms_norm_rows;
pub mod rope_rows;
pub mod swiglu_rows;
pub mod team;
pub mod values;

/// The most rows (`B·T`) the `*_rows.rs` kernels take: KV-cached generation's new tokens.
pub const ROWS_IN_ONE_LAUNCH: usize = 4;

/// Whether `rows` rows on `device` are generation's few rows on a GPU, the inputs the
/// `*_rows.rs` kernels take (the forwards the memory predictor replays have more and keep
/// burn's ops).
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn few_rows_on_gpu(rows: usize, device: &burn::tensor::Device) -> bool {
    (1..=ROWS_IN_ONE_LAUNCH).contains(&rows) && crate::device::is_gpu(device)
}

/// An operand of the `*_rows.rs` kernels: `t` as burn's cubecl primitive, when it needs no
/// gradient and holds f32; `None` otherwise.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn untracked_f32<const D: usize>(
    t: &burn::tensor::Tensor<D>,
) -> Option<burn_cubecl::tensor::CubeTensor> {
    if t.is_tracked() || t.dtype() != burn::tensor::DType::F32 {
        return None;
    }
    t.clone()
        .without_autodiff()
        .try_into_primitive::<burn::backend::Cube>()
        .ok()
}

/// A `*_rows.rs` kernel's result as a tensor on the device kind of its input `like` (the
/// autodiff device when `like` lives there; untracked either way).
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn result_like<const D: usize, const E: usize>(
    y: burn_cubecl::tensor::CubeTensor,
    like: &burn::tensor::Tensor<E>,
) -> burn::tensor::Tensor<D> {
    let y = burn::tensor::Tensor::<D>::from_primitive::<burn::backend::Cube>(y);
    if like.is_autodiff() { y.autodiff() } else { y }
}

/// The launch geometry of one thread per item for `items` items on `client`'s device.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn one_thread_each(
    client: &cubecl::client::Client,
    items: usize,
) -> (cubecl::prelude::CubeCount, cubecl::CubeDim) {
    let cube_dim = cubecl::CubeDim::new(client, items);
    (
        cubecl::calculate_cube_count_elemwise(client, items, cube_dim),
        cube_dim,
    )
}
