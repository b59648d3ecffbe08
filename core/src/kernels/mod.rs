//! The kernels floor: performance code below the model. Today the GPU kernels (cubecl: one
//! source for Vulkan, Metal, WebGPU and CUDA) and the NF4 storage they read.
//!
//! - `resident_nf4.rs`: an NF4 weight's codes and scales on a GPU device, uploaded once;
//! - `nf4_dequantize.rs`: their dequantization there (cubecl), bit-exact with the CPU;
//! - `adamw.rs`: AdamW's update of one parameter in one launch (cubecl), instead of ~13 ops.

#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod adamw;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod nf4_dequantize;
pub mod resident_nf4;

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
