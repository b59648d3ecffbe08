//! The block products on x86-64: AVX2 (`vpmaddubsw` + `vpmaddwd`), and AVX-512 VNNI's
//! `vpdpbusd` (32 byte products summed into eight i32 in one instruction) where the CPU has it.
//! The same source is compiled twice, once per instruction set, by the `kernels!` macro below.
//!
//! Each kernel walks one row of `W` block by block, unpacks the block once and multiplies it
//! with a tile of tokens' activation blocks (4 with AVX2, 8 with AVX-512: a prompt reads each
//! weight block once per tile); even and odd blocks accumulate in separate chains, so that a
//! single token (decoding) is not bound by the FMA's latency. Both byte products take an unsigned first operand: 4-bit values are 0..15; an
//! 8-bit weight row is passed as `|w|`, its signs moved onto the activations
//! (`sign(x, w)`), as llama.cpp does. `vpmaddubsw` saturates at ±32767: `2·128·127` fits.

use std::arch::x86_64::*;

use super::activations::{Q8Activations, Q8Block};
use super::{BLOCK, BlockFormat, scalar};

/// AVX2 with FMA and F16C (every x86-64 CPU since 2013–2015).
pub(super) fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// AVX-512 VNNI on 256-bit vectors (Ice Lake, Zen 4 and later).
pub(super) fn has_vnni() -> bool {
    has_avx2() && is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl")
}

macro_rules! kernels {
    ($isa:ident, $features:literal, tile $tile:literal, |$w:ident, $x:ident| $dot:expr) => {
        pub(super) mod $isa {
            use super::*;

            /// Tokens multiplied with one unpacked weight block (accumulators: two per token).
            const TILE: usize = $tile;

            /// `Σ w·x` of 32 unsigned bytes and 32 signed bytes, as eight i32 partial sums.
            #[target_feature(enable = $features)]
            #[inline]
            fn dot_u8_i8($w: __m256i, $x: __m256i) -> __m256i {
                $dot
            }

            #[target_feature(enable = $features)]
            #[inline]
            fn half(bytes: &[u8], i: usize) -> f32 {
                let bits = u16::from_le_bytes([bytes[i], bytes[i + 1]]);
                _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
            }

            #[target_feature(enable = $features)]
            #[inline]
            fn horizontal_sum(v: __m256) -> f32 {
                let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
                let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
            }

            /// A 4-bit block's 16 bytes as 32 bytes 0..15 (low nibbles first).
            #[target_feature(enable = $features)]
            #[inline]
            fn nibbles(qs: &[u8]) -> __m256i {
                assert!(qs.len() >= 16);
                // SAFETY: 16 readable bytes (checked above); unaligned load.
                let q = unsafe { _mm_loadu_si128(qs.as_ptr().cast()) };
                let both = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
                _mm256_and_si256(both, _mm256_set1_epi8(0x0f))
            }

            #[target_feature(enable = $features)]
            #[inline]
            fn activations(xb: &Q8Block) -> __m256i {
                // SAFETY: `qs` is 32 bytes; unaligned load.
                unsafe { _mm256_loadu_si256(xb.qs.as_ptr().cast()) }
            }

            /// Q4_0 row × N tokens: `Σ_b d_w·d_x·(Σ q·x − 8·Σ x)`.
            #[target_feature(enable = $features)]
            fn q4_0<const N: usize>(row: &[u8], xs: [&[Q8Block]; N]) -> [f32; N] {
                // Even and odd blocks in separate chains, so one token's FMAs overlap.
                let mut acc = [[_mm256_setzero_ps(); N]; 2];
                let mut offset = [0.0f32; N];
                for (b, block) in row.chunks_exact(18).enumerate() {
                    let d = half(block, 0);
                    let w = nibbles(&block[2..]);
                    for k in 0..N {
                        let xb = &xs[k][b];
                        let p = _mm256_cvtepi32_ps(dot_u8_i8(w, activations(xb)));
                        acc[b & 1][k] = _mm256_fmadd_ps(p, _mm256_set1_ps(d * xb.d), acc[b & 1][k]);
                        offset[k] -= 8.0 * d * xb.d_sum;
                    }
                }
                std::array::from_fn(|k| {
                    horizontal_sum(_mm256_add_ps(acc[0][k], acc[1][k])) + offset[k]
                })
            }

            /// Q4_1 row × N tokens: `Σ_b d_w·d_x·Σ q·x + m·d_x·Σ x`.
            #[target_feature(enable = $features)]
            fn q4_1<const N: usize>(row: &[u8], xs: [&[Q8Block]; N]) -> [f32; N] {
                let mut acc = [[_mm256_setzero_ps(); N]; 2];
                let mut offset = [0.0f32; N];
                for (b, block) in row.chunks_exact(20).enumerate() {
                    let (d, m) = (half(block, 0), half(block, 2));
                    let w = nibbles(&block[4..]);
                    for k in 0..N {
                        let xb = &xs[k][b];
                        let p = _mm256_cvtepi32_ps(dot_u8_i8(w, activations(xb)));
                        acc[b & 1][k] = _mm256_fmadd_ps(p, _mm256_set1_ps(d * xb.d), acc[b & 1][k]);
                        offset[k] += m * xb.d_sum;
                    }
                }
                std::array::from_fn(|k| {
                    horizontal_sum(_mm256_add_ps(acc[0][k], acc[1][k])) + offset[k]
                })
            }

            /// Q8_0 row × N tokens: `Σ_b d_w·d_x·Σ q·x`, as `|q|·(x·sign q)`.
            #[target_feature(enable = $features)]
            fn q8_0<const N: usize>(row: &[u8], xs: [&[Q8Block]; N]) -> [f32; N] {
                let mut acc = [[_mm256_setzero_ps(); N]; 2];
                for (b, block) in row.chunks_exact(34).enumerate() {
                    let d = half(block, 0);
                    assert!(block.len() == 34);
                    // SAFETY: 32 readable bytes after the scale (checked above).
                    let w = unsafe { _mm256_loadu_si256(block[2..].as_ptr().cast()) };
                    let magnitude = _mm256_sign_epi8(w, w);
                    for k in 0..N {
                        let xb = &xs[k][b];
                        let signed = _mm256_sign_epi8(activations(xb), w);
                        let p = _mm256_cvtepi32_ps(dot_u8_i8(magnitude, signed));
                        acc[b & 1][k] = _mm256_fmadd_ps(p, _mm256_set1_ps(d * xb.d), acc[b & 1][k]);
                    }
                }
                std::array::from_fn(|k| horizontal_sum(_mm256_add_ps(acc[0][k], acc[1][k])))
            }

            /// `out[t] = row · x[t]` for every token: `TILE` tokens per pass over the row, the
            /// rest in tiles of 4, 2 and 1.
            ///
            /// # Safety
            /// The CPU must have the features this module is compiled for.
            #[target_feature(enable = $features)]
            pub(in super::super) unsafe fn row(
                format: BlockFormat,
                row: &[u8],
                x: &Q8Activations,
                out: &mut [f32],
            ) {
                if format == BlockFormat::F32 {
                    return scalar::row(format, row, x, out);
                }
                debug_assert_eq!(row.len(), format.row_bytes(x.cols()));
                let mut t0 = 0;
                tiles::<TILE>(format, row, x, out, &mut t0);
                tiles::<4>(format, row, x, out, &mut t0);
                tiles::<2>(format, row, x, out, &mut t0);
                tiles::<1>(format, row, x, out, &mut t0);
            }

            /// As many tiles of N tokens as fit from token `t0` on.
            #[target_feature(enable = $features)]
            fn tiles<const N: usize>(
                format: BlockFormat,
                row: &[u8],
                x: &Q8Activations,
                out: &mut [f32],
                t0: &mut usize,
            ) {
                while *t0 + N <= out.len() {
                    let xs = std::array::from_fn(|k| x.blocks(*t0 + k));
                    let sums = match format {
                        BlockFormat::Q4_0 => q4_0::<N>(row, xs),
                        BlockFormat::Q4_1 => q4_1::<N>(row, xs),
                        BlockFormat::Q8_0 => q8_0::<N>(row, xs),
                        BlockFormat::F32 => unreachable!("f32 rows take the portable kernel"),
                    };
                    out[*t0..*t0 + N].copy_from_slice(&sums);
                    *t0 += N;
                }
            }
        }
    };
}

// AVX2 has 16 vector registers: 2 × 4 accumulators leave room for the operands.
kernels!(avx2, "avx2,fma,f16c", tile 4, |w, x| {
    _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1))
});

// AVX-512 has 32: 2 × 8 accumulators.
kernels!(vnni, "avx2,fma,f16c,avx512vnni,avx512vl", tile 8, |w, x| {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x)
});

/// Values per block (the kernels assume 32).
const _: () = assert!(BLOCK == 32);
