//! NF4: 4-bit NormalFloat block-wise quantization with optional double quantization,
//! bit-exact with bitsandbytes 0.50 (`quantize_4bit(quant_type="nf4")`).
//!
//! Layout (see `shared/fixtures/README.md`):
//! - the tensor is flattened row-major and cut into blocks of `block_size` weights (the last
//!   block may be partial); each block stores `absmax = max |x|` as its scale;
//! - each weight becomes the index of the nearest of 16 code values (quantiles of N(0, 1) scaled
//!   to [-1, 1]); a value exactly between two codes takes the lower one;
//! - two codes per byte, element 2k in the high nibble, 2k+1 in the low one (an odd count
//!   ends in the code of 0.0);
//! - double quantization keeps the codes and compresses the absmax vector: subtract its mean
//!   (torch's float32 mean, added in torch's order: `torch_mean.rs`), then 8-bit block-wise
//!   quantization (blocks of 256) on the signed dynamic map.
//!
//! Pure Rust, no tensors: the NF4 weight of a linear (`model/nf4_weight.rs`) dequantizes from here.

use rayon::prelude::*;

use super::blockwise8::Blockwise8;
use super::dynamic_map::dynamic_map_signed;
use super::nf4_decode::{decode_blocks, decoder};
use super::torch_mean::torch_cpu_mean;
use crate::config::{DOUBLE_QUANT_BLOCK, Nf4Config};
use crate::error::{Error, Result};

/// Quantization blocks one rayon task dequantizes (16 Ki weights at block size 64): enough work
/// to be worth a hand-off, small enough for the 576 × 576 weights to split across threads.
const DEQUANTIZE_BLOCKS_PER_TASK: usize = 256;

/// The 16 NF4 code values, index = 4-bit code (QLoRA, Dettmers et al. 2023; as in bitsandbytes).
/// Written with bitsandbytes' digits, more than an f32 holds, so they can be checked against it.
#[allow(clippy::excessive_precision)]
pub const NF4_CODEBOOK: [f32; 16] = [
    -1.0,
    -0.696_192_800_998_687_7,
    -0.525_073_051_452_636_7,
    -0.394_917_488_098_144_5,
    -0.284_441_381_692_886_35,
    -0.184_773_430_228_233_34,
    -0.091_050_036_251_544_95,
    0.0,
    0.079_580_299_556_255_34,
    0.160_930_201_411_247_25,
    0.246_112_301_945_686_34,
    0.337_915_241_718_292_24,
    0.440_709_829_330_444_34,
    0.562_617_003_917_694_1,
    0.722_956_836_223_602_3,
    1.0,
];

/// Storage for the per-block absmax scales.
#[derive(Debug, Clone, PartialEq)]
pub enum Nf4Scales {
    /// One f32 per block.
    Plain {
        /// `[ceil(n / block_size)]`.
        absmax: Vec<f32>,
    },
    /// 8-bit codes of `absmax − offset`, with one f32 scale per 256 blocks.
    Double {
        /// The mean of the absmax vector.
        offset: f32,
        /// `[num_blocks]` indices into [`dynamic_map_signed`].
        qabsmax: Vec<u8>,
        /// `[ceil(num_blocks / 256)]` max |absmax − offset| per second-level block.
        absmax2: Vec<f32>,
    },
}

/// A tensor quantized to NF4: packed codes plus scales. Never holds a float copy.
#[derive(Debug, Clone, PartialEq)]
pub struct Nf4Tensor {
    /// The logical shape (for a linear weight `[out, in]`).
    pub shape: Vec<usize>,
    /// Weights per absmax block.
    pub block_size: usize,
    /// `[ceil(n / 2)]` two codes per byte, high nibble first.
    pub packed: Vec<u8>,
    /// The block scales.
    pub scales: Nf4Scales,
}

/// Byte counts of a quantized tensor, by component.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Nf4Bytes {
    /// Packed 4-bit codes.
    pub codes: u64,
    /// Block scales (f32 absmax, or u8 codes + second-level f32 scales + offset).
    pub scales: u64,
}

impl Nf4Bytes {
    /// Codes plus scales.
    pub fn total(&self) -> u64 {
        self.codes + self.scales
    }
}

/// The 15 decision boundaries between neighbouring codes, in float32.
fn midpoints() -> [f32; 15] {
    std::array::from_fn(|i| (NF4_CODEBOOK[i] + NF4_CODEBOOK[i + 1]) / 2.0)
}

/// The code of a scaled value `s ∈ [-1, 1]`: the number of midpoints strictly below it.
fn nf4_code(s: f32, mids: &[f32; 15]) -> u8 {
    mids.iter().take_while(|&&m| m < s).count() as u8
}

impl Nf4Tensor {
    /// Quantizes `values` (row-major, of `shape`).
    pub fn quantize(values: &[f32], shape: &[usize], config: &Nf4Config) -> Result<Self> {
        config.validate()?;
        let n: usize = shape.iter().product();
        if n != values.len() {
            return Err(Error::Input(format!(
                "NF4: {} values for shape {shape:?} ({n} expected)",
                values.len()
            )));
        }
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(Error::Input(format!(
                "NF4: value {} at index {i} is not finite",
                values[i]
            )));
        }
        let bs = config.block_size;
        let mids = midpoints();
        let mut codes = vec![0u8; n];
        let mut absmax = Vec::with_capacity(n.div_ceil(bs));
        for (block, out) in values.chunks(bs).zip(codes.chunks_mut(bs)) {
            let am = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            absmax.push(am);
            let am = am.max(1e-38); // an all-zero block maps to code 7 (= 0.0)
            let full = block.len() == bs;
            let inv = 1.0f32 / am;
            for (v, code) in block.iter().zip(out.iter_mut()) {
                // bitsandbytes multiplies by the reciprocal in full blocks and divides in the
                // trailing partial one; the two can differ in the last bit.
                let s = if full { v * inv } else { v / am };
                *code = nf4_code(s.clamp(-1.0, 1.0), &mids);
            }
        }
        let scales = if config.double_quant {
            double_quantize(&absmax)
        } else {
            Nf4Scales::Plain { absmax }
        };
        Ok(Nf4Tensor {
            shape: shape.to_vec(),
            block_size: bs,
            packed: pack(&codes),
            scales,
        })
    }

    /// Number of weights.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the tensor has no weights.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rows `start..start + rows` of a `[R, C]` tensor as a tensor of their own with the same
    /// codes and scales (under double quantization the same offset and second-level scales),
    /// so both dequantize those rows alike. None when the rows do not start and end on whole
    /// blocks, or under double quantization on whole groups of 256 blocks (the tensor's end
    /// excepted).
    pub fn rows(&self, start: usize, rows: usize) -> Option<Nf4Tensor> {
        let [total, cols] = self.shape[..] else {
            return None;
        };
        let bs = self.block_size;
        let (first, end) = (start * cols, (start + rows) * cols);
        if start + rows > total || !first.is_multiple_of(bs) || !end.is_multiple_of(bs) {
            return None;
        }
        let blocks = first / bs..end / bs;
        let scales = match &self.scales {
            Nf4Scales::Plain { absmax } => Nf4Scales::Plain {
                absmax: absmax[blocks].to_vec(),
            },
            Nf4Scales::Double {
                offset,
                qabsmax,
                absmax2,
            } => {
                let whole = |b: usize| b.is_multiple_of(DOUBLE_QUANT_BLOCK) || b == qabsmax.len();
                if !whole(blocks.start) || !whole(blocks.end) {
                    return None;
                }
                let groups =
                    blocks.start / DOUBLE_QUANT_BLOCK..blocks.end.div_ceil(DOUBLE_QUANT_BLOCK);
                Nf4Scales::Double {
                    offset: *offset,
                    qabsmax: qabsmax[blocks].to_vec(),
                    absmax2: absmax2[groups].to_vec(),
                }
            }
        };
        Some(Nf4Tensor {
            shape: vec![rows, cols],
            block_size: bs,
            packed: self.packed[first / 2..end / 2].to_vec(),
            scales,
        })
    }

    /// Quantizes a `[Σ rows, cols]` tensor of parts `rows` rows each (Phi-3's fused
    /// projections) as one tensor, as bitsandbytes quantizes it, and returns each part's rows
    /// of it ([`Nf4Tensor::rows`]); a part that is not whole blocks (under double quantization,
    /// whole groups of them) is quantized alone.
    pub fn quantize_parts(
        values: &[f32],
        rows: &[usize],
        cols: usize,
        config: &Nf4Config,
    ) -> Result<Vec<Nf4Tensor>> {
        let whole = Nf4Tensor::quantize(values, &[rows.iter().sum(), cols], config)?;
        let mut start = 0;
        rows.iter()
            .map(|&n| {
                start += n;
                let first = start - n;
                match whole.rows(first, n) {
                    Some(part) => Ok(part),
                    None => {
                        Nf4Tensor::quantize(&values[first * cols..start * cols], &[n, cols], config)
                    }
                }
            })
            .collect()
    }

    /// The per-block scales as f32 (reconstructed from 8 bits under double quantization).
    pub fn absmax(&self) -> Vec<f32> {
        match &self.scales {
            Nf4Scales::Plain { absmax } => absmax.clone(),
            Nf4Scales::Double {
                offset,
                qabsmax,
                absmax2,
            } => {
                let code8 = dynamic_map_signed();
                qabsmax
                    .iter()
                    .enumerate()
                    .map(|(j, &q)| code8[q as usize] * absmax2[j / DOUBLE_QUANT_BLOCK] + offset)
                    .collect()
            }
        }
    }

    /// The unpacked 4-bit code of every weight.
    pub fn codes(&self) -> Vec<u8> {
        let mut codes: Vec<u8> = self
            .packed
            .iter()
            .flat_map(|&b| [b >> 4, b & 0x0f])
            .collect();
        codes.truncate(self.len());
        codes
    }

    /// Dequantizes into `out` (length n): `codebook[code] · absmax[block]`, in float32.
    pub fn dequantize_into(&self, out: &mut [f32]) {
        let absmax = self.absmax();
        let bs = self.block_size;
        debug_assert_eq!(out.len(), self.len());
        // Runs of blocks on rayon's threads, each value `codebook[code] · absmax[block]`
        // (`nf4_decode.rs`; bs is even, so a block never splits a byte).
        out.par_chunks_mut(bs * DEQUANTIZE_BLOCKS_PER_TASK)
            .enumerate()
            .for_each(|(task, run)| {
                let first = task * DEQUANTIZE_BLOCKS_PER_TASK;
                let whole = run.len() / bs * bs;
                let (blocks, tail) = run.split_at_mut(whole);
                decode_blocks(
                    &NF4_CODEBOOK,
                    &absmax[first..],
                    bs,
                    &self.packed[first * bs / 2..],
                    blocks,
                );
                if !tail.is_empty() {
                    // A last, partial block (a length that is not a multiple of bs).
                    let b = first + whole / bs;
                    let table: [f32; 16] = std::array::from_fn(|c| NF4_CODEBOOK[c] * absmax[b]);
                    decoder()(&table, &self.packed[b * bs / 2..], tail);
                }
            });
    }

    /// Dequantizes to a new vector.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0.0f32; self.len()];
        self.dequantize_into(&mut out);
        out
    }

    /// Storage bytes by component.
    pub fn bytes(&self) -> Nf4Bytes {
        let scales = match &self.scales {
            Nf4Scales::Plain { absmax } => 4 * absmax.len(),
            Nf4Scales::Double {
                qabsmax, absmax2, ..
            } => qabsmax.len() + 4 * absmax2.len() + 4,
        };
        Nf4Bytes {
            codes: self.packed.len() as u64,
            scales: scales as u64,
        }
    }
}

/// The code of 0.0.
const ZERO_CODE: u8 = 7;

/// Two codes per byte, element 2k in the high nibble; with an odd count the last low nibble is
/// the code of 0.0, as bitsandbytes writes it (its kernel quantizes a zero past the end).
fn pack(codes: &[u8]) -> Vec<u8> {
    codes
        .chunks(2)
        .map(|pair| (pair[0] << 4) | pair.get(1).copied().unwrap_or(ZERO_CODE))
        .collect()
}

/// Double quantization of an absmax vector (QLoRA's "DQ").
fn double_quantize(absmax: &[f32]) -> Nf4Scales {
    // bitsandbytes' `absmax.mean()`: torch's float32 mean, added in torch's CPU order.
    let offset = torch_cpu_mean(absmax);
    let centred: Vec<f32> = absmax.iter().map(|&a| a - offset).collect();
    let q = Blockwise8::quantize_blocks(&centred, &dynamic_map_signed(), DOUBLE_QUANT_BLOCK);
    let (qabsmax, absmax2) = (q.codes, q.absmax);
    Nf4Scales::Double {
        offset,
        qabsmax,
        absmax2,
    }
}

/// Index of the code nearest to `s` (exact comparison of float32 distances; a tie takes the
/// lower index, like `argmin`).
pub fn nearest_code(code: &[f32; 256], s: f32) -> u8 {
    let upper = code.partition_point(|&c| c < s).min(255); // first code ≥ s
    if upper == 0 {
        return 0;
    }
    let lower = upper - 1;
    if (s - code[lower]).abs() <= (code[upper] - s).abs() {
        lower as u8
    } else {
        upper as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codebook_midpoint_ties_take_the_lower_code() {
        let mids = midpoints();
        for (i, &m) in mids.iter().enumerate() {
            assert_eq!(nf4_code(m, &mids) as usize, i, "exactly on midpoint {i}");
            assert_eq!(
                nf4_code(m.next_up(), &mids) as usize,
                i + 1,
                "just above midpoint {i}"
            );
        }
    }

    #[test]
    fn odd_length_pads_the_low_nibble_with_the_code_of_zero() {
        // As bitsandbytes packs it (tests/fixtures/nf4/nk_nf4_bs256_dq_partial: 40,001 values).
        assert_eq!(NF4_CODEBOOK[ZERO_CODE as usize], 0.0);
        let x = [0.5f32, -1.0, 1.0];
        let q = Nf4Tensor::quantize(
            &x,
            &[3],
            &Nf4Config {
                block_size: 64,
                double_quant: false,
            },
        )
        .unwrap();
        assert_eq!(q.packed.len(), 2);
        assert_eq!(q.packed[1] & 0x0f, ZERO_CODE);
        assert_eq!(q.codes(), vec![q.codes()[0], 0, 15]);
        assert_eq!(
            q.dequantize(),
            vec![NF4_CODEBOOK[q.codes()[0] as usize], -1.0, 1.0]
        );
    }

    #[test]
    fn all_zero_block_dequantizes_to_zero() {
        let q = Nf4Tensor::quantize(&[0.0; 64], &[64], &Nf4Config::default()).unwrap();
        assert!(q.codes().iter().all(|&c| c == 7));
        assert!(q.dequantize().iter().all(|&v| v == 0.0));
    }

    #[test]
    fn non_finite_input_is_refused() {
        let err = Nf4Tensor::quantize(&[1.0, f32::NAN], &[2], &Nf4Config::default()).unwrap_err();
        assert!(err.to_string().contains("not finite"), "{err}");
    }

    #[test]
    fn storage_is_the_promised_bytes_per_weight() {
        let x: Vec<f32> = (0..64 * 256 * 4)
            .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        for dq in [false, true] {
            let config = Nf4Config {
                block_size: 64,
                double_quant: dq,
            };
            let q = Nf4Tensor::quantize(&x, &[x.len()], &config).unwrap();
            let per_weight = (q.bytes().total() - if dq { 4 } else { 0 }) as f64 / x.len() as f64;
            assert_eq!(per_weight, config.bytes_per_weight());
        }
    }
    /// A part of whole groups dequantizes to the whole tensor's rows, bit for bit, with and
    /// without double quantization; a part off the block or group edges is refused.
    #[test]
    fn whole_groups_of_rows_keep_the_tensors_blocks() {
        let (rows, cols) = (3 * 256, 64);
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * (1.0 + (i / 4096) as f32))
            .collect();
        for double_quant in [false, true] {
            let config = Nf4Config {
                block_size: 64,
                double_quant,
            };
            let whole = Nf4Tensor::quantize(&values, &[rows, cols], &config).unwrap();
            let all = whole.dequantize();
            for (start, n) in [(0, 256), (256, 512), (512, 256)] {
                let part = whole.rows(start, n).unwrap();
                assert_eq!(
                    part.dequantize(),
                    all[start * cols..(start + n) * cols],
                    "{start}"
                );
                assert_eq!(part.bytes().codes, (n * cols / 2) as u64);
            }
            let off_groups = whole.rows(128, 256);
            assert_eq!(off_groups.is_some(), !double_quant);
        }
        let odd = Nf4Tensor::quantize(
            &values[..10 * cols],
            &[10, cols],
            &Nf4Config {
                block_size: 128,
                double_quant: false,
            },
        )
        .unwrap();
        assert!(odd.rows(1, 2).is_none(), "half a block of 128");
    }
}
