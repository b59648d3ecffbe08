//! Activations quantized per block of 32 for the integer block products: to 8 bits (llama.cpp's
//! way: the fastest, but one outlier in a block coarsens the other 31 values to its 1/127 steps)
//! or to 16 bits (steps of 1/32639 of the block's largest: the products' results are within
//! ~1e-4 of f32 ones, at ~2× the integer work).
//!
//! 16-bit values are also kept split into two bytes, `q = 256·high + low` with both signed
//! ([`SplitBlock`]): a byte product of each half then gives the 16-bit product exactly, with the
//! weights' own bytes, not widened (the K-quant kernels). The largest 16-bit value is therefore
//! `127·256 + 127 = 32639`, not 32767.

use super::BLOCK;

/// Each token's blocks are a multiple of this many (zero blocks at the end).
pub const PADDING: usize = 8;

const ZERO: Q8Block = Q8Block {
    qs: [0; BLOCK],
    d: 0.0,
    sum: 0,
    d_sum: 0.0,
};

/// 32 activations as `x ≈ d·q`: `d = max|x| / 127`, `q = round(x / d)` (ties away from zero, as
/// llama.cpp's `quantize_row_q8_1`), and `sum = Σ q` (exact, for the formats with an offset;
/// `d_sum = d·sum` saves the SIMD kernels a conversion per block).
#[derive(Debug, Clone, Copy)]
#[repr(C, align(8))]
pub struct Q8Block {
    /// The 32 quantized values.
    pub qs: [i8; BLOCK],
    /// The scale.
    pub d: f32,
    /// `Σ qs`.
    pub sum: i32,
    /// `d · Σ qs`.
    pub d_sum: f32,
}

/// The precision of quantized activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ActivationBits {
    /// i8 per value, as llama.cpp.
    Eight,
    /// i16 per value.
    #[default]
    Sixteen,
}

/// The largest 16-bit value: the largest whose two halves are both signed bytes.
pub const WIDE_MAX: i16 = 127 * 256 + 127;

/// 32 activations as `x ≈ d·q` with 16-bit `q`: `d = max|x| / 32639`.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(32))]
pub struct Q16Block {
    /// The 32 quantized values.
    pub qs: [i16; BLOCK],
}

/// A [`Q16Block`]'s values split into bytes: `q = 256·high + low`, `high = ⌊(q + 128) / 256⌋`,
/// both in `−128..=127` (as `|q| ≤ 32639`).
#[derive(Debug, Clone, Copy)]
#[repr(C, align(32))]
pub struct SplitBlock {
    /// `q − 256·high`.
    pub low: [i8; BLOCK],
    /// `⌊(q + 128) / 256⌋`.
    pub high: [i8; BLOCK],
}

impl SplitBlock {
    fn of(block: &Q16Block) -> Self {
        let mut split = SplitBlock {
            low: [0; BLOCK],
            high: [0; BLOCK],
        };
        for (i, &q) in block.qs.iter().enumerate() {
            let high = (q as i32 + 128) >> 8;
            split.high[i] = high as i8;
            split.low[i] = (q as i32 - 256 * high) as i8;
        }
        split
    }
}

/// A block's two half sums of one byte plane (`|Σ| ≤ 16·128`).
pub type HalfSums = [i16; 2];

/// The half sums of 8-bit values, summed from the values as i32 (summing the bytes after they
/// were stored read them back one by one, each load waiting on the vector store before it).
fn half_sums(qs: &[i32; BLOCK]) -> HalfSums {
    let sum = |half: &[i32]| half.iter().sum::<i32>() as i16;
    [sum(&qs[..BLOCK / 2]), sum(&qs[BLOCK / 2..])]
}

/// The half sums of both byte planes of 16-bit values ([`SplitBlock::of`]'s `low`, `high`),
/// from the values: `Σ high = Σ ⌊(q + 128)/256⌋`, `Σ low = Σ q − 256·Σ high`.
fn split_half_sums(qs: &[i32; BLOCK]) -> [HalfSums; 2] {
    let mut sums = [[0; 2]; 2];
    for (half, values) in qs.chunks_exact(BLOCK / 2).enumerate() {
        let high: i32 = values.iter().map(|&q| (q + 128) >> 8).sum();
        let all: i32 = values.iter().sum();
        sums[0][half] = (all - 256 * high) as i16;
        sums[1][half] = high as i16;
    }
    sums
}

/// Tokens side by side in [`TokenGroups`].
pub const TOKEN_GROUP: usize = 8;

/// The activations of a prompt in groups of eight tokens, each block's values side by side four
/// at a time: vector `j` of (group, block) holds values `4j..4j + 4` of each of the group's
/// eight tokens (`[token][4]` bytes). A byte product of this vector with four weights repeated
/// eight times gives the eight tokens' partial sums in the eight lanes of one vector, so that a
/// block's sum needs no horizontal additions (the products of a prompt with many tokens).
/// Tokens past the last are zero (scales 0).
#[derive(Debug, Clone, Default)]
pub struct TokenGroups {
    /// Padded blocks per token.
    blocks: usize,
    /// Byte planes: one with 8 bits, `low` and `high` with 16 ([`SplitBlock`]).
    planes: usize,
    /// `[groups, blocks, planes]` of eight vectors of 32 bytes.
    values: Vec<[[i8; BLOCK]; BLOCK / 4]>,
    /// `[groups, blocks]`: the eight tokens' `d`.
    scales: Vec<[f32; TOKEN_GROUP]>,
    /// `[groups, blocks]`: the eight tokens' `d·Σq`.
    d_sums: Vec<[f32; TOKEN_GROUP]>,
    /// `[groups, blocks, planes]`: the eight tokens' sums of each half of the plane's bytes
    /// (Q6_K's offset).
    half_sums: Vec<[[i32; TOKEN_GROUP]; 2]>,
}

impl TokenGroups {
    fn of(x: &QuantizedActivations) -> Self {
        let blocks = padded_blocks(x.cols);
        let eight = x.bits == ActivationBits::Eight;
        let planes = if eight { 1 } else { 2 };
        let groups = x.tokens.div_ceil(TOKEN_GROUP);
        let mut out = TokenGroups {
            blocks,
            planes,
            values: vec![[[0; BLOCK]; BLOCK / 4]; groups * blocks * planes],
            scales: vec![[0.0; TOKEN_GROUP]; groups * blocks],
            d_sums: vec![[0.0; TOKEN_GROUP]; groups * blocks],
            half_sums: vec![[[0; TOKEN_GROUP]; 2]; groups * blocks * planes],
        };
        for t in 0..x.tokens {
            let (g, lane) = (t / TOKEN_GROUP, t % TOKEN_GROUP);
            for b in 0..blocks {
                let at = g * blocks + b;
                out.scales[at][lane] = x.scales(t)[b];
                out.d_sums[at][lane] = x.d_sums(t)[b];
                let bytes: [[i8; BLOCK]; 2] = if eight {
                    [x.blocks(t)[b].qs, [0; BLOCK]]
                } else {
                    let split = x.split_blocks(t)[b];
                    [split.low, split.high]
                };
                for (p, plane) in bytes.iter().take(planes).enumerate() {
                    // The token's own half sums, side by side.
                    for (half, &sum) in x.half_sums(t, p)[b].iter().enumerate() {
                        out.half_sums[at * planes + p][half][lane] = i32::from(sum);
                    }
                    let vectors = &mut out.values[at * planes + p];
                    for (j, four) in plane.chunks_exact(4).enumerate() {
                        vectors[j][4 * lane..4 * lane + 4].copy_from_slice(four);
                    }
                }
            }
        }
        out
    }

    /// Groups of eight tokens.
    pub fn groups(&self) -> usize {
        self.scales.len() / self.blocks.max(1)
    }

    /// Byte planes per block: 1 (8 bits) or 2 (`low`, `high`).
    pub fn planes(&self) -> usize {
        self.planes
    }

    /// Group `g`, block `b`, plane `p`: eight vectors of 32 bytes.
    pub fn values(&self, g: usize, b: usize, p: usize) -> &[[i8; BLOCK]; BLOCK / 4] {
        &self.values[(g * self.blocks + b) * self.planes + p]
    }

    /// Group `g`, block `b`: the eight tokens' `d`.
    pub fn scales(&self, g: usize, b: usize) -> &[f32; TOKEN_GROUP] {
        &self.scales[g * self.blocks + b]
    }

    /// Group `g`, block `b`: the eight tokens' `d·Σq`.
    pub fn d_sums(&self, g: usize, b: usize) -> &[f32; TOKEN_GROUP] {
        &self.d_sums[g * self.blocks + b]
    }

    /// Group `g`, block `b`, plane `p`: the eight tokens' sums of the plane's bytes over
    /// values `0..16` and `16..32`.
    pub fn half_sums(&self, g: usize, b: usize, p: usize) -> &[[i32; TOKEN_GROUP]; 2] {
        &self.half_sums[(g * self.blocks + b) * self.planes + p]
    }
}

/// T rows of `cols` activations, as f32 and (when `cols` is a multiple of 32) as [`Q8Block`]s or
/// [`Q16Block`]s.
/// Each token's blocks are padded with zero blocks to a multiple of [`PADDING`], so that the SIMD
/// kernels take every block in groups (a zero block adds nothing to a product).
#[derive(Debug, Clone, Default)]
pub struct QuantizedActivations {
    tokens: usize,
    cols: usize,
    bits: ActivationBits,
    values: Vec<f32>,
    /// With 8 bits, `[T, padded blocks]`; else empty.
    blocks: Vec<Q8Block>,
    /// With 16 bits, `[T, padded blocks]`; else empty.
    wide_blocks: Vec<Q16Block>,
    /// `wide_blocks` split into bytes.
    split_blocks: Vec<SplitBlock>,
    /// Each block's `d`, `[T, cols / 32]` (contiguous, for vector loads).
    scales: Vec<f32>,
    /// Each block's `d·Σq`, `[T, cols / 32]`.
    d_sums: Vec<f32>,
    /// Each block's sums of its byte plane's values `0..16` and `16..32` (`qs` with 8 bits,
    /// the split blocks' `low` and `high` with 16): `[planes, T, padded blocks]`. Q6_K's offset
    /// (`−32·Σ s·x` per half block) from these, not from a byte product per block.
    half_sums: [Vec<HalfSums>; 2],
    /// From [`TOKEN_GROUP`] tokens on: the same blocks with eight tokens side by side.
    groups: Option<TokenGroups>,
}

impl QuantizedActivations {
    /// Quantizes `x` to 8 bits per value.
    ///
    /// # Shapes
    /// - `x`: `[T, cols]`
    ///
    /// # Panics
    /// If `x.len()` is not a multiple of `cols` (a bug in the caller).
    pub fn new(x: &[f32], cols: usize) -> Self {
        Self::with_bits(x, cols, ActivationBits::Eight)
    }

    /// Quantizes `x` to `bits` per value.
    ///
    /// # Panics
    /// If `x.len()` is not a multiple of `cols` (a bug in the caller).
    pub fn with_bits(x: &[f32], cols: usize, bits: ActivationBits) -> Self {
        assert!(
            cols > 0 && x.len().is_multiple_of(cols),
            "{} values in rows of {cols}",
            x.len()
        );
        let mut out = QuantizedActivations {
            tokens: x.len() / cols,
            cols,
            bits,
            values: x.to_vec(),
            ..Default::default()
        };
        if !cols.is_multiple_of(BLOCK) {
            return out;
        }
        let padding = padded_blocks(cols) - cols / BLOCK;
        let n = out.tokens * padded_blocks(cols);
        match bits {
            ActivationBits::Eight => {
                out.blocks.reserve_exact(n);
                out.half_sums[0].reserve_exact(n);
            }
            ActivationBits::Sixteen => {
                out.wide_blocks.reserve_exact(n);
                out.split_blocks.reserve_exact(n);
                out.half_sums[0].reserve_exact(n);
                out.half_sums[1].reserve_exact(n);
            }
        }
        out.scales.reserve_exact(n);
        out.d_sums.reserve_exact(n);
        let (eight, wide) = quantizers();
        for row in x.chunks_exact(cols) {
            for block in row.chunks_exact(BLOCK) {
                let (d, sum) = match bits {
                    ActivationBits::Eight => {
                        let (b, halves) = eight(block);
                        out.blocks.push(b);
                        out.half_sums[0].push(halves);
                        (b.d, b.sum)
                    }
                    ActivationBits::Sixteen => {
                        let (b, split, d, sum, [low, high]) = wide(block);
                        out.split_blocks.push(split);
                        out.wide_blocks.push(b);
                        out.half_sums[0].push(low);
                        out.half_sums[1].push(high);
                        (d, sum)
                    }
                };
                out.scales.push(d);
                out.d_sums.push(d * sum as f32);
            }
            for _ in 0..padding {
                match bits {
                    ActivationBits::Eight => {
                        out.blocks.push(ZERO);
                        out.half_sums[0].push([0; 2]);
                    }
                    ActivationBits::Sixteen => {
                        out.half_sums[0].push([0; 2]);
                        out.half_sums[1].push([0; 2]);
                        out.wide_blocks.push(Q16Block { qs: [0; BLOCK] });
                        out.split_blocks
                            .push(SplitBlock::of(&Q16Block { qs: [0; BLOCK] }));
                    }
                }
                out.scales.push(0.0);
                out.d_sums.push(0.0);
            }
        }
        if out.tokens >= TOKEN_GROUP {
            out.groups = Some(TokenGroups::of(&out));
        }
        out
    }

    /// The blocks with eight tokens side by side (with [`TOKEN_GROUP`] tokens or more).
    pub fn token_groups(&self) -> Option<&TokenGroups> {
        self.groups.as_ref()
    }

    /// The precision of the blocks.
    pub fn bits(&self) -> ActivationBits {
        self.bits
    }

    /// Token `t`'s 16-bit blocks, zero blocks at the end included (empty with 8 bits).
    pub fn wide_blocks(&self, t: usize) -> &[Q16Block] {
        let n = padded_blocks(self.cols);
        self.wide_blocks.get(t * n..(t + 1) * n).unwrap_or(&[])
    }

    /// Token `t`'s 16-bit blocks split into bytes (empty with 8 bits).
    pub fn split_blocks(&self, t: usize) -> &[SplitBlock] {
        let n = padded_blocks(self.cols);
        self.split_blocks.get(t * n..(t + 1) * n).unwrap_or(&[])
    }

    /// T.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Values per token.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Token `t`'s f32 values.
    pub fn values(&self, t: usize) -> &[f32] {
        &self.values[t * self.cols..(t + 1) * self.cols]
    }

    /// Token `t`'s 8-bit blocks, zero blocks at the end included (empty when `cols` is not a
    /// multiple of 32, or with 16 bits).
    pub fn blocks(&self, t: usize) -> &[Q8Block] {
        let n = padded_blocks(self.cols);
        self.blocks.get(t * n..(t + 1) * n).unwrap_or(&[])
    }

    /// Token `t`'s block scales `d`.
    pub fn scales(&self, t: usize) -> &[f32] {
        let n = padded_blocks(self.cols);
        self.scales.get(t * n..(t + 1) * n).unwrap_or(&[])
    }

    /// Token `t`'s `d·Σq` per block.
    pub fn d_sums(&self, t: usize) -> &[f32] {
        let n = padded_blocks(self.cols);
        self.d_sums.get(t * n..(t + 1) * n).unwrap_or(&[])
    }

    /// Token `t`'s half sums of byte plane `plane` per block (0: the 8-bit values or the
    /// 16-bit ones' `low` bytes; 1: their `high` bytes), zero blocks at the end included.
    pub fn half_sums(&self, t: usize, plane: usize) -> &[HalfSums] {
        let n = padded_blocks(self.cols);
        self.half_sums[plane].get(t * n..(t + 1) * n).unwrap_or(&[])
    }
}

/// A block of 32 values at 8 bits: the block and its half sums.
type EightBits = fn(&[f32]) -> (Q8Block, HalfSums);

/// A block of 32 values at 16 bits: the values, their byte planes, `d`, `Σq` and the planes'
/// half sums.
type SixteenBits = fn(&[f32]) -> (Q16Block, SplitBlock, f32, i32, [HalfSums; 2]);

/// The 8- and 16-bit block quantizers: AVX2's where the CPU has it (`activations_x86.rs`, the
/// same bits), else the portable ones.
fn quantizers() -> (EightBits, SixteenBits) {
    #[cfg(target_arch = "x86_64")]
    if super::x86::has_avx2() {
        // SAFETY: the CPU has AVX2 (checked above).
        return (
            |x| unsafe { super::activations_x86::quantize_block(x) },
            |x| unsafe { super::activations_x86::quantize_wide(x) },
        );
    }
    (quantize_block, quantize_wide)
}

/// Blocks per token, padding included.
pub fn padded_blocks(cols: usize) -> usize {
    (cols / BLOCK).div_ceil(PADDING) * PADDING
}

/// A block's rounded values `q = round(x / d)` with `d = max|x| / max` (a NaN value is passed
/// over by the maximum and quantized to 0; the quotients are clamped to `±max` before rounding,
/// so an infinite one gives `±max`), and `d`.
fn rounded_values(x: &[f32], max: f32) -> ([i32; BLOCK], f32) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / max;
    let inverse = if d > 0.0 { 1.0 / d } else { 0.0 };
    let mut values = [0i32; BLOCK];
    for (q, &v) in values.iter_mut().zip(x) {
        *q = rounded((v * inverse).clamp(-max, max));
    }
    (values, d)
}

/// A block at 16 bits: the values, their byte planes, `d`, `Σq` and the half sums of the two
/// planes.
pub(super) fn quantize_wide(x: &[f32]) -> (Q16Block, SplitBlock, f32, i32, [HalfSums; 2]) {
    let (values, d) = rounded_values(x, WIDE_MAX as f32);
    let block = Q16Block {
        qs: values.map(|q| q as i16),
    };
    (
        block,
        SplitBlock::of(&block),
        d,
        values.iter().sum(),
        split_half_sums(&values),
    )
}

/// `y.round()` (ties away from zero) as an integer, for `|y|` below 2²³ (a block's values are at
/// most its largest step count): truncation, then one step where the dropped fraction is at
/// least a half (exact: a float minus its integer part is). Inline conversions and compares,
/// where `round` is a libm call per value on a baseline x86-64 build (the saturating cast still
/// checks each value on its own: `perf` showed it scalar); NaN gives 0 as `round` then the cast
/// did.
pub(super) fn rounded(y: f32) -> i32 {
    let truncated = y as i32;
    let fraction = y - truncated as f32;
    truncated + i32::from(fraction >= 0.5) - i32::from(fraction <= -0.5)
}

/// A block at 8 bits and its half sums.
pub(super) fn quantize_block(x: &[f32]) -> (Q8Block, HalfSums) {
    let (values, d) = rounded_values(x, 127.0);
    let sum = values.iter().sum();
    let block = Q8Block {
        qs: values.map(|q| q as i8),
        d,
        sum,
        d_sum: d * sum as f32,
    };
    (block, half_sums(&values))
}
