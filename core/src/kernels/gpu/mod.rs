//! cubecl kernels for the GPU backends, one source for Vulkan, Metal, DX12, WebGPU and CUDA.
//! Each file's public API compiles without a GPU backend too, and falls back (or refuses) there.
//!
//! - `fused/`: training's fused RMSNorm, RoPE, SwiGLU, eager-attention softmax, loss and LoRA
//!   sum (cubecl custom autodiff ops with `cpu/fused/`'s formulas and keeps), forward and
//!   backward.
//! - `adamw.rs`: AdamW's update of four parameters in one launch (one a launch where a device
//!   offers too few bindings), instead of ~13 ops each, with gradient clipping's factor folded in;
//! - `sum_of_squares.rs`: the gradients' global norm, six tensors a launch and one read, instead
//!   of two ops and a read per tensor;
//! - `resident_nf4.rs`: an NF4 weight's codes and scales on a GPU device, uploaded once;
//! - `nf4_dequantize.rs`: their dequantization there, bit-exact with the CPU;
//! - `nf4_row_product.rs`: a few rows times such a weight straight from its codes, KV-cached
//!   generation's products, with no dequantized transient (and a LoRA adapter's path in the
//!   same launch);
//! - `rms_norm_rows.rs`, `rope_rows.rs`, `swiglu_rows.rs`: generation's RMSNorm, rotary
//!   embedding and SwiGLU of a few rows in one launch each, instead of seven, six and eight;
//! - `attention_rows.rs`: generation's attention of a few new queries over the KV cache in one
//!   launch, instead of nine;
//! - `reduce.rs`: the 64-unit halving reduction (sum or maximum) those kernels share.

#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod adamw;
pub mod attention_rows;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod fused;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod nf4_dequantize;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod nf4_row_product;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod reduce;
pub mod resident_nf4;
pub mod rms_norm_rows;
pub mod rope_rows;
pub mod sum_of_squares;
pub mod swiglu_rows;

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

/// Up to `K` slots of `N` tensors each, laid end to end for one launch of a grouped kernel
/// (thread `at` belongs to the first slot whose end exceeds it): the slots' running ends (their
/// first tensor's length summed; empty slots end where the last member does, so none is
/// chosen), the total, and every slot's tensors in order as launch arguments, padded to `K`
/// slots with the last member repeated (never indexed).
///
/// # Panics
/// With no slot or more than `K`: the caller's grouping is wrong.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn laid_end_to_end<const N: usize, const K: usize>(
    mut slots: Vec<[burn_cubecl::tensor::CubeTensor; N]>,
) -> (
    [usize; K],
    usize,
    impl Iterator<Item = cubecl::prelude::TensorArg>,
) {
    assert!((1..=K).contains(&slots.len()), "1 to {K} slots");
    let mut ends = [0usize; K];
    let mut total = 0;
    for (slot, tensors) in slots.iter().enumerate() {
        total += tensors[0].meta.shape().num_elements();
        ends[slot] = total;
    }
    for end in ends.iter_mut().skip(slots.len()) {
        *end = total;
    }
    while slots.len() < K {
        slots.push(slots[slots.len() - 1].clone());
    }
    let args = slots
        .into_iter()
        .flatten()
        .map(burn_cubecl::tensor::CubeTensor::into_tensor_arg);
    (ends, total, args)
}
