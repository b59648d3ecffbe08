//! A few rows times an NF4 weight's transpose, `y = x · Wᵀ`, read straight from the resident
//! codes on a GPU (cubecl): the products of KV-cached generation, one new token at a time.
//! With a LoRA adapter the same launch adds its path, `y += s · d · Bᵀ` for the adapter's
//! `d = x · Aᵀ` (`[rows, r]`, computed before): three launches fewer per adapted linear (the
//! scaling, the product by B and the sum).
//!
//! For one row the product is a matrix-vector product and bound by the bytes it reads. The
//! general path (`nf4_dequantize.rs` then burn's matmul) writes the `[out, in]` weight in f32
//! and reads it back: 8 bytes per weight through device memory and a transient of 4 bytes per
//! weight in the pool. Here each weight's half byte of code is read once and never written
//! anywhere: no transient, one launch (two before: dequantize, then the product).
//!
//! A cube takes eight output features of one row, eight units each: a feature's units stride
//! over its words of eight codes (consecutive units, consecutive words), each word's eight
//! products summed and scaled once by its block's absmax (decoded in place under double
//! quantization), then the units' sums added in shared memory. f32 throughout, whatever the autocast dtype: no weight is
//! stored, so a 16-bit copy would save nothing, and the row is a few KB.
//!
//! Values: the same weights as the CPU's dequantization up to the order of the sums (and a
//! possible fused multiply-add in the double-quantized scale); the tests bound the difference
//! against an f64 reference.
//!
//! # Shapes
//! - `x`: `[rows, in]` f32, contiguous; weight `[out, in]` → `[rows, out]` f32.
//! - with an adapter: `d` `[rows, r]` and `B` `[out, r]`, f32.
//!
//! # What it needs
//! `in` and the block size multiples of 8 (a word never straddles two rows or two blocks), and
//! `out` and `rows` within one launch dimension; [`supports`] says, and the caller falls back.

use burn_backend::DType;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::nf4_dequantize::{DYNAMIC_MAP_AT, DeviceScales};
use crate::config::DOUBLE_QUANT_BLOCK;

/// Units (threads) per cube.
const UNITS_PER_CUBE: usize = 64;

/// The most cubes a launch dimension takes on every backend (WebGPU's and Vulkan's minimum).
const MAX_CUBES_PER_DIMENSION: usize = 65_535;

/// Codes per u32 word.
const CODES_PER_WORD: usize = 8;

/// Units that share one output feature's words: the kernel's eight lanes (its reduction is
/// written out for eight). Chosen on lavapipe (`napkin bench gpu --smoke`, SmolLM2's
/// [1536 × 576], one row, with a reduction loop for any count): 1 unit 7.1 ms a product, 4:
/// 3.0, 8: 2.1, 16: 2.5, 64: 5.2 (dequantizing first: 5.3). Not yet measured on a GPU,
/// where a warp (32) per feature is the usual choice.
const UNITS_PER_FEATURE: usize = 8;
const _: () = assert!(UNITS_PER_CUBE.is_multiple_of(UNITS_PER_FEATURE));

/// Whether an `[out, in]` weight with blocks of `block_size` times `rows` rows runs here.
pub fn supports(shape: [usize; 2], block_size: usize, rows: usize) -> bool {
    let [out, inp] = shape;
    let features_per_cube = UNITS_PER_CUBE / UNITS_PER_FEATURE;
    inp > 0
        && inp.is_multiple_of(CODES_PER_WORD)
        && block_size.is_multiple_of(CODES_PER_WORD)
        && (1..=MAX_CUBES_PER_DIMENSION).contains(&out.div_ceil(features_per_cube))
        && (1..=MAX_CUBES_PER_DIMENSION).contains(&rows)
}

/// `output[r, o] = Σ_i x[r, i] · codebook[code(o, i)] · scale(block(o, i))`
/// (`+ s · Σ_j d[r, j] · B[o, j]` with `low_rank`).
///
/// A cube is `[8, features]` units: unit (l, f) sums every eighth word of feature
/// `cube · features + f` from the l-th (and every eighth term of the adapter's sum), then the
/// eight lanes' sums are added in shared memory. With `double`, `scales` holds the
/// second-level scales and `qwords` the 8-bit absmax codes; without, `scales` holds the absmax
/// and `qwords` is not read. Without `low_rank`, `down` and `lora_b` are not read.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn rows_times_codes(
    x: &Tensor<f32>,
    words: &Tensor<u32>,
    scales: &Tensor<f32>,
    qwords: &Tensor<u32>,
    tables: &Tensor<f32>,
    down: &Tensor<f32>,
    lora_b: &Tensor<f32>,
    output: &mut Tensor<f32>,
    inp: usize,
    out: usize,
    block_size: usize,
    offset: f32,
    rank: usize,
    scaling: f32,
    #[comptime] double: bool,
    #[comptime] low_rank: bool,
    #[comptime] features: usize,
    #[comptime] map_at: usize,
    #[comptime] second_block: usize,
) {
    let lane = UNIT_POS_X as usize;
    let f = UNIT_POS_Y as usize;
    let o = CUBE_POS_X as usize * features + f;
    let r = CUBE_POS_Y as usize;
    let words_per_row = inp / 8;
    let first_word = o * words_per_row;
    let x_row = r * inp;
    let mut sum = 0.0f32;
    if o < out {
        let mut w = lane;
        while w < words_per_row {
            let word = words[first_word + w];
            let block = (first_word + w) * 8 / block_size;
            let scale = if double {
                let q = (qwords[block / 4] >> (8 * (block % 4) as u32)) & 0xff;
                let product = tables[map_at + q as usize] * scales[block / second_block];
                product + offset
            } else {
                scales[block]
            };
            let at = x_row + w * 8;
            let mut dot = 0.0f32;
            #[unroll]
            for k in 0..4usize {
                let byte = (word >> (8 * k as u32)) & 0xff;
                dot += x[at + 2 * k] * tables[(byte >> 4) as usize];
                dot += x[at + 2 * k + 1] * tables[(byte & 0x0f) as usize];
            }
            sum += dot * scale;
            w += 8;
        }
        if low_rank {
            let mut adapter = 0.0f32;
            let mut j = lane;
            while j < rank {
                adapter += down[r * rank + j] * lora_b[o * rank + j];
                j += 8;
            }
            sum += adapter * scaling;
        }
    }
    // The eight lanes' sums added pairwise, each step behind a barrier every unit reaches at
    // the kernel's top level (WGSL, the browser's shading language, refuses a barrier in
    // control flow it cannot prove uniform: a loop bound read at run time included).
    let mut partial = Shared::<[f32]>::new_slice(8 * features);
    let at = f * 8;
    partial[at + lane] = sum;
    sync_cube();
    if lane < 4 {
        let pair = partial[at + lane] + partial[at + lane + 4];
        partial[at + lane] = pair;
    }
    sync_cube();
    if lane < 2 {
        let pair = partial[at + lane] + partial[at + lane + 2];
        partial[at + lane] = pair;
    }
    sync_cube();
    if lane == 0 && o < out {
        output[r * out + o] = partial[at] + partial[at + 1];
    }
}

/// A LoRA adapter's path as the row product adds it: `scaling · down · Bᵀ`.
#[derive(Debug)]
pub struct LowRankPath {
    /// `x · Aᵀ`, `[rows, r]` f32.
    pub down: CubeTensor,
    /// B, `[out, r]` f32.
    pub lora_b: CubeTensor,
    /// s (α/r or α/√r).
    pub scaling: f32,
}

/// `x · Wᵀ` (`+ s · down · Bᵀ` with `low_rank`) for the `[out, in]` NF4 weight whose codes are
/// `words` (see `nf4_dequantize.rs` for the layouts). `x` is `[rows, in]` f32; [`supports`]
/// must hold, and an adapter's shapes must match (`[rows, r]`, `[out, r]`).
pub fn rows_times_transposed(
    x: CubeTensor,
    words: CubeTensor,
    scales: DeviceScales,
    tables: CubeTensor,
    shape: [usize; 2],
    block_size: usize,
    low_rank: Option<LowRankPath>,
) -> CubeTensor {
    let [out, inp] = shape;
    let rows = x.meta.shape()[0];
    debug_assert!(supports(shape, block_size, rows));
    let x = into_contiguous(x);
    let (down, lora_b, rank, scaling) = match low_rank {
        Some(path) => {
            let rank = path.down.meta.shape()[1];
            debug_assert!(path.down.meta.shape()[0] == rows);
            debug_assert!(path.lora_b.meta.shape()[0] == out);
            debug_assert!(path.lora_b.meta.shape()[1] == rank);
            (
                into_contiguous(path.down),
                into_contiguous(path.lora_b),
                rank,
                path.scaling,
            )
        }
        // Not read (the kernel's `low_rank` is off): any f32 tensor will do.
        None => (x.clone(), x.clone(), 0, 0.0),
    };
    let with_low_rank = rank > 0;
    let lanes = UNITS_PER_FEATURE;
    let features = UNITS_PER_CUBE / lanes;
    let client = x.client.clone();
    let output = empty_device_contiguous_dtype(
        client.clone(),
        x.device.clone(),
        [rows, out].into(),
        DType::F32,
    );
    let (scales, qwords, offset, double) = match scales {
        DeviceScales::Plain(absmax) => (absmax, words.clone(), 0.0, false),
        DeviceScales::Double {
            qwords,
            absmax2,
            offset,
        } => (absmax2, qwords, offset, true),
    };
    // Safety: the units of feature o < out in row r read `x[r, ..in]` (x is `[rows, in]`,
    // contiguous), the words of feature o (`o · in/8 ..` `(o + 1) · in/8`, within
    // `ceil(out · in / 8)`), the scales of their blocks (below `ceil(out · in / block_size)`,
    // or a quarter of that in codes and one 256th in second-level scales), table entries below
    // 16 + 256, with an adapter `down[r, ..rank]` and `B[o, ..rank]` (both contiguous, shapes
    // as asserted above); it writes `output[r, o]`.
    unsafe {
        rows_times_codes::launch_unchecked(
            &client,
            CubeCount::Static(out.div_ceil(features) as u32, rows as u32, 1),
            CubeDim::new_2d(lanes as u32, features as u32),
            x.into_tensor_arg(),
            words.into_tensor_arg(),
            scales.into_tensor_arg(),
            qwords.into_tensor_arg(),
            tables.into_tensor_arg(),
            down.into_tensor_arg(),
            lora_b.into_tensor_arg(),
            output.clone().into_tensor_arg(),
            inp,
            out,
            block_size,
            offset,
            rank,
            scaling,
            double,
            with_low_rank,
            features,
            DYNAMIC_MAP_AT,
            DOUBLE_QUANT_BLOCK,
        );
    }
    output
}
