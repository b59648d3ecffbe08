//! The block products on x86-64: AVX2 (`vpmaddubsw` + `vpmaddwd`), and AVX-512 VNNI's
//! `vpdpbusd` (32 byte products summed into eight i32 in one instruction) where the CPU has it.
//! The same source is compiled twice, once per instruction set, by the `kernels!` macro below.
//!
//! For each row of `W`: the row is unpacked once into a small buffer that stays in L1 (each
//! block's 32 unsigned bytes, its scale `d_w` and its offset: `m` for Q4_1, `−8·d_w` for Q4_0,
//! `−dmin·m` for Q4_K/Q5_K, whose super-blocks of 256 unpack as eight such blocks),
//! then every token walks it eight blocks at a time: eight byte products, their lanes summed
//! into one vector of eight block sums, scaled by `d_w·d_x` and the offsets added (`off·d_x·Σx`)
//! in two vector FMAs. Rows and activations are padded with zero blocks to whole groups.
//!
//! With 16-bit activations the weights are widened to i16 at unpacking and each block is two
//! `vpmaddwd` (or VNNI's `vpdpwssd`): i16 × i16 pairs summed into i32 (`2·127·32767` fits).
//!
//! Both byte products take an unsigned first operand: 4-bit values are 0..15; an 8-bit weight
//! is passed as `|w|`, its sign moved onto the activation (`sign(x, w)`), as llama.cpp does.
//! `vpmaddubsw` saturates at ±32767: `2·128·127` fits.
//!
//! Q6_K has a scale per 16 values and `w = d·s·(q − 32)`: with 8-bit activations its 6-bit `q`
//! go into `vpmaddubsw`, the pair sums of `32·x` are taken off, and `vpmaddwd` multiplies each
//! half's eight pair sums by its scale (`2·32·127·128` fits in i32); with 16-bit activations the
//! weights are widened as `s·(q − 32)` (|·| ≤ 4096), and a block's sum, up to `32·4096·32767`,
//! can pass i32's range, so its eight lanes are summed as f32.

use std::arch::x86_64::*;

use super::activations::{
    ActivationBits, PADDING, Q8Block, Q16Block, QuantizedActivations, padded_blocks,
};
use super::{BLOCK, BlockFormat, SUPER_BLOCK, scalar};

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

/// The formats as const parameters of the one kernel.
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q8_0: u8 = 2;
const Q4_K: u8 = 3;
const Q5_K: u8 = 4;
const Q6_K: u8 = 5;

const fn block_format(format: u8) -> BlockFormat {
    match format {
        Q4_0 => BlockFormat::Q4_0,
        Q4_1 => BlockFormat::Q4_1,
        Q8_0 => BlockFormat::Q8_0,
        Q4_K => BlockFormat::Q4K,
        Q5_K => BlockFormat::Q5K,
        _ => BlockFormat::Q6K,
    }
}

/// Whether each block's weights carry an offset (`off·d_x·Σx` is added).
const fn has_offset(format: u8) -> bool {
    matches!(format, Q4_0 | Q4_1 | Q4_K | Q5_K)
}

/// Blocks whose sums go into one vector.
const GROUP: usize = 8;
const _: () = assert!(PADDING.is_multiple_of(GROUP));

/// One row unpacked: per block of 32 its unsigned bytes and the signs to move onto 8-bit
/// activations (Q8_0), or Q6_K's two scales as 16 i16 (eight of each, for the eight pair sums
/// of each half), or its values as two vectors of 16 i16 (for 16-bit activations; Q6_K's times
/// their scales), `d_w` and the offset; zero blocks at the end up to the activations' padding.
struct Unpacked {
    bytes: Vec<__m256i>,
    signs: Vec<__m256i>,
    halves: Vec<__m256i>,
    wide: Vec<[__m256i; 2]>,
    scales: Vec<f32>,
    offsets: Vec<f32>,
}

/// The eight lane sums of eight vectors `$p` as one vector `[Σp0, …, Σp7]`, with the horizontal
/// add, 128-bit permute and add of their lane type: pairs, then quads within each 128-bit half
/// (`[Σ₀₋₃ p0, p1, p2, p3] | [Σ₄₋₇ p0, p1, p2, p3]`, then p4..p7), then the two halves.
macro_rules! lane_sums {
    ($p:expr, $hadd:ident, $permute:ident, $add:ident) => {{
        let p = &$p;
        let (s01, s23) = ($hadd(p[0], p[1]), $hadd(p[2], p[3]));
        let (s45, s67) = ($hadd(p[4], p[5]), $hadd(p[6], p[7]));
        let (q0, q1) = ($hadd(s01, s23), $hadd(s45, s67));
        $add($permute(q0, q1, 0x20), $permute(q0, q1, 0x31))
    }};
}

macro_rules! kernels {
    (
        $isa:ident,
        $features:literal,
        |$w:ident, $x:ident| $dot:expr,
        |$wl:ident, $xl:ident, $wh:ident, $xh:ident| $dot16:expr
    ) => {
        pub(super) mod $isa {
            use super::*;

            /// `Σ w·x` of 32 unsigned bytes and 32 signed bytes, as eight i32 partial sums.
            #[target_feature(enable = $features)]
            #[inline]
            fn dot_u8_i8($w: __m256i, $x: __m256i) -> __m256i {
                $dot
            }

            /// `Σ w·x` of two pairs of 16 i16, as eight i32 partial sums.
            #[target_feature(enable = $features)]
            #[inline]
            fn dot_i16($wl: __m256i, $xl: __m256i, $wh: __m256i, $xh: __m256i) -> __m256i {
                $dot16
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

            #[target_feature(enable = $features)]
            #[inline]
            fn load32(bytes: &[u8]) -> __m256i {
                assert!(bytes.len() >= 32);
                // SAFETY: 32 readable bytes (checked above); unaligned load.
                unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) }
            }

            #[target_feature(enable = $features)]
            #[inline]
            fn load8(values: &[f32]) -> __m256 {
                assert!(values.len() >= 8);
                // SAFETY: 8 readable values (checked above).
                unsafe { _mm256_loadu_ps(values.as_ptr()) }
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

            /// The eight lane sums of eight vectors, as one vector: `[Σp0, …, Σp7]`.
            #[target_feature(enable = $features)]
            #[inline]
            fn reduce8(p: &[__m256i; GROUP]) -> __m256i {
                lane_sums!(
                    p,
                    _mm256_hadd_epi32,
                    _mm256_permute2x128_si256,
                    _mm256_add_epi32
                )
            }

            /// The same as f32 (Q6_K's 16-bit products, whose block sums may pass i32's range).
            #[target_feature(enable = $features)]
            #[inline]
            fn reduce8_f32(p: &[__m256i; GROUP]) -> __m256 {
                let f = p.map(|v| _mm256_cvtepi32_ps(v));
                lane_sums!(f, _mm256_hadd_ps, _mm256_permute2f128_ps, _mm256_add_ps)
            }

            /// Block `b` of `u` from its 32 unsigned values (element order).
            #[target_feature(enable = $features)]
            #[inline]
            fn store_unsigned<const WIDE: bool>(u: &mut Unpacked, b: usize, values: __m256i) {
                if WIDE {
                    let low = _mm256_castsi256_si128(values);
                    let high = _mm256_extracti128_si256(values, 1);
                    u.wide[b] = [_mm256_cvtepu8_epi16(low), _mm256_cvtepu8_epi16(high)];
                } else {
                    u.bytes[b] = values;
                }
            }

            /// Unpacks one Q4_K/Q5_K super-block into blocks `first..first + 8` of `u`.
            #[target_feature(enable = $features)]
            fn unpack_k4<const F: u8, const WIDE: bool>(
                block: &[u8],
                u: &mut Unpacked,
                first: usize,
            ) {
                let (d, dmin) = (half(block, 0), half(block, 2));
                let packed = &block[4..16];
                let (fifth, qs) = if F == Q5_K {
                    (Some(load32(&block[16..])), &block[48..176])
                } else {
                    (None, &block[16..144])
                };
                let (scales, mins) = scalar::k4_scales_and_mins(packed);
                let widen = |v: [u8; 8]| {
                    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(i64::from_le_bytes(
                        v,
                    ))))
                };
                let scales = _mm256_mul_ps(_mm256_set1_ps(d), widen(scales));
                let offsets = _mm256_mul_ps(_mm256_set1_ps(-dmin), widen(mins));
                let slots = first..first + SUPER_BLOCK / BLOCK;
                let (to_scales, to_offsets) = (&mut u.scales[slots.clone()], &mut u.offsets[slots]);
                // SAFETY: eight writable values each (the ranges above); unaligned stores.
                unsafe {
                    _mm256_storeu_ps(to_scales.as_mut_ptr(), scales);
                    _mm256_storeu_ps(to_offsets.as_mut_ptr(), offsets);
                }
                let nibble = _mm256_set1_epi8(0x0f);
                for (g, chunk) in qs.chunks_exact(32).enumerate() {
                    let q = load32(chunk);
                    let low = _mm256_and_si256(q, nibble);
                    let high = _mm256_and_si256(_mm256_srli_epi16(q, 4), nibble);
                    for (k, mut values) in [(2 * g, low), (2 * g + 1, high)] {
                        if let Some(qh) = fifth {
                            // Bit k of each qh byte → 16.
                            let bit = _mm256_set1_epi8((1u8 << k) as i8);
                            let set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
                            let sixteen = _mm256_and_si256(set, _mm256_set1_epi8(16));
                            values = _mm256_or_si256(values, sixteen);
                        }
                        store_unsigned::<WIDE>(u, first + k, values);
                    }
                }
            }

            /// Unpacks one Q6_K super-block into blocks `first..first + 8` of `u`.
            #[target_feature(enable = $features)]
            fn unpack_q6_k<const WIDE: bool>(block: &[u8], u: &mut Unpacked, first: usize) {
                let d = half(block, 208);
                let mask = |m: u8| _mm256_set1_epi8(m as i8);
                for h in 0..2 {
                    let ql0 = load32(&block[64 * h..]);
                    let ql1 = load32(&block[64 * h + 32..]);
                    let qh = load32(&block[128 + 32 * h..]);
                    let scales = &block[192 + 8 * h..200 + 8 * h];
                    let low = |v: __m256i| _mm256_and_si256(v, mask(0x0f));
                    let up = |v: __m256i| _mm256_and_si256(_mm256_srli_epi16(v, 4), mask(0x0f));
                    // Bits 2k, 2k + 1 of qh moved to bits 4, 5 (masked first: no bit crosses
                    // into the neighbouring byte of a 16-bit shift).
                    let q6 = [
                        _mm256_or_si256(
                            low(ql0),
                            _mm256_slli_epi16(_mm256_and_si256(qh, mask(0x03)), 4),
                        ),
                        _mm256_or_si256(
                            low(ql1),
                            _mm256_slli_epi16(_mm256_and_si256(qh, mask(0x0c)), 2),
                        ),
                        _mm256_or_si256(up(ql0), _mm256_and_si256(qh, mask(0x30))),
                        _mm256_or_si256(
                            up(ql1),
                            _mm256_srli_epi16(_mm256_and_si256(qh, mask(0xc0)), 2),
                        ),
                    ];
                    for (k, &q) in q6.iter().enumerate() {
                        let b = first + 4 * h + k;
                        let (s0, s1) = (scales[2 * k] as i8 as i16, scales[2 * k + 1] as i8 as i16);
                        u.scales[b] = d;
                        u.offsets[b] = 0.0;
                        if WIDE {
                            let bias = _mm256_set1_epi16(32);
                            let widen = |v: __m128i, s: i16| {
                                let centred = _mm256_sub_epi16(_mm256_cvtepu8_epi16(v), bias);
                                _mm256_mullo_epi16(centred, _mm256_set1_epi16(s))
                            };
                            u.wide[b] = [
                                widen(_mm256_castsi256_si128(q), s0),
                                widen(_mm256_extracti128_si256(q, 1), s1),
                            ];
                        } else {
                            u.bytes[b] = q;
                            u.halves[b] = _mm256_set_m128i(_mm_set1_epi16(s1), _mm_set1_epi16(s0));
                        }
                    }
                }
            }

            /// Unpacks one row of format `F` into `u`, for 16-bit activations when `WIDE`.
            #[target_feature(enable = $features)]
            fn unpack<const F: u8, const WIDE: bool>(row: &[u8], u: &mut Unpacked) {
                let format = block_format(F);
                let size = format.row_bytes(format.values_per_block());
                if format.values_per_block() == SUPER_BLOCK {
                    let per = SUPER_BLOCK / BLOCK;
                    for (s, block) in row.chunks_exact(size).enumerate() {
                        if F == Q6_K {
                            unpack_q6_k::<WIDE>(block, u, per * s);
                        } else {
                            unpack_k4::<F, WIDE>(block, u, per * s);
                        }
                    }
                    return;
                }
                for (b, block) in row.chunks_exact(size).enumerate() {
                    let scale = half(block, 0);
                    u.scales[b] = scale;
                    let (unsigned, offset) = match F {
                        Q4_0 => (nibbles(&block[2..]), -8.0 * scale),
                        Q4_1 => (nibbles(&block[4..]), half(block, 2)),
                        _ => {
                            let raw = load32(&block[2..]);
                            u.signs[b] = raw;
                            (_mm256_sign_epi8(raw, raw), 0.0)
                        }
                    };
                    u.offsets[b] = offset;
                    if WIDE && F == Q8_0 {
                        // Element order: the first 16 values, then the last 16.
                        let low = _mm256_castsi256_si128(u.signs[b]);
                        let high = _mm256_extracti128_si256(u.signs[b], 1);
                        u.wide[b] = [_mm256_cvtepi8_epi16(low), _mm256_cvtepi8_epi16(high)];
                    } else {
                        store_unsigned::<WIDE>(u, b, unsigned);
                    }
                }
            }

            /// The activations' signed operand: `x`, or `x·sign(w)` for Q8_0.
            #[target_feature(enable = $features)]
            #[inline]
            fn signed<const F: u8>(xb: &Q8Block, signs: __m256i) -> __m256i {
                // SAFETY: `qs` is 32 bytes; unaligned load.
                let x = unsafe { _mm256_loadu_si256(xb.qs.as_ptr().cast()) };
                if F == Q8_0 {
                    _mm256_sign_epi8(x, signs)
                } else {
                    x
                }
            }

            /// One unpacked row · one token's blocks (both padded to whole groups).
            #[target_feature(enable = $features)]
            fn dot<const F: u8>(u: &Unpacked, x: &QuantizedActivations, t: usize) -> f32 {
                let (xs, dx, dsum) = (x.blocks(t), x.scales(t), x.d_sums(t));
                let mut acc = _mm256_setzero_ps();
                for g in (0..xs.len()).step_by(GROUP) {
                    let mut p = [_mm256_setzero_si256(); GROUP];
                    for (j, p) in p.iter_mut().enumerate() {
                        let b = g + j;
                        *p = if F == Q6_K {
                            // Σ s·(q − 32)·x: the pair sums of q·x less those of 32·x, each
                            // half's eight times its scale.
                            // SAFETY: `qs` is 32 bytes; unaligned load.
                            let x = unsafe { _mm256_loadu_si256(xs[b].qs.as_ptr().cast()) };
                            let pairs = _mm256_sub_epi16(
                                _mm256_maddubs_epi16(u.bytes[b], x),
                                _mm256_maddubs_epi16(_mm256_set1_epi8(32), x),
                            );
                            _mm256_madd_epi16(pairs, u.halves[b])
                        } else {
                            dot_u8_i8(u.bytes[b], signed::<F>(&xs[b], u.signs[b]))
                        };
                    }
                    let sums = _mm256_cvtepi32_ps(reduce8(&p));
                    let scale = _mm256_mul_ps(load8(&u.scales[g..]), load8(&dx[g..]));
                    acc = _mm256_fmadd_ps(sums, scale, acc);
                    if has_offset(F) {
                        acc = _mm256_fmadd_ps(load8(&u.offsets[g..]), load8(&dsum[g..]), acc);
                    }
                }
                horizontal_sum(acc)
            }

            /// One unpacked row · one token's 16-bit blocks.
            #[target_feature(enable = $features)]
            fn dot_wide<const F: u8>(u: &Unpacked, x: &QuantizedActivations, t: usize) -> f32 {
                let (xs, dx, dsum) = (x.wide_blocks(t), x.scales(t), x.d_sums(t));
                let mut acc = _mm256_setzero_ps();
                for g in (0..xs.len()).step_by(GROUP) {
                    let mut p = [_mm256_setzero_si256(); GROUP];
                    for (j, p) in p.iter_mut().enumerate() {
                        let b = g + j;
                        let (low, high) = wide_halves(&xs[b]);
                        *p = dot_i16(u.wide[b][0], low, u.wide[b][1], high);
                    }
                    let sums = if F == Q6_K {
                        reduce8_f32(&p)
                    } else {
                        _mm256_cvtepi32_ps(reduce8(&p))
                    };
                    let scale = _mm256_mul_ps(load8(&u.scales[g..]), load8(&dx[g..]));
                    acc = _mm256_fmadd_ps(sums, scale, acc);
                    if has_offset(F) {
                        acc = _mm256_fmadd_ps(load8(&u.offsets[g..]), load8(&dsum[g..]), acc);
                    }
                }
                horizontal_sum(acc)
            }

            #[target_feature(enable = $features)]
            #[inline]
            fn wide_halves(xb: &Q16Block) -> (__m256i, __m256i) {
                // SAFETY: `qs` is 32 i16 (64 bytes); unaligned loads.
                unsafe {
                    (
                        _mm256_loadu_si256(xb.qs.as_ptr().cast()),
                        _mm256_loadu_si256(xb.qs[16..].as_ptr().cast()),
                    )
                }
            }

            #[target_feature(enable = $features)]
            fn rows_of<const F: u8, const WIDE: bool>(
                rows: &[u8],
                x: &QuantizedActivations,
                out: &mut [f32],
            ) {
                let t = x.tokens();
                let padded = padded_blocks(x.cols());
                let zero = _mm256_setzero_si256();
                let mut u = Unpacked {
                    bytes: vec![zero; padded],
                    signs: vec![zero; padded],
                    halves: vec![zero; if F == Q6_K { padded } else { 0 }],
                    wide: vec![[zero; 2]; if WIDE { padded } else { 0 }],
                    scales: vec![0.0; padded],
                    offsets: vec![0.0; padded],
                };
                let row_bytes = block_format(F).row_bytes(x.cols());
                for (row, out) in rows.chunks_exact(row_bytes).zip(out.chunks_exact_mut(t)) {
                    unpack::<F, WIDE>(row, &mut u);
                    for (token, o) in out.iter_mut().enumerate() {
                        *o = if WIDE {
                            dot_wide::<F>(&u, x, token)
                        } else {
                            dot::<F>(&u, x, token)
                        };
                    }
                }
            }

            /// `out[r·T + t] = W[r] · x[t]` for a run of rows of `W` and every token.
            ///
            /// # Safety
            /// The CPU must have the features this module is compiled for.
            #[target_feature(enable = $features)]
            pub(in super::super) unsafe fn rows(
                format: BlockFormat,
                rows: &[u8],
                x: &QuantizedActivations,
                out: &mut [f32],
            ) {
                let wide = x.bits() == ActivationBits::Sixteen;
                match (format, wide) {
                    (BlockFormat::F32, _) => scalar::rows(format, rows, x, out),
                    (BlockFormat::Q4_0, false) => rows_of::<Q4_0, false>(rows, x, out),
                    (BlockFormat::Q4_1, false) => rows_of::<Q4_1, false>(rows, x, out),
                    (BlockFormat::Q8_0, false) => rows_of::<Q8_0, false>(rows, x, out),
                    (BlockFormat::Q4_0, true) => rows_of::<Q4_0, true>(rows, x, out),
                    (BlockFormat::Q4_1, true) => rows_of::<Q4_1, true>(rows, x, out),
                    (BlockFormat::Q8_0, true) => rows_of::<Q8_0, true>(rows, x, out),
                    (BlockFormat::Q4K, false) => rows_of::<Q4_K, false>(rows, x, out),
                    (BlockFormat::Q5K, false) => rows_of::<Q5_K, false>(rows, x, out),
                    (BlockFormat::Q6K, false) => rows_of::<Q6_K, false>(rows, x, out),
                    (BlockFormat::Q4K, true) => rows_of::<Q4_K, true>(rows, x, out),
                    (BlockFormat::Q5K, true) => rows_of::<Q5_K, true>(rows, x, out),
                    (BlockFormat::Q6K, true) => rows_of::<Q6_K, true>(rows, x, out),
                }
            }
        }
    };
}

kernels!(
    avx2,
    "avx2,fma,f16c",
    |w, x| _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)),
    |wl, xl, wh, xh| _mm256_add_epi32(_mm256_madd_epi16(wl, xl), _mm256_madd_epi16(wh, xh))
);

kernels!(
    vnni,
    "avx2,fma,f16c,avx512vnni,avx512vl",
    |w, x| _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x),
    |wl, xl, wh, xh| _mm256_dpwssd_epi32(
        _mm256_dpwssd_epi32(_mm256_setzero_si256(), wl, xl),
        wh,
        xh
    )
);

/// Values per block (the kernels assume 32).
const _: () = assert!(BLOCK == 32);
