//! NF4 rows for the block products: a QLoRA base (`quant::nf4`) kept as its 4-bit codes in
//! generation, its adapters beside it, instead of dequantized to f32.
//!
//! A row is units of 64 values, 36 bytes each: the unit's absmax (f32, little-endian, as
//! [`Nf4Tensor::absmax`] gives it, double quantization included), then two blocks of 32 values
//! in 16 bytes each, value `i` in byte `i`'s low nibble and value `i + 16` in its high one (the
//! GGUF 4-bit layout). NF4 blocks of any multiple of 64 weights store their absmax in each of
//! their units (4.5 bits a weight at the usual block of 64).
//!
//! The product of a block of 32 is an integer sum: the 16 code values as i16 at steps of 2⁻¹⁴
//! (`±1 → ±16384`; each at most 0.43 of a step from the f32 code, 2.6·10⁻⁵ of the block's
//! absmax, under 1/3000 of the smallest gap between two codes) times the activations' 16- or
//! 8-bit integers — exact in each SIMD lane's i32 (a lane sums four products: `4·16384·32639 <
//! 2³¹`), the lanes converted to f32 — then scaled by `absmax·d_x·2⁻¹⁴`. The codes are looked
//! up in registers: AVX-512's `vpermw` (the 16 values twice in a 512-bit vector, a unit at a
//! time), or AVX2's `vpshufb` on the codes' low and high bytes.
//!
//! # Shapes
//! - a row: `cols / 64` units; `cols` a multiple of 64.

use super::activations::{ActivationBits, QuantizedActivations};
use super::{BLOCK, BlockFormat, QuantizedMatrix, RowKernel};
use crate::quant::nf4::{NF4_CODEBOOK, Nf4Tensor};

/// Values per unit.
pub const UNIT: usize = 64;

/// Bytes per unit: the absmax and 32 bytes of codes.
pub const UNIT_BYTES: usize = 4 + UNIT / 2;

/// The integer code value of 1.0.
const CODE_ONE: f32 = 16384.0;

/// The 16 NF4 code values as integers at steps of `1 / CODE_ONE`.
fn code_table() -> [i16; 16] {
    std::array::from_fn(|c| (NF4_CODEBOOK[c] * CODE_ONE).round() as i16)
}

impl QuantizedMatrix {
    /// An NF4 matrix `[rows, cols]` from a quantized tensor of that shape (the codes and the
    /// f32 absmax of each block, no float weight); the message says why a tensor does not fit
    /// (rows whose length, or blocks whose size, is not a multiple of 64).
    pub fn from_nf4(weight: &Nf4Tensor) -> Result<Self, String> {
        let &[rows, cols] = weight.shape.as_slice() else {
            return Err(format!("NF4 shape {:?} is not a matrix", weight.shape));
        };
        let block = weight.block_size;
        if !cols.is_multiple_of(UNIT) || !block.is_multiple_of(UNIT) {
            return Err(format!(
                "NF4 blocks of {block} on rows of {cols}: the NF4 products need both multiples \
                 of {UNIT}"
            ));
        }
        let absmax = weight.absmax();
        let code = |i: usize| {
            let byte = weight.packed[i / 2];
            if i.is_multiple_of(2) {
                byte >> 4
            } else {
                byte & 0x0f
            }
        };
        let units = rows * cols / UNIT;
        let mut bytes = Vec::with_capacity(units * UNIT_BYTES);
        for u in 0..units {
            let first = u * UNIT;
            bytes.extend(absmax[first / block].to_le_bytes());
            for half in 0..UNIT / BLOCK {
                let at = first + half * BLOCK;
                bytes
                    .extend((0..BLOCK / 2).map(|i| code(at + i) | (code(at + i + BLOCK / 2) << 4)));
            }
        }
        QuantizedMatrix::new(BlockFormat::Nf4, rows, cols, bytes)
    }
}

fn absmax(unit: &[u8]) -> f32 {
    f32::from_le_bytes([unit[0], unit[1], unit[2], unit[3]])
}

/// Block `half` of a unit (0 or 1): its 16 bytes of codes.
fn codes(unit: &[u8], half: usize) -> &[u8] {
    &unit[4 + half * BLOCK / 2..4 + (half + 1) * BLOCK / 2]
}

/// One row as f32 values: `code · absmax`, as [`Nf4Tensor::dequantize`] computes them.
pub(super) fn dequantize_row(row: &[u8], out: &mut [f32]) {
    for (unit, out) in row.chunks_exact(UNIT_BYTES).zip(out.chunks_exact_mut(UNIT)) {
        let a = absmax(unit);
        for (half, out) in out.chunks_exact_mut(BLOCK).enumerate() {
            let (low, high) = out.split_at_mut(BLOCK / 2);
            for ((&byte, l), h) in codes(unit, half).iter().zip(low).zip(high) {
                *l = NF4_CODEBOOK[(byte & 0x0f) as usize] * a;
                *h = NF4_CODEBOOK[(byte >> 4) as usize] * a;
            }
        }
    }
}

/// Token `t`'s block `k` as integers, 16- or 8-bit.
fn integers(x: &QuantizedActivations, t: usize, k: usize) -> [i16; BLOCK] {
    match x.bits() {
        ActivationBits::Sixteen => x.wide_blocks(t)[k].qs,
        ActivationBits::Eight => x.blocks(t)[k].qs.map(i16::from),
    }
}

/// `row · x[t]`, the portable kernel: per block of 32 the exact integer sum (in i64: 32
/// products can pass 2³¹), scaled by `absmax·d_x / CODE_ONE`, added in block order.
pub(super) fn dot(row: &[u8], x: &QuantizedActivations, t: usize) -> f32 {
    let table = code_table();
    let scales = x.scales(t);
    let mut total = 0.0f32;
    for (u, unit) in row.chunks_exact(UNIT_BYTES).enumerate() {
        let a = absmax(unit);
        for half in 0..UNIT / BLOCK {
            let k = u * (UNIT / BLOCK) + half;
            let q = integers(x, t, k);
            let sum: i64 = codes(unit, half)
                .iter()
                .enumerate()
                .map(|(i, &byte)| {
                    i64::from(table[(byte & 0x0f) as usize]) * i64::from(q[i])
                        + i64::from(table[(byte >> 4) as usize]) * i64::from(q[i + BLOCK / 2])
                })
                .sum();
            total += (a * scales[k] / CODE_ONE) * sum as f32;
        }
    }
    total
}

/// `out[r·T + t] = W[r] · x[t]` for a run of NF4 rows, with the kernel this CPU runs.
pub(super) fn rows(kernel: RowKernel, rows: &[u8], x: &QuantizedActivations, out: &mut [f32]) {
    match kernel {
        // SAFETY: the CPU has the features each kernel is compiled for (checked here and in
        // `RowKernel::for_this_cpu`).
        #[cfg(target_arch = "x86_64")]
        RowKernel::Vnni if x86::has_avx512bw() => unsafe { x86::rows_avx512(rows, x, out) },
        #[cfg(target_arch = "x86_64")]
        RowKernel::Vnni | RowKernel::Avx2 => unsafe { x86::rows_avx2(rows, x, out) },
        RowKernel::Scalar => {
            let row_bytes = BlockFormat::Nf4.row_bytes(x.cols());
            for (row, out) in rows
                .chunks_exact(row_bytes)
                .zip(out.chunks_exact_mut(x.tokens()))
            {
                for (t, o) in out.iter_mut().enumerate() {
                    *o = dot(row, x, t);
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! Both kernels take a row's units once for up to four tokens (a tile), each token's sums in
    //! f32 vectors of its own, so that a token gets the same bits alone or in a prompt.

    use std::arch::x86_64::*;

    use super::*;

    /// Tokens a row's codes are looked up for at once.
    const TILE: usize = 4;

    /// AVX-512 BW (`vpermw` on 16-bit lanes; it implies F) with VL and VNNI (`vpdpwssd`).
    pub(super) fn has_avx512bw() -> bool {
        super::super::x86::has_vnni() && is_x86_feature_detected!("avx512bw")
    }

    /// 16 i16 from `values` (at least 16).
    #[target_feature(enable = "avx2")]
    fn load16(values: &[i16]) -> __m256i {
        assert!(values.len() >= 16);
        // SAFETY: 16 readable i16 (checked above); unaligned load.
        unsafe { _mm256_loadu_si256(values.as_ptr().cast()) }
    }

    /// 16 bytes (at least 16).
    #[target_feature(enable = "avx2")]
    fn load_bytes(bytes: &[u8]) -> __m128i {
        assert!(bytes.len() >= 16);
        // SAFETY: 16 readable bytes (checked above); unaligned load.
        unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) }
    }

    #[target_feature(enable = "avx2")]
    fn horizontal_sum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
    }

    /// Every token's blocks as i16, each unit's two blocks in the order `arrange` puts them (the
    /// order the kernel's weights come out of its lookup): `[T, cols / 32]` blocks of 32.
    fn arranged(
        x: &QuantizedActivations,
        arrange: impl Fn([i16; BLOCK], [i16; BLOCK]) -> [[i16; BLOCK]; 2],
    ) -> Vec<[i16; BLOCK]> {
        let units = x.cols() / UNIT;
        (0..x.tokens())
            .flat_map(|t| (0..units).map(move |u| (t, u)))
            .flat_map(|(t, u)| arrange(integers(x, t, 2 * u), integers(x, t, 2 * u + 1)))
            .collect()
    }

    /// What a kernel needs of one tile: for each of its `N` tokens, the arranged blocks and
    /// their scales.
    struct Tile<'a, const N: usize> {
        blocks: [&'a [[i16; BLOCK]]; N],
        scales: [&'a [f32]; N],
    }

    impl<'a, const N: usize> Tile<'a, N> {
        /// Each token's blocks and scales.
        fn each(&self) -> impl Iterator<Item = (&'a [[i16; BLOCK]], &'a [f32])> + '_ {
            self.blocks.iter().copied().zip(self.scales.iter().copied())
        }
    }

    /// Runs `tile` over every row and tile of tokens; `tile` fills a tile's outputs.
    fn each_tile(
        rows: &[u8],
        x: &QuantizedActivations,
        arranged: &[[i16; BLOCK]],
        out: &mut [f32],
        mut tile: impl FnMut(&[u8], usize, &mut [f32]),
    ) {
        let (tokens, blocks) = (x.tokens(), x.cols() / BLOCK);
        debug_assert_eq!(arranged.len(), tokens * blocks);
        let row_bytes = BlockFormat::Nf4.row_bytes(x.cols());
        for (row, out) in rows
            .chunks_exact(row_bytes)
            .zip(out.chunks_exact_mut(tokens))
        {
            for (i, out) in out.chunks_mut(TILE).enumerate() {
                tile(row, i * TILE, out);
            }
        }
    }

    fn tile_of<'a, const N: usize>(
        x: &'a QuantizedActivations,
        arranged: &'a [[i16; BLOCK]],
        first: usize,
    ) -> Tile<'a, N> {
        let blocks = x.cols() / BLOCK;
        Tile {
            blocks: std::array::from_fn(|j| {
                &arranged[(first + j) * blocks..(first + j + 1) * blocks]
            }),
            scales: std::array::from_fn(|j| x.scales(first + j)),
        }
    }

    /// Calls `$kernel::<N>` for a tile of `$n` tokens (1 to 4).
    macro_rules! by_size {
        ($kernel:ident, $n:expr, $row:expr, $x:expr, $arranged:expr, $first:expr, $table:expr, $out:expr) => {
            match $n {
                1 => $kernel::<1>($row, &tile_of::<1>($x, $arranged, $first), $table, $out),
                2 => $kernel::<2>($row, &tile_of::<2>($x, $arranged, $first), $table, $out),
                3 => $kernel::<3>($row, &tile_of::<3>($x, $arranged, $first), $table, $out),
                _ => $kernel::<4>($row, &tile_of::<4>($x, $arranged, $first), $table, $out),
            }
        };
    }

    /// The AVX-512 kernel, a unit (64 values) at a time in 512-bit vectors: the table twice in
    /// one vector (32 entries; `vpermw` reads five bits of each index), the unit's 32 code
    /// bytes widened to i16 give its two blocks' values `0..16` (low nibbles) and `16..32`
    /// (shifted by four), side by side; the activations are arranged once to match
    /// (`b0[0..16], b1[0..16]`, then `b0[16..32], b1[16..32]`), and the two blocks' sums sit in
    /// lanes `0..8` and `8..16`, scaled by their own `d_x`.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F, BW, VL and VNNI ([`has_avx512bw`]).
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn rows_avx512(rows: &[u8], x: &QuantizedActivations, out: &mut [f32]) {
        let arranged = arranged(x, |b0, b1| {
            let half = BLOCK / 2;
            [
                std::array::from_fn(|i| if i < half { b0[i] } else { b1[i - half] }),
                std::array::from_fn(|i| if i < half { b0[half + i] } else { b1[i] }),
            ]
        });
        let codes = code_table();
        let twice: [i16; 32] = std::array::from_fn(|i| codes[i % 16]);
        // SAFETY: 32 readable i16; unaligned load.
        let table = unsafe { _mm512_loadu_si512(twice.as_ptr().cast()) };
        each_tile(rows, x, &arranged, out, |row, first, out| {
            by_size!(tile_avx512, out.len(), row, x, &arranged, first, table, out)
        });
    }

    #[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")]
    fn tile_avx512<const N: usize>(row: &[u8], tile: &Tile<N>, table: __m512i, out: &mut [f32]) {
        let units = row.len() / UNIT_BYTES;
        for (blocks, scales) in tile.each() {
            assert!(blocks.len() >= 2 * units && scales.len() >= 2 * units);
        }
        // Lanes 0..8 take the first scale of a pair, lanes 8..16 the second.
        let pairs = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
        let mut acc = [_mm512_setzero_ps(); N];
        for (u, unit) in row.chunks_exact(UNIT_BYTES).enumerate() {
            let a = _mm512_set1_ps(absmax(unit) / CODE_ONE);
            let codes = &unit[4..UNIT_BYTES];
            assert_eq!(codes.len(), 32);
            // SAFETY: 32 readable bytes (checked above); unaligned load.
            let bytes = _mm512_cvtepu8_epi16(unsafe { _mm256_loadu_si256(codes.as_ptr().cast()) });
            let low = _mm512_permutexvar_epi16(bytes, table); // each block's values 0..16
            let high = _mm512_permutexvar_epi16(_mm512_srli_epi16(bytes, 4), table);
            for (sums, (blocks, scales)) in acc.iter_mut().zip(tile.each()) {
                // SAFETY: blocks 2u and 2u + 1 and scales 2u and 2u + 1 exist (checked above:
                // u < units); unaligned loads of 32 i16 each and of two f32.
                let (first, second, d) = unsafe {
                    (
                        _mm512_loadu_si512(blocks.as_ptr().add(2 * u).cast()),
                        _mm512_loadu_si512(blocks.as_ptr().add(2 * u + 1).cast()),
                        _mm_castpd_ps(_mm_load_sd(scales.as_ptr().add(2 * u).cast())),
                    )
                };
                let sum = _mm512_dpwssd_epi32(_mm512_madd_epi16(low, first), high, second);
                let d = _mm512_permutexvar_ps(pairs, _mm512_castps128_ps512(d));
                *sums = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(d, a), *sums);
            }
        }
        for (o, sums) in out.iter_mut().zip(acc) {
            *o = _mm512_reduce_add_ps(sums);
        }
    }

    /// The AVX2 kernel: `vpshufb` looks up the codes' low and high bytes (the table in each
    /// 128-bit lane), and interleaving them gives i16 values `0..8, 16..24` in one vector and
    /// `8..16, 24..32` in the other; the activations are arranged once in that order.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn rows_avx2(rows: &[u8], x: &QuantizedActivations, out: &mut [f32]) {
        // Quarters 0, 1, 2, 3 of an arranged block are its values 0..8, 16..24, 8..16, 24..32.
        let quarters = |q: [i16; BLOCK]| -> [i16; BLOCK] {
            std::array::from_fn(|i| q[[0, 16, 8, 24][i / 8] + i % 8])
        };
        let arranged = arranged(x, |b0, b1| [quarters(b0), quarters(b1)]);
        let table = code_table();
        let low: [u8; 16] = table.map(|c| c.to_le_bytes()[0]);
        let high: [u8; 16] = table.map(|c| c.to_le_bytes()[1]);
        let tables = _mm256_set_m128i(load_bytes(&high), load_bytes(&low));
        each_tile(rows, x, &arranged, out, |row, first, out| {
            by_size!(tile_avx2, out.len(), row, x, &arranged, first, tables, out)
        });
    }

    /// `tables`: the codes' low bytes in the low 128-bit lane, their high bytes in the high one.
    #[target_feature(enable = "avx2,fma")]
    fn tile_avx2<const N: usize>(row: &[u8], tile: &Tile<N>, tables: __m256i, out: &mut [f32]) {
        let low_bytes = _mm256_permute2x128_si256(tables, tables, 0x00);
        let high_bytes = _mm256_permute2x128_si256(tables, tables, 0x11);
        let nibble = _mm256_set1_epi8(0x0f);
        // One accumulator per token and half of a unit: two chains of FMAs, not one.
        let mut acc = [[_mm256_setzero_ps(); 2]; N];
        for (u, unit) in row.chunks_exact(UNIT_BYTES).enumerate() {
            let a = absmax(unit) / CODE_ONE;
            for half in 0..UNIT / BLOCK {
                let k = u * (UNIT / BLOCK) + half;
                let q = load_bytes(codes(unit, half));
                // Values 0..16 in the low lane, 16..32 in the high one.
                let codes = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), nibble);
                let (lo, hi) = (
                    _mm256_shuffle_epi8(low_bytes, codes),
                    _mm256_shuffle_epi8(high_bytes, codes),
                );
                let first = _mm256_unpacklo_epi8(lo, hi); // values 0..8, 16..24
                let second = _mm256_unpackhi_epi8(lo, hi); // values 8..16, 24..32
                for (sums, (blocks, scales)) in acc.iter_mut().zip(tile.each()) {
                    let q = &blocks[k];
                    let sum = _mm256_add_epi32(
                        _mm256_madd_epi16(first, load16(&q[..16])),
                        _mm256_madd_epi16(second, load16(&q[16..])),
                    );
                    let scale = _mm256_set1_ps(a * scales[k]);
                    sums[half] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), scale, sums[half]);
                }
            }
        }
        for (o, [first, second]) in out.iter_mut().zip(acc) {
            *o = horizontal_sum(_mm256_add_ps(first, second));
        }
    }
}
