//! NF4 dequantization on a GPU, as cubecl kernels: one source for Vulkan, Metal, WebGPU and
//! CUDA. The codes and scales stay on the device; each product turns them into a transient
//! `[out, in]` weight there, so nothing crosses the host link per product.
//!
//! Bit for bit the CPU's dequantization (`quant/nf4.rs`): each value is one f32 product
//! `codebook[code] · scale`. Under double quantization the scale is `(code8[q] · absmax2) +
//! offset`, two roundings on the CPU; a GPU compiler may contract `a · b + c` into one fused
//! multiply-add (NVRTC does by default), which rounds once. So the product is written to memory
//! by a first kernel and the offset added by the second: a stored value cannot be contracted.
//!
//! # Layouts (on the device)
//! - `words`: `[ceil(n / 8)]` u32, the packed codes of `quant::nf4` four bytes per word, little
//!   endian (byte k of the word is bits 8k..8k+8; its high nibble is the even weight);
//! - `scales`: `[num_blocks]` f32, the absmax of each block (plain), or the products
//!   `code8[q] · absmax2` of the first kernel (double quantization);
//! - `qwords`: `[ceil(num_blocks / 4)]` u32, the 8-bit absmax codes four per word;
//! - `absmax2`: `[ceil(num_blocks / 256)]` f32, the second-level scales;
//! - `tables`: `[16 + 256]` f32, the NF4 codebook then bitsandbytes' signed dynamic map.

use burn_backend::DType;
use burn_backend::cubecl::dtype_to_storage_type;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use crate::config::DOUBLE_QUANT_BLOCK;

/// Where the signed dynamic map starts in `tables` (after the 16 NF4 code values).
pub const DYNAMIC_MAP_AT: usize = 16;

/// Weights one thread writes: the eight codes of one u32 word.
const WEIGHTS_PER_WORD: usize = 8;

/// One thread per u32 word of codes: up to eight values, `codebook[code] · scale`.
#[cube(launch_unchecked)]
fn dequantize_words<F: Float>(
    words: &Tensor<u32>,
    scales: &Tensor<f32>,
    tables: &Tensor<f32>,
    output: &mut Tensor<F>,
    n: usize,
    block_size: usize,
    offset: f32,
    #[comptime] add_offset: bool,
    #[define(F)] _dtype: ElemType,
) {
    let w = ABSOLUTE_POS;
    if w >= words.len() {
        terminate!();
    }
    let word = words[w];
    #[unroll]
    for k in 0..4usize {
        let at = w * 8 + 2 * k;
        if at < n {
            let byte = (word >> (8 * k as u32)) & 0xff;
            let mut scale = scales[at / block_size];
            if add_offset {
                scale += offset;
            }
            output[at] = F::cast_from(tables[(byte >> 4) as usize] * scale);
            if at + 1 < n {
                output[at + 1] = F::cast_from(tables[(byte & 0x0f) as usize] * scale);
            }
        }
    }
}

/// Double quantization, first step: one thread per block, `code8[q] · absmax2[block / 256]`.
#[cube(launch_unchecked)]
fn double_quant_products(
    qwords: &Tensor<u32>,
    absmax2: &Tensor<f32>,
    tables: &Tensor<f32>,
    products: &mut Tensor<f32>,
    num_blocks: usize,
    #[comptime] map_at: usize,
    #[comptime] second_block: usize,
) {
    let b = ABSOLUTE_POS;
    if b >= num_blocks {
        terminate!();
    }
    let q = (qwords[b / 4] >> (8 * (b % 4) as u32)) & 0xff;
    products[b] = tables[map_at + q as usize] * absmax2[b / second_block];
}

/// The scales of an NF4 tensor on the device.
#[derive(Debug, Clone)]
// Made for one dequantization and consumed by it: its size on the stack does not matter.
#[allow(clippy::large_enum_variant)]
pub enum DeviceScales {
    /// `[num_blocks]` f32 absmax.
    Plain(CubeTensor),
    /// Double quantization: `[ceil(num_blocks / 4)]` u32 codes, `[ceil(num_blocks / 256)]` f32
    /// second-level scales, and the offset.
    Double {
        /// The 8-bit absmax codes, four per word.
        qwords: CubeTensor,
        /// The second-level scales.
        absmax2: CubeTensor,
        /// The mean added back.
        offset: f32,
    },
}

/// Dequantizes `n` weights of blocks of `block_size` into a new contiguous `shape` tensor of
/// `dtype` on the codes' device (f32 bit-exact with the CPU; a 16-bit dtype is that value
/// rounded once).
pub fn dequantize(
    words: CubeTensor,
    scales: DeviceScales,
    tables: CubeTensor,
    n: usize,
    block_size: usize,
    shape: [usize; 2],
    dtype: DType,
) -> CubeTensor {
    let client = words.client.clone();
    let device = words.device.clone();
    let num_blocks = n.div_ceil(block_size);
    let (scales, offset) = match scales {
        DeviceScales::Plain(absmax) => (absmax, None),
        DeviceScales::Double {
            qwords,
            absmax2,
            offset,
        } => {
            let products = empty_device_contiguous_dtype(
                client.clone(),
                device.clone(),
                [num_blocks].into(),
                DType::F32,
            );
            let (cube_count, cube_dim) = super::one_thread_each(&client, num_blocks);
            // Safety: every index the kernel reads is below the length its caller uploaded
            // (`num_blocks` codes, one second-level scale per 256 blocks, 16 + 256 table
            // entries), and it writes only `products[b]` for `b < num_blocks`.
            unsafe {
                double_quant_products::launch_unchecked(
                    &client,
                    cube_count,
                    cube_dim,
                    qwords.into_tensor_arg(),
                    absmax2.into_tensor_arg(),
                    tables.clone().into_tensor_arg(),
                    products.clone().into_tensor_arg(),
                    num_blocks,
                    DYNAMIC_MAP_AT,
                    DOUBLE_QUANT_BLOCK,
                );
            }
            (products, Some(offset))
        }
    };
    let output = empty_device_contiguous_dtype(client.clone(), device, shape.into(), dtype);
    let threads = n.div_ceil(WEIGHTS_PER_WORD);
    let (cube_count, cube_dim) = super::one_thread_each(&client, threads);
    // Safety: one thread per word of `words` (`ceil(n / 8)` of them); every write index is
    // below `n`, the output's length; every scale index below `ceil(n / block_size)`.
    unsafe {
        dequantize_words::launch_unchecked(
            &client,
            cube_count,
            cube_dim,
            words.into_tensor_arg(),
            scales.into_tensor_arg(),
            tables.into_tensor_arg(),
            output.clone().into_tensor_arg(),
            n,
            block_size,
            offset.unwrap_or(0.0),
            offset.is_some(),
            dtype_to_storage_type(dtype),
        );
    }
    output
}
