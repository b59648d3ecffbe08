//! The block products on x86-64: AVX2 (`vpmaddubsw` + `vpmaddwd`), and AVX-512 VNNI's
//! `vpdpbusd` (32 byte products summed into eight i32 in one instruction) where the CPU has it.
//! The same source is compiled twice, once per instruction set, by the `kernels!` macro below.
//!
//! Three shapes of kernel:
//! - **A row buffer** (Q8_0 with AVX2 only): each row of `W` is unpacked once into a small buffer
//!   that stays in L1 (each block's `|q|`, its signs and `d_w`), then every token walks it eight
//!   blocks at a time: eight byte products, their lanes summed into one vector of eight block
//!   sums, scaled by `d_w·d_x` in one vector FMA.
//! - **Groups of eight blocks, one token at a time** (the K-quants' super-blocks, Q4_0 and Q4_1
//!   eight blocks at a time, and Q8_0 with VNNI; decoding and short prompts): each group is
//!   unpacked into eight registers (no buffer) and taken against each token's eight blocks as
//!   above, the offsets (`m` for Q4_1, `−8·d_w` for Q4_0, `−dmin·m` for the K-quants, `−128·d_w`
//!   for Q8_0) added as `off·d_x·Σx`; with one token the sums stay in registers. A row that ends
//!   inside a group (SmolLM2's 576 columns: two groups and two blocks) takes its last blocks
//!   with zero blocks after them.
//! - **Groups of eight blocks, eight tokens side by side** (prompts of 8 tokens or more,
//!   [`TokenGroups`]): four codes of a row repeated in every lane times a vector holding the same
//!   four positions of eight tokens gives the eight tokens' partial sums in the eight lanes, so
//!   a block's sum needs no lane reduction, and its scale (one per token) is one vector. With
//!   VNNI (32 vector registers) the formats with an offset take two rows at a time, so that each
//!   of the tokens' vectors (from L2 in a long prompt) is loaded once for both rows' products.
//!   Rows that end inside a group are copied a tile at a time with zero blocks after them.
//!
//! With 16-bit activations the row buffer widens its weights to i16 (two `vpmaddwd` per block:
//! `2·127·32767` fits in i32); the group kernels take the activations split into two signed
//! bytes (`q = 256·high + low`, [`SplitBlock`]) against the codes' own bytes, or widen the codes
//! once per group when several tokens share them (`32·255·32639` fits in i32).
//!
//! Both byte products take an unsigned first operand: 4-bit values are 0..15. An 8-bit weight
//! is passed as `q + 128` (0..255, the offset `−128·d_w` taken off as for Q4_0) with VNNI,
//! whose `vpdpbusd` sums four products in i32; `vpmaddubsw` saturates a pair at ±32767, so with
//! AVX2 it is passed as `|w|`, its sign moved onto the activation (`sign(x, w)`), as llama.cpp
//! does (`2·128·127` fits).
//!
//! Q6_K has a scale per 16 values and `w = d·s·(q − 32)`: its 6-bit `q` go into the byte
//! product and `32·Σx` is taken off (the pair sums of `32·x`, or each token's sums of 16
//! values side by side); each half's sum is then multiplied by its scale (`vpmulld`; one token
//! at a time, the lane sums are stopped at one per half for it). Its 16-bit activations are
//! always split into bytes: each plane's block sum is an exact integer, converted once (widened
//! weights `s·(q − 32)` would need their lanes summed in f32, which would make a token's result
//! depend on how many tokens came with it).
//!
//! Every kernel gives a token the same bits whatever the number of tokens beside it (the
//! side-by-side kernel keeps each of the one-token kernel's eight lanes as an accumulator of its
//! own and adds them in `horizontal_sum`'s order), so a prompt's logits equal those of the same
//! tokens decoded one at a time.

use std::arch::x86_64::*;

use super::activations::{
    ActivationBits, HalfSums, PADDING, Q8Block, Q16Block, QuantizedActivations, SplitBlock,
    TOKEN_GROUP, TokenGroups, padded_blocks,
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

/// From how many tokens the K-quant kernels widen their codes to i16 for 16-bit activations
/// (below, the activations' bytes are multiplied with the codes' own).
const WIDEN_FROM_TOKENS: usize = 3;

/// Blocks whose sums go into one vector.
const GROUP: usize = 8;
const _: () = assert!(PADDING.is_multiple_of(GROUP));

/// `row` copied into the start of `padded`, whose rest stays zero (zero blocks add nothing).
#[inline]
fn padded_row<'a>(row: &[u8], padded: &'a mut [u8]) -> &'a [u8] {
    padded[..row.len()].copy_from_slice(row);
    padded
}

/// One Q8_0 row unpacked (the AVX2 kernel's): per block its `|q|` and signs (to move onto 8-bit
/// activations), or its values as two vectors of 16 i16 (16-bit activations), and `d_w`; zero
/// blocks at the end up to the activations' padding.
struct Unpacked {
    bytes: Vec<__m256i>,
    signs: Vec<__m256i>,
    wide: Vec<[__m256i; 2]>,
    scales: Vec<f32>,
}

macro_rules! kernels {
    (
        $isa:ident,
        $features:literal,
        $tile_rows:literal,
        $exact_unsigned:literal,
        |$w:ident, $x:ident| $dot:expr,
        |$acc:ident, $wa:ident, $xa:ident| $dot_acc:expr,
        |$wl:ident, $xl:ident, $wh:ident, $xh:ident| $dot16:expr
    ) => {
        pub(super) mod $isa {
            use super::*;

            /// Whether a byte product of unsigned bytes up to 255 is exact (VNNI's
            /// `vpdpbusd` sums in i32; AVX2's `vpmaddubsw` saturates pairs at ±32767), so that
            /// Q8_0 can take the blocked kernels as `q + 128`.
            const EXACT_UNSIGNED_BYTES: bool = $exact_unsigned;

            /// `Σ w·x` of 32 unsigned bytes and 32 signed bytes, as eight i32 partial sums.
            #[target_feature(enable = $features)]
            #[inline]
            fn dot_u8_i8($w: __m256i, $x: __m256i) -> __m256i {
                $dot
            }

            /// `acc + Σ w·x` of 32 unsigned bytes and 32 signed bytes, four products a lane.
            #[target_feature(enable = $features)]
            #[inline]
            fn dot_u8_i8_add($acc: __m256i, $wa: __m256i, $xa: __m256i) -> __m256i {
                $dot_acc
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

            /// Four vectors' lane sums per 128-bit half: `[Σ lo p0, …, Σ lo p3 | Σ hi p0, …,
            /// Σ hi p3]` (pairs of vectors' 32-bit lanes interleaved and added, then their 64-bit
            /// lanes): [`reduce8`]'s first two steps, and Q6_K's half sums.
            #[target_feature(enable = $features)]
            #[inline]
            fn lane_sums_by_half(p: &[__m256i]) -> __m256i {
                let pair = |a: __m256i, b: __m256i| {
                    _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b))
                };
                let (s01, s23) = (pair(p[0], p[1]), pair(p[2], p[3]));
                _mm256_add_epi32(
                    _mm256_unpacklo_epi64(s01, s23),
                    _mm256_unpackhi_epi64(s01, s23),
                )
            }

            /// The eight lane sums of eight vectors, as one vector: `[Σp0, …, Σp7]`: pairs of
            /// vectors' lanes interleaved and added (unpack low/high of 32-bit, then of 64-bit
            /// lanes), then the two 128-bit halves. Not `vphaddd`: on the AVX-512 VNNI machine
            /// the kernels were measured on, this alone took a one-token Q4_K product at 8 bits
            /// from 178 to 139 µs (2 threads, in cache; 16 bits, after `split_sums` combined its
            /// planes: 194 to 184).
            #[target_feature(enable = $features)]
            #[inline]
            fn reduce8(p: &[__m256i; GROUP]) -> __m256i {
                let (q0, q1) = (lane_sums_by_half(&p[..4]), lane_sums_by_half(&p[4..]));
                _mm256_add_epi32(
                    _mm256_permute2x128_si256(q0, q1, 0x20),
                    _mm256_permute2x128_si256(q0, q1, 0x31),
                )
            }

            /// One Q4_K/Q5_K super-block: its eight blocks' unsigned values (element order),
            /// their scales `d·sc` and their offsets `−dmin·m`.
            #[target_feature(enable = $features)]
            #[inline]
            fn k4_super_block<const F: u8>(block: &[u8]) -> ([__m256i; 8], __m256, __m256) {
                let (d, dmin) = (half(block, 0), half(block, 2));
                let (scales, mins) = scalar::k4_scales_and_mins(&block[4..16]);
                let widen = |v: [u8; 8]| {
                    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(i64::from_le_bytes(
                        v,
                    ))))
                };
                let scales = _mm256_mul_ps(_mm256_set1_ps(d), widen(scales));
                let offsets = _mm256_mul_ps(_mm256_set1_ps(-dmin), widen(mins));
                let qs = if F == Q5_K {
                    &block[48..176]
                } else {
                    &block[16..144]
                };
                let nibble = _mm256_set1_epi8(0x0f);
                let mut codes = [_mm256_setzero_si256(); SUPER_BLOCK / BLOCK];
                for g in 0..4 {
                    let q = load32(&qs[32 * g..]);
                    codes[2 * g] = _mm256_and_si256(q, nibble);
                    codes[2 * g + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), nibble);
                }
                if F == Q5_K {
                    // Bit k of each qh byte → 16 in block k.
                    let qh = load32(&block[16..]);
                    for (k, code) in codes.iter_mut().enumerate() {
                        let bit = _mm256_set1_epi8((1u8 << k) as i8);
                        let set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
                        let sixteen = _mm256_and_si256(set, _mm256_set1_epi8(16));
                        *code = _mm256_or_si256(*code, sixteen);
                    }
                }
                (codes, scales, offsets)
            }

            /// Eight blocks of 32 as unsigned codes, scales and offsets, as `k4_super_block`:
            /// Q4_0 (`q`, `d`, `−8·d`), Q4_1 (`q`, `d`, `m`), Q8_0 (`q + 128`, `d`, `−128·d`:
            /// VNNI only, as `vpmaddubsw` would saturate), and the K-quants' super-blocks.
            #[target_feature(enable = $features)]
            #[inline]
            fn eight_blocks<const F: u8>(bytes: &[u8]) -> ([__m256i; 8], __m256, __m256) {
                if F == Q4_K || F == Q5_K {
                    return k4_super_block::<F>(bytes);
                }
                if F == Q8_0 {
                    return q8_0_group(bytes);
                }
                // Plain loops: closures and `array::map` here were left as calls (10× slower).
                let size = block_format(F).row_bytes(BLOCK);
                let first = if F == Q4_1 { 4 } else { 2 };
                let mut codes = [_mm256_setzero_si256(); GROUP];
                let (mut d, mut m) = ([0u16; GROUP], [0u16; GROUP]);
                for j in 0..GROUP {
                    let block = &bytes[size * j..size * (j + 1)];
                    d[j] = u16::from_le_bytes([block[0], block[1]]);
                    m[j] = u16::from_le_bytes([block[2], block[3]]);
                    codes[j] = nibbles(&block[first..]);
                }
                // SAFETY: eight u16 each; unaligned loads.
                let (d, m) = unsafe {
                    (
                        _mm_loadu_si128(d.as_ptr().cast()),
                        _mm_loadu_si128(m.as_ptr().cast()),
                    )
                };
                let scales = _mm256_cvtph_ps(d);
                let offsets = if F == Q4_1 {
                    _mm256_cvtph_ps(m)
                } else {
                    _mm256_mul_ps(scales, _mm256_set1_ps(-8.0))
                };
                (codes, scales, offsets)
            }

            /// A row's last blocks (fewer than eight, of Q4_0, Q4_1 or Q8_0) as `eight_blocks`
            /// gives a group: the missing blocks zero (`d = 0`: they add nothing).
            #[target_feature(enable = $features)]
            fn last_blocks<const F: u8>(bytes: &[u8]) -> ([__m256i; 8], __m256, __m256) {
                let size = block_format(F).row_bytes(BLOCK);
                let mut codes = [_mm256_setzero_si256(); GROUP];
                let (mut d, mut m) = ([0u16; GROUP], [0u16; GROUP]);
                for (j, block) in bytes.chunks_exact(size).enumerate() {
                    d[j] = u16::from_le_bytes([block[0], block[1]]);
                    m[j] = u16::from_le_bytes([block[2], block[3]]);
                    codes[j] = match F {
                        Q4_0 => nibbles(&block[2..]),
                        Q4_1 => nibbles(&block[4..]),
                        _ => _mm256_xor_si256(load32(&block[2..]), _mm256_set1_epi8(i8::MIN)),
                    };
                }
                // SAFETY: eight u16 each; unaligned loads.
                let (d, m) = unsafe {
                    (
                        _mm_loadu_si128(d.as_ptr().cast()),
                        _mm_loadu_si128(m.as_ptr().cast()),
                    )
                };
                let scales = _mm256_cvtph_ps(d);
                let offsets = match F {
                    Q4_1 => _mm256_cvtph_ps(m),
                    Q4_0 => _mm256_mul_ps(scales, _mm256_set1_ps(-8.0)),
                    _ => _mm256_mul_ps(scales, _mm256_set1_ps(-128.0)),
                };
                (codes, scales, offsets)
            }

            /// Eight Q8_0 blocks as `eight_blocks` gives them: `q + 128` as unsigned bytes
            /// (the sign bit flipped), `d`, and the offset `−128·d`.
            #[target_feature(enable = $features)]
            #[inline]
            fn q8_0_group(bytes: &[u8]) -> ([__m256i; 8], __m256, __m256) {
                let size = BlockFormat::Q8_0.row_bytes(BLOCK);
                let mut codes = [_mm256_setzero_si256(); GROUP];
                let mut d = [0u16; GROUP];
                for j in 0..GROUP {
                    let block = &bytes[size * j..size * (j + 1)];
                    d[j] = u16::from_le_bytes([block[0], block[1]]);
                    codes[j] = _mm256_xor_si256(load32(&block[2..]), _mm256_set1_epi8(i8::MIN));
                }
                // SAFETY: eight u16; unaligned load.
                let scales = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(d.as_ptr().cast()) });
                (codes, scales, _mm256_mul_ps(scales, _mm256_set1_ps(-128.0)))
            }

            /// The eight block sums `Σ q·x` of unsigned `codes` and 8-bit activations.
            #[target_feature(enable = $features)]
            #[inline]
            fn byte_sums(codes: &[__m256i; GROUP], xs: &[Q8Block]) -> __m256i {
                let xs = &xs[..GROUP];
                // SAFETY: `qs` is 32 bytes; unaligned loads.
                let p = std::array::from_fn(|j| {
                    dot_u8_i8(codes[j], unsafe {
                        _mm256_loadu_si256(xs[j].qs.as_ptr().cast())
                    })
                });
                reduce8(&p)
            }

            /// The same with 16-bit activations split into bytes: `Σ q·low + 256·Σ q·high`.
            #[target_feature(enable = $features)]
            #[inline]
            fn split_sums(codes: &[__m256i; GROUP], xs: &[SplitBlock]) -> __m256i {
                let xs = &xs[..GROUP];
                // SAFETY: `low` and `high` are 32 bytes; unaligned loads.
                let (low, high): ([__m256i; GROUP], [__m256i; GROUP]) = unsafe {
                    (
                        std::array::from_fn(|j| {
                            dot_u8_i8(codes[j], _mm256_loadu_si256(xs[j].low.as_ptr().cast()))
                        }),
                        std::array::from_fn(|j| {
                            dot_u8_i8(codes[j], _mm256_loadu_si256(xs[j].high.as_ptr().cast()))
                        }),
                    )
                };
                // Each block's `low + 256·high` per lane (exact: |Σ| ≤ 4·31·32639), then one
                // reduction instead of two.
                reduce8(&std::array::from_fn(|j| {
                    _mm256_add_epi32(low[j], _mm256_slli_epi32(high[j], 8))
                }))
            }

            /// The eight block sums of `codes` widened to i16 (`widened_codes`) and 16-bit
            /// activations.
            #[target_feature(enable = $features)]
            #[inline]
            fn wide_sums(wide: &[[__m256i; 2]; GROUP], xs: &[Q16Block]) -> __m256i {
                let xs = &xs[..GROUP];
                let p = std::array::from_fn(|j| {
                    let (low, high) = wide_halves(&xs[j]);
                    dot_i16(wide[j][0], low, wide[j][1], high)
                });
                reduce8(&p)
            }

            /// Unsigned byte codes as two vectors of 16 i16 each (element order).
            #[target_feature(enable = $features)]
            #[inline]
            fn widened_codes(codes: &[__m256i; GROUP]) -> [[__m256i; 2]; GROUP] {
                codes.map(|c| {
                    [
                        _mm256_cvtepu8_epi16(_mm256_castsi256_si128(c)),
                        _mm256_cvtepu8_epi16(_mm256_extracti128_si256(c, 1)),
                    ]
                })
            }

            /// Q4_K/Q5_K rows straight from their super-blocks: each super-block's values are
            /// unpacked into registers once and every token's eight blocks taken against them.
            #[target_feature(enable = $features)]
            fn rows_k4<const F: u8, const WIDE: bool, const TAIL: bool>(
                rows: &[u8],
                x: &QuantizedActivations,
                out: &mut [f32],
            ) {
                let t = x.tokens();
                let format = block_format(F);
                let (row_bytes, size) =
                    (format.row_bytes(x.cols()), format.row_bytes(GROUP * BLOCK));
                // A row that ends inside a group is first copied with zero blocks after it.
                let mut padded = vec![
                    0u8;
                    if TAIL {
                        row_bytes.next_multiple_of(size)
                    } else {
                        0
                    }
                ];
                // 16-bit activations: split into bytes for a token or two (no widening), with
                // the codes widened to i16 once per super-block for more (one i16 product a
                // pair of values instead of two byte products).
                let widen = WIDE && t >= WIDEN_FROM_TOKENS;
                let tokens: Vec<_> = (0..t)
                    .map(|t| {
                        (
                            x.blocks(t),
                            x.split_blocks(t),
                            x.wide_blocks(t),
                            x.scales(t),
                            x.d_sums(t),
                        )
                    })
                    .collect();
                if t == 1 {
                    // Decoding: the sums in registers, two chains of FMAs.
                    let (bytes, split, _, dx, dsum) = tokens[0];
                    for (row, out) in rows.chunks_exact(row_bytes).zip(out.iter_mut()) {
                        let (mut products, mut offset_sums) =
                            (_mm256_setzero_ps(), _mm256_setzero_ps());
                        let mut groups = row.chunks_exact(size);
                        for (s, block) in (&mut groups).enumerate() {
                            let group = eight_blocks::<F>(block);
                            let sums = token_sums::<WIDE>(&group, s * GROUP, bytes, split);
                            (products, offset_sums) = scaled::<WIDE>(
                                group,
                                sums,
                                s * GROUP,
                                dx,
                                dsum,
                                products,
                                offset_sums,
                            );
                        }
                        if TAIL {
                            // The last blocks, zero blocks after them (no copy of the row).
                            let group = last_blocks::<F>(groups.remainder());
                            let first = row_bytes / size * GROUP;
                            let sums = token_sums::<WIDE>(&group, first, bytes, split);
                            (products, offset_sums) =
                                scaled::<WIDE>(group, sums, first, dx, dsum, products, offset_sums);
                        }
                        *out = horizontal_sum(_mm256_add_ps(products, offset_sums));
                    }
                    return;
                }
                // Each token's products and offsets summed apart, as above (the same order:
                // a token's result does not depend on how many tokens came with it).
                let zero = _mm256_setzero_ps();
                let mut acc = vec![(zero, zero); t];
                for (row, out) in rows.chunks_exact(row_bytes).zip(out.chunks_exact_mut(t)) {
                    let row = if TAIL {
                        padded_row(row, &mut padded)
                    } else {
                        row
                    };
                    acc.fill((zero, zero));
                    for (s, block) in row.chunks_exact(size).enumerate() {
                        let (codes, scales, offsets) = eight_blocks::<F>(block);
                        let first = s * GROUP;
                        let wide = if widen {
                            widened_codes(&codes)
                        } else {
                            [[_mm256_setzero_si256(); 2]; GROUP]
                        };
                        for ((products, offset_sums), &(bytes, split, wide_x, dx, dsum)) in
                            acc.iter_mut().zip(&tokens)
                        {
                            let sums = if widen {
                                wide_sums(&wide, &wide_x[first..])
                            } else if WIDE {
                                split_sums(&codes, &split[first..])
                            } else {
                                byte_sums(&codes, &bytes[first..])
                            };
                            let scale = _mm256_mul_ps(scales, load8(&dx[first..]));
                            *products = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, *products);
                            *offset_sums =
                                _mm256_fmadd_ps(offsets, load8(&dsum[first..]), *offset_sums);
                        }
                    }
                    for (o, (products, offset_sums)) in out.iter_mut().zip(&acc) {
                        *o = horizontal_sum(_mm256_add_ps(*products, *offset_sums));
                    }
                }
            }

            /// A group's eight block sums `Σ q·x` against one token's blocks from `first`.
            #[target_feature(enable = $features)]
            #[inline]
            fn token_sums<const WIDE: bool>(
                group: &([__m256i; 8], __m256, __m256),
                first: usize,
                bytes: &[Q8Block],
                split: &[SplitBlock],
            ) -> __m256i {
                if WIDE {
                    split_sums(&group.0, &split[first..])
                } else {
                    byte_sums(&group.0, &bytes[first..])
                }
            }

            /// A group's block sums scaled (`d_w·d_x`) and its offsets (`off·d_x·Σx`) added to a
            /// token's two running sums.
            #[target_feature(enable = $features)]
            #[inline]
            fn scaled<const WIDE: bool>(
                (_, scales, offsets): ([__m256i; 8], __m256, __m256),
                sums: __m256i,
                first: usize,
                dx: &[f32],
                dsum: &[f32],
                products: __m256,
                offset_sums: __m256,
            ) -> (__m256, __m256) {
                let scale = _mm256_mul_ps(scales, load8(&dx[first..]));
                (
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, products),
                    _mm256_fmadd_ps(offsets, load8(&dsum[first..]), offset_sums),
                )
            }

            /// One Q6_K super-block: its eight blocks' 6-bit `q` (element order), its 16 i8
            /// scales (one per 16 values) and `d`.
            #[target_feature(enable = $features)]
            #[inline]
            fn q6_k_super_block(block: &[u8]) -> ([__m256i; 8], __m128i, f32) {
                let mask = |m: u8| _mm256_set1_epi8(m as i8);
                let low = |v: __m256i| _mm256_and_si256(v, mask(0x0f));
                let up = |v: __m256i| _mm256_and_si256(_mm256_srli_epi16(v, 4), mask(0x0f));
                let mut codes = [_mm256_setzero_si256(); SUPER_BLOCK / BLOCK];
                for h in 0..2 {
                    let ql0 = load32(&block[64 * h..]);
                    let ql1 = load32(&block[64 * h + 32..]);
                    let qh = load32(&block[128 + 32 * h..]);
                    // Bits 2k, 2k + 1 of qh moved to bits 4, 5 (masked first: no bit crosses
                    // into the neighbouring byte of a 16-bit shift).
                    codes[4 * h] = _mm256_or_si256(
                        low(ql0),
                        _mm256_slli_epi16(_mm256_and_si256(qh, mask(0x03)), 4),
                    );
                    codes[4 * h + 1] = _mm256_or_si256(
                        low(ql1),
                        _mm256_slli_epi16(_mm256_and_si256(qh, mask(0x0c)), 2),
                    );
                    codes[4 * h + 2] = _mm256_or_si256(up(ql0), _mm256_and_si256(qh, mask(0x30)));
                    codes[4 * h + 3] = _mm256_or_si256(
                        up(ql1),
                        _mm256_srli_epi16(_mm256_and_si256(qh, mask(0xc0)), 2),
                    );
                }
                let scales = &block[192..208];
                // SAFETY: 16 readable bytes; unaligned load.
                let scales = unsafe { _mm_loadu_si128(scales.as_ptr().cast()) };
                (codes, scales, half(block, 208))
            }

            /// The 16 scales as i32 in the order [`q6_k_block_sums`] leaves the half sums in:
            /// `[s0 s2 s4 s6 | s1 s3 s5 s7]` and `[s8 s10 s12 s14 | s9 s11 s13 s15]`.
            #[target_feature(enable = $features)]
            #[inline]
            fn q6_k_scales_by_half(scales: __m128i) -> [__m256i; 2] {
                let order = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
                let ordered = _mm_shuffle_epi8(scales, order);
                [
                    _mm256_cvtepi8_epi32(ordered),
                    _mm256_cvtepi8_epi32(_mm_srli_si128(ordered, 8)),
                ]
            }

            /// `Σ s·q·x` per block of a Q6_K super-block and 8-bit signed bytes `xs`, as eight
            /// i32 (lane `b`: block `b`): each block's byte products (four a lane: lanes 0–3
            /// its first 16 values, 4–7 its second), four blocks' lanes summed per 128-bit half
            /// ([`lane_sums_by_half`]: `[b0 b1 b2 b3 | b0 b1 b2 b3]`, first halves then second
            /// halves), each multiplied by its scale (`by_half`), then the two halves added. Exact: a half's sum is at most `16·63·128`, times 128.
            #[target_feature(enable = $features)]
            #[inline]
            fn q6_k_block_sums(
                codes: &[__m256i; GROUP],
                by_half: &[__m256i; 2],
                xs: [__m256i; GROUP],
            ) -> __m256i {
                let p: [__m256i; GROUP] = std::array::from_fn(|b| dot_u8_i8(codes[b], xs[b]));
                let first = _mm256_mullo_epi32(lane_sums_by_half(&p[..4]), by_half[0]);
                let last = _mm256_mullo_epi32(lane_sums_by_half(&p[4..]), by_half[1]);
                _mm256_add_epi32(
                    _mm256_permute2x128_si256(first, last, 0x20),
                    _mm256_permute2x128_si256(first, last, 0x31),
                )
            }

            /// Lane `b`: `32·(s[2b]·X[b][0] + s[2b + 1]·X[b][1])`, the part of block `b`'s sum
            /// that `q − 32` takes off `Σ s·q·x` (`X`: one byte plane's half sums of the
            /// super-block's eight blocks, from `first`; `scales`: the 16 scales as i16).
            #[target_feature(enable = $features)]
            #[inline]
            fn q6_k_offsets(scales: __m256i, half_sums: &[HalfSums], first: usize) -> __m256i {
                let half_sums = &half_sums[first..first + GROUP];
                // SAFETY: eight pairs of i16 (32 bytes); unaligned load.
                let xs = unsafe { _mm256_loadu_si256(half_sums.as_ptr().cast()) };
                _mm256_slli_epi32(_mm256_madd_epi16(scales, xs), 5)
            }

            /// A Q6_K super-block's eight block sums `Σ s·(q − 32)·x` as f32: with 8-bit
            /// activations' `bytes`, or (`WIDE`) with 16-bit ones `split` into bytes, from block
            /// `first`; `half_sums`: each byte plane's half sums (the offsets).
            #[target_feature(enable = $features)]
            #[inline]
            fn q6_k_sums<const WIDE: bool>(
                (codes, by_half, scales): (&[__m256i; GROUP], &[__m256i; 2], __m256i),
                bytes: &[Q8Block],
                split: &[SplitBlock],
                half_sums: [&[HalfSums]; 2],
                first: usize,
            ) -> __m256 {
                let load = |qs: &[i8; BLOCK]| {
                    // SAFETY: 32 bytes; unaligned load.
                    unsafe { _mm256_loadu_si256(qs.as_ptr().cast()) }
                };
                let plane = |sums: __m256i, p: usize| {
                    _mm256_sub_epi32(sums, q6_k_offsets(scales, half_sums[p], first))
                };
                if WIDE {
                    let split = &split[first..first + GROUP];
                    let low = q6_k_block_sums(
                        codes,
                        by_half,
                        std::array::from_fn(|j| load(&split[j].low)),
                    );
                    let high = q6_k_block_sums(
                        codes,
                        by_half,
                        std::array::from_fn(|j| load(&split[j].high)),
                    );
                    _mm256_fmadd_ps(
                        _mm256_cvtepi32_ps(plane(high, 1)),
                        _mm256_set1_ps(256.0),
                        _mm256_cvtepi32_ps(plane(low, 0)),
                    )
                } else {
                    let bytes = &bytes[first..first + GROUP];
                    let p = q6_k_block_sums(
                        codes,
                        by_half,
                        std::array::from_fn(|j| load(&bytes[j].qs)),
                    );
                    _mm256_cvtepi32_ps(plane(p, 0))
                }
            }

            /// Q6_K rows straight from their super-blocks (as `rows_k4`); each block's sum is
            /// scaled by `d·d_x` (its two scales are inside the integer sum).
            #[target_feature(enable = $features)]
            fn rows_q6_k<const WIDE: bool>(rows: &[u8], x: &QuantizedActivations, out: &mut [f32]) {
                let t = x.tokens();
                let format = BlockFormat::Q6K;
                let (row_bytes, size) =
                    (format.row_bytes(x.cols()), format.row_bytes(GROUP * BLOCK));
                // 16-bit activations always as split bytes, as for one token (weights widened
                // to i16 would sum a block's lanes in f32: a token's result would depend on T).
                let tokens: Vec<_> = (0..t)
                    .map(|t| {
                        (
                            x.blocks(t),
                            x.split_blocks(t),
                            x.scales(t),
                            [x.half_sums(t, 0), x.half_sums(t, 1)],
                        )
                    })
                    .collect();
                // Each token takes the row's super-blocks in turn, unpacking each itself (a
                // row is a few KB, in L1 for the second token; from eight tokens on the tile
                // kernel takes them): one place that unpacks and multiplies, so that the
                // compiler keeps the unpacked codes in registers (called from two places, the
                // sums were a call of their own, the codes passed through memory).
                for (row, out) in rows.chunks_exact(row_bytes).zip(out.chunks_exact_mut(t)) {
                    for (o, &(bytes, split, dx, half_sums)) in out.iter_mut().zip(&tokens) {
                        let mut acc = _mm256_setzero_ps();
                        for (s, block) in row.chunks_exact(size).enumerate() {
                            let (codes, scales, d) = q6_k_super_block(block);
                            let first = s * GROUP;
                            let by_half = q6_k_scales_by_half(scales);
                            let weights = (&codes, &by_half, _mm256_cvtepi8_epi16(scales));
                            let sums = q6_k_sums::<WIDE>(weights, bytes, split, half_sums, first);
                            let scale = _mm256_mul_ps(_mm256_set1_ps(d), load8(&dx[first..]));
                            acc = _mm256_fmadd_ps(sums, scale, acc);
                        }
                        *o = horizontal_sum(acc);
                    }
                }
            }

            /// A super-block's eight blocks of byte codes, as bytes.
            #[target_feature(enable = $features)]
            #[inline]
            fn code_bytes(codes: &[__m256i; GROUP]) -> [[u8; BLOCK]; GROUP] {
                let mut bytes = [[0u8; BLOCK]; GROUP];
                for (to, code) in bytes.iter_mut().zip(codes) {
                    // SAFETY: 32 writable bytes; unaligned store.
                    unsafe { _mm256_storeu_si256(to.as_mut_ptr().cast(), *code) };
                }
                bytes
            }

            /// A block's codes four at a time, each four repeated in every lane.
            #[target_feature(enable = $features)]
            #[inline]
            fn repeated_fours(codes: &[u8; BLOCK]) -> [__m256i; BLOCK / 4] {
                std::array::from_fn(|j| {
                    let four = &codes[4 * j..4 * j + 4];
                    // SAFETY: four readable bytes; an unaligned 32-bit load, repeated.
                    unsafe { _mm256_set1_epi32(std::ptr::read_unaligned(four.as_ptr().cast())) }
                })
            }

            /// Block `b`'s integer sums `Σ q·x` of `R` rows (their `fours`) over `k`-groups
            /// `js` (four values each) for the eight tokens of group `g`, plane `p`: each of the
            /// group's vectors is loaded once for all `R` rows. Four running sums in all, not one
            /// chain of dependent byte products (which waits out each one's latency); the sums
            /// are exact integers, so any order gives the same bits.
            #[target_feature(enable = $features)]
            #[inline]
            fn tile_plane_sums<const R: usize>(
                fours: &[[__m256i; BLOCK / 4]; R],
                x: &TokenGroups,
                g: usize,
                b: usize,
                p: usize,
                js: std::ops::Range<usize>,
            ) -> [__m256i; R] {
                // Per row `4 / R` running sums (the unused ones stay zero and fold away).
                let chains = (4 / R).max(1);
                let vectors = x.values(g, b, p);
                let mut sums = [[_mm256_setzero_si256(); 4]; R];
                for (i, j) in js.enumerate() {
                    // SAFETY: 32 bytes; unaligned load.
                    let xs = unsafe { _mm256_loadu_si256(vectors[j].as_ptr().cast()) };
                    for r in 0..R {
                        let c = i % chains;
                        sums[r][c] = dot_u8_i8_add(sums[r][c], fours[r][j], xs);
                    }
                }
                let mut out = [_mm256_setzero_si256(); R];
                for r in 0..R {
                    out[r] = _mm256_add_epi32(
                        _mm256_add_epi32(sums[r][0], sums[r][1]),
                        _mm256_add_epi32(sums[r][2], sums[r][3]),
                    );
                }
                out
            }

            /// The whole block's `Σ q·x` for `R` rows; with two planes (16-bit activations)
            /// `low + 256·high`.
            #[target_feature(enable = $features)]
            #[inline]
            fn tile_sums<const WIDE: bool, const R: usize>(
                fours: &[[__m256i; BLOCK / 4]; R],
                x: &TokenGroups,
                g: usize,
                b: usize,
            ) -> [__m256i; R] {
                let mut low = tile_plane_sums(fours, x, g, b, 0, 0..BLOCK / 4);
                if WIDE {
                    let high = tile_plane_sums(fours, x, g, b, 1, 0..BLOCK / 4);
                    for r in 0..R {
                        low[r] = _mm256_add_epi32(low[r], _mm256_slli_epi32(high[r], 8));
                    }
                }
                low
            }

            /// The eight tokens' results of one row: each token's per-lane sums (`products[k]`
            /// and `offsets[k]` hold lane k of the one-token kernels' two accumulators) added
            /// in `horizontal_sum`'s order, so that a token's result is the same bits whether it
            /// came alone or with others.
            #[target_feature(enable = $features)]
            #[inline]
            fn grouped_result(products: &[__m256; GROUP], offsets: &[__m256; GROUP]) -> __m256 {
                let v: [__m256; GROUP] =
                    std::array::from_fn(|k| _mm256_add_ps(products[k], offsets[k]));
                let a: [__m256; 4] = std::array::from_fn(|k| _mm256_add_ps(v[k], v[k + 4]));
                _mm256_add_ps(_mm256_add_ps(a[0], a[2]), _mm256_add_ps(a[1], a[3]))
            }

            /// Eight tokens' lanes of `acc` into `out` (`[rows, T]`, this row's T values).
            #[target_feature(enable = $features)]
            #[inline]
            fn store_group(acc: __m256, g: usize, out: &mut [f32]) {
                let mut lanes = [0.0f32; TOKEN_GROUP];
                // SAFETY: eight writable values; unaligned store.
                unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
                let first = g * TOKEN_GROUP;
                let n = (out.len() - first).min(TOKEN_GROUP);
                out[first..first + n].copy_from_slice(&lanes[..n]);
            }

            /// Rows of a format with blocks of eight times a prompt's tokens side by side
            /// ([`TokenGroups`]): each block's sum for eight tokens in one vector, no horizontal
            /// additions. `$tile_rows` rows at a time, so that each of the tokens' vectors, read
            /// from L2 when a prompt is long, serves that many rows' byte products; the last
            /// rows one at a time.
            #[target_feature(enable = $features)]
            fn rows_grouped<const F: u8, const WIDE: bool>(
                rows: &[u8],
                x: &QuantizedActivations,
                groups: &TokenGroups,
                out: &mut [f32],
            ) {
                const R: usize = $tile_rows;
                let t = x.tokens();
                let format = block_format(F);
                let row_bytes = format.row_bytes(x.cols());
                // Rows that end inside a group are copied, tile by tile, with zero blocks after
                // each (`stride` bytes a row).
                let stride = row_bytes.next_multiple_of(format.row_bytes(GROUP * BLOCK));
                let mut padded = vec![0u8; if stride == row_bytes { 0 } else { R * stride }];
                let zero = [[_mm256_setzero_ps(); GROUP]; R];
                let mut acc = vec![(zero, zero); groups.groups()];
                for (tile, out) in rows.chunks(R * row_bytes).zip(out.chunks_mut(R * t)) {
                    let tile = if padded.is_empty() {
                        tile
                    } else {
                        for (row, to) in tile.chunks_exact(row_bytes).zip(padded.chunks_mut(stride))
                        {
                            padded_row(row, to);
                        }
                        &padded[..tile.len() / row_bytes * stride]
                    };
                    if tile.len() == R * stride {
                        tile_of::<F, WIDE, R>(tile, stride, groups, &mut acc, out);
                    } else {
                        let zero = [[_mm256_setzero_ps(); GROUP]; 1];
                        let mut one = vec![(zero, zero); groups.groups()];
                        for (row, out) in tile.chunks_exact(stride).zip(out.chunks_exact_mut(t)) {
                            tile_of::<F, WIDE, 1>(row, stride, groups, &mut one, out);
                        }
                    }
                }
            }

            /// Per group of tokens, per row of a tile: lane k of the one-token kernel's two
            /// accumulators (products, offsets) for the group's eight tokens.
            type TileSums<const R: usize> = ([[__m256; GROUP]; R], [[__m256; GROUP]; R]);

            /// One tile of `R` rows (`tile`, `[R, row_bytes]`) times every group of tokens into
            /// `out` (`[R, T]`), in the format's kernel; `acc`: one [`TileSums`] a group.
            #[target_feature(enable = $features)]
            #[inline]
            fn tile_of<const F: u8, const WIDE: bool, const R: usize>(
                tile: &[u8],
                row_bytes: usize,
                groups: &TokenGroups,
                acc: &mut [TileSums<R>],
                out: &mut [f32],
            ) {
                let zero = [[_mm256_setzero_ps(); GROUP]; R];
                acc.fill((zero, zero));
                if F == Q6_K {
                    tile_grouped_q6_k::<WIDE, R>(tile, row_bytes, groups, acc);
                } else {
                    tile_grouped::<F, WIDE, R>(tile, row_bytes, groups, acc);
                }
                let t = out.len() / R;
                for (g, (products, offset_sums)) in acc.iter().enumerate() {
                    for r in 0..R {
                        let result = grouped_result(&products[r], &offset_sums[r]);
                        store_group(result, g, &mut out[r * t..(r + 1) * t]);
                    }
                }
            }

            /// [`tile_of`]'s sums for Q6_K: per plane, `Σ s·(q − 32)·x` in integers — each half
            /// block's `Σ q·x` less `32·Σ x`, times its scale, as the one-token kernel; no
            /// offsets.
            #[target_feature(enable = $features)]
            #[inline]
            fn tile_grouped_q6_k<const WIDE: bool, const R: usize>(
                tile: &[u8],
                row_bytes: usize,
                groups: &TokenGroups,
                acc: &mut [TileSums<R>],
            ) {
                let size = BlockFormat::Q6K.row_bytes(SUPER_BLOCK);
                let mut codes = [[[0u8; BLOCK]; GROUP]; R];
                let mut sc = [[0i8; 16]; R];
                let mut d = [_mm256_setzero_ps(); R];
                for s in 0..row_bytes / size {
                    for r in 0..R {
                        let (c, scales, dr) = q6_k_super_block(&tile[r * row_bytes + s * size..]);
                        codes[r] = code_bytes(&c);
                        // SAFETY: 16 writable bytes; unaligned store.
                        unsafe { _mm_storeu_si128(sc[r].as_mut_ptr().cast(), scales) };
                        d[r] = _mm256_set1_ps(dr);
                    }
                    for k in 0..GROUP {
                        let b = s * GROUP + k;
                        let mut fours = [[_mm256_setzero_si256(); BLOCK / 4]; R];
                        let mut half_scales = [[_mm256_setzero_si256(); 2]; R];
                        for r in 0..R {
                            fours[r] = repeated_fours(&codes[r][k]);
                            half_scales[r] = [
                                _mm256_set1_epi32(sc[r][2 * k] as i32),
                                _mm256_set1_epi32(sc[r][2 * k + 1] as i32),
                            ];
                        }
                        for (g, (products, _)) in acc.iter_mut().enumerate() {
                            let plane = |p: usize| {
                                let half_sums = groups.half_sums(g, b, p);
                                let mut scaled = [_mm256_setzero_si256(); R];
                                for (h, js) in [0..4, 4..8].into_iter().enumerate() {
                                    let sums = tile_plane_sums(&fours, groups, g, b, p, js);
                                    // SAFETY: eight i32; unaligned load.
                                    let xs =
                                        unsafe { _mm256_loadu_si256(half_sums[h].as_ptr().cast()) };
                                    let thirty_two = _mm256_slli_epi32(xs, 5);
                                    for r in 0..R {
                                        let centred = _mm256_sub_epi32(sums[r], thirty_two);
                                        let term = _mm256_mullo_epi32(centred, half_scales[r][h]);
                                        scaled[r] = if h == 0 {
                                            term
                                        } else {
                                            _mm256_add_epi32(scaled[r], term)
                                        };
                                    }
                                }
                                scaled
                            };
                            let low = plane(0);
                            let high = if WIDE { plane(1) } else { low };
                            // SAFETY: eight values; unaligned load.
                            let dx = unsafe { _mm256_loadu_ps(groups.scales(g, b).as_ptr()) };
                            for r in 0..R {
                                let sums = if WIDE {
                                    _mm256_fmadd_ps(
                                        _mm256_cvtepi32_ps(high[r]),
                                        _mm256_set1_ps(256.0),
                                        _mm256_cvtepi32_ps(low[r]),
                                    )
                                } else {
                                    _mm256_cvtepi32_ps(low[r])
                                };
                                let scale = _mm256_mul_ps(d[r], dx);
                                products[r][k] = _mm256_fmadd_ps(sums, scale, products[r][k]);
                            }
                        }
                    }
                }
            }

            /// [`tile_of`]'s sums for a format with an offset.
            #[target_feature(enable = $features)]
            #[inline]
            fn tile_grouped<const F: u8, const WIDE: bool, const R: usize>(
                tile: &[u8],
                row_bytes: usize,
                groups: &TokenGroups,
                acc: &mut [TileSums<R>],
            ) {
                let size = block_format(F).row_bytes(GROUP * BLOCK);
                let load = |v: &[f32; TOKEN_GROUP]| {
                    // SAFETY: eight values; unaligned load.
                    unsafe { _mm256_loadu_ps(v.as_ptr()) }
                };
                let mut codes = [[[0u8; BLOCK]; GROUP]; R];
                let mut sc = [[0.0f32; GROUP]; R];
                let mut off = [[0.0f32; GROUP]; R];
                for s in 0..row_bytes / size {
                    // Plain loops: closures and `array::map` here were left as calls.
                    for r in 0..R {
                        let block = &tile[r * row_bytes + s * size..];
                        let (c, scales, offsets) = eight_blocks::<F>(block);
                        codes[r] = code_bytes(&c);
                        // SAFETY: eight writable values each; unaligned stores.
                        unsafe {
                            _mm256_storeu_ps(sc[r].as_mut_ptr(), scales);
                            _mm256_storeu_ps(off[r].as_mut_ptr(), offsets);
                        }
                    }
                    for k in 0..GROUP {
                        let b = s * GROUP + k;
                        let mut fours = [[_mm256_setzero_si256(); BLOCK / 4]; R];
                        let mut scale_b = [_mm256_setzero_ps(); R];
                        let mut offset_b = [_mm256_setzero_ps(); R];
                        for r in 0..R {
                            fours[r] = repeated_fours(&codes[r][k]);
                            scale_b[r] = _mm256_set1_ps(sc[r][k]);
                            offset_b[r] = _mm256_set1_ps(off[r][k]);
                        }
                        for (g, (products, offset_sums)) in acc.iter_mut().enumerate() {
                            let sums = tile_sums::<WIDE, R>(&fours, groups, g, b);
                            let (dx, dsum) = (load(groups.scales(g, b)), load(groups.d_sums(g, b)));
                            for r in 0..R {
                                let scale = _mm256_mul_ps(scale_b[r], dx);
                                products[r][k] = _mm256_fmadd_ps(
                                    _mm256_cvtepi32_ps(sums[r]),
                                    scale,
                                    products[r][k],
                                );
                                offset_sums[r][k] =
                                    _mm256_fmadd_ps(offset_b[r], dsum, offset_sums[r][k]);
                            }
                        }
                    }
                }
            }

            /// Unpacks one Q8_0 row into `u`: each block's `|q|` and signs, or (16-bit
            /// activations, `WIDE`) its values widened to i16, and its `d`.
            #[target_feature(enable = $features)]
            fn unpack_q8_0<const WIDE: bool>(row: &[u8], u: &mut Unpacked) {
                let size = BlockFormat::Q8_0.row_bytes(BLOCK);
                for (b, block) in row.chunks_exact(size).enumerate() {
                    u.scales[b] = half(block, 0);
                    let raw = load32(&block[2..]);
                    if WIDE {
                        // Element order: the first 16 values, then the last 16.
                        let low = _mm256_castsi256_si128(raw);
                        let high = _mm256_extracti128_si256(raw, 1);
                        u.wide[b] = [_mm256_cvtepi8_epi16(low), _mm256_cvtepi8_epi16(high)];
                    } else {
                        u.signs[b] = raw;
                        u.bytes[b] = _mm256_sign_epi8(raw, raw);
                    }
                }
            }

            /// One unpacked Q8_0 row · one token's blocks (both padded to whole groups):
            /// `|w|` times `x·sign(w)`.
            #[target_feature(enable = $features)]
            fn dot_q8_0(u: &Unpacked, x: &QuantizedActivations, t: usize) -> f32 {
                let (xs, dx) = (x.blocks(t), x.scales(t));
                let mut acc = _mm256_setzero_ps();
                for g in (0..xs.len()).step_by(GROUP) {
                    let mut p = [_mm256_setzero_si256(); GROUP];
                    for (j, p) in p.iter_mut().enumerate() {
                        let b = g + j;
                        // SAFETY: `qs` is 32 bytes; unaligned load.
                        let x = unsafe { _mm256_loadu_si256(xs[b].qs.as_ptr().cast()) };
                        *p = dot_u8_i8(u.bytes[b], _mm256_sign_epi8(x, u.signs[b]));
                    }
                    let sums = _mm256_cvtepi32_ps(reduce8(&p));
                    let scale = _mm256_mul_ps(load8(&u.scales[g..]), load8(&dx[g..]));
                    acc = _mm256_fmadd_ps(sums, scale, acc);
                }
                horizontal_sum(acc)
            }

            /// One unpacked Q8_0 row · one token's 16-bit blocks.
            #[target_feature(enable = $features)]
            fn dot_q8_0_wide(u: &Unpacked, x: &QuantizedActivations, t: usize) -> f32 {
                let (xs, dx) = (x.wide_blocks(t), x.scales(t));
                let mut acc = _mm256_setzero_ps();
                for g in (0..xs.len()).step_by(GROUP) {
                    let mut p = [_mm256_setzero_si256(); GROUP];
                    for (j, p) in p.iter_mut().enumerate() {
                        let b = g + j;
                        let (low, high) = wide_halves(&xs[b]);
                        *p = dot_i16(u.wide[b][0], low, u.wide[b][1], high);
                    }
                    let sums = _mm256_cvtepi32_ps(reduce8(&p));
                    let scale = _mm256_mul_ps(load8(&u.scales[g..]), load8(&dx[g..]));
                    acc = _mm256_fmadd_ps(sums, scale, acc);
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

            /// Q8_0 rows through a row buffer (where the byte product saturates on `q + 128`).
            #[target_feature(enable = $features)]
            fn rows_q8_0<const WIDE: bool>(rows: &[u8], x: &QuantizedActivations, out: &mut [f32]) {
                let t = x.tokens();
                let padded = padded_blocks(x.cols());
                let zero = _mm256_setzero_si256();
                let mut u = Unpacked {
                    bytes: vec![zero; padded],
                    signs: vec![zero; padded],
                    wide: vec![[zero; 2]; if WIDE { padded } else { 0 }],
                    scales: vec![0.0; padded],
                };
                let row_bytes = BlockFormat::Q8_0.row_bytes(x.cols());
                for (row, out) in rows.chunks_exact(row_bytes).zip(out.chunks_exact_mut(t)) {
                    unpack_q8_0::<WIDE>(row, &mut u);
                    for (token, o) in out.iter_mut().enumerate() {
                        *o = if WIDE {
                            dot_q8_0_wide(&u, x, token)
                        } else {
                            dot_q8_0(&u, x, token)
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
                    // NF4 rows have kernels of their own (`nf4.rs`, picked before this one is).
                    (BlockFormat::F32 | BlockFormat::Nf4, _) => scalar::rows(format, rows, x, out),
                    (BlockFormat::Q8_0, false) if !EXACT_UNSIGNED_BYTES => {
                        rows_q8_0::<false>(rows, x, out)
                    }
                    (BlockFormat::Q8_0, true) if !EXACT_UNSIGNED_BYTES => {
                        rows_q8_0::<true>(rows, x, out)
                    }
                    (BlockFormat::Q4_0, false) => rows_by_groups::<Q4_0, false>(rows, x, out),
                    (BlockFormat::Q4_1, false) => rows_by_groups::<Q4_1, false>(rows, x, out),
                    (BlockFormat::Q8_0, false) => rows_by_groups::<Q8_0, false>(rows, x, out),
                    (BlockFormat::Q4K, false) => rows_by_groups::<Q4_K, false>(rows, x, out),
                    (BlockFormat::Q5K, false) => rows_by_groups::<Q5_K, false>(rows, x, out),
                    (BlockFormat::Q6K, false) => rows_by_groups::<Q6_K, false>(rows, x, out),
                    (BlockFormat::Q4_0, true) => rows_by_groups::<Q4_0, true>(rows, x, out),
                    (BlockFormat::Q4_1, true) => rows_by_groups::<Q4_1, true>(rows, x, out),
                    (BlockFormat::Q8_0, true) => rows_by_groups::<Q8_0, true>(rows, x, out),
                    (BlockFormat::Q4K, true) => rows_by_groups::<Q4_K, true>(rows, x, out),
                    (BlockFormat::Q5K, true) => rows_by_groups::<Q5_K, true>(rows, x, out),
                    (BlockFormat::Q6K, true) => rows_by_groups::<Q6_K, true>(rows, x, out),
                }
            }

            /// Rows read eight blocks at a time (a last partial group padded with zero
            /// blocks): a prompt's tokens side by side, else one token at a time.
            #[target_feature(enable = $features)]
            fn rows_by_groups<const F: u8, const WIDE: bool>(
                rows: &[u8],
                x: &QuantizedActivations,
                out: &mut [f32],
            ) {
                match x.token_groups() {
                    Some(groups) => rows_grouped::<F, WIDE>(rows, x, groups, out),
                    None if F == Q6_K => rows_q6_k::<WIDE>(rows, x, out),
                    // Rows that end inside a group: a separate kernel, so that the whole
                    // groups' loop is the same code as without one.
                    None if (x.cols() / BLOCK).is_multiple_of(GROUP) => {
                        rows_k4::<F, WIDE, false>(rows, x, out)
                    }
                    None => rows_k4::<F, WIDE, true>(rows, x, out),
                }
            }
        }
    };
}

kernels!(
    avx2,
    "avx2,fma,f16c",
    1,
    false,
    |w, x| _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)),
    |acc, w, x| _mm256_add_epi32(
        acc,
        _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1))
    ),
    |wl, xl, wh, xh| _mm256_add_epi32(_mm256_madd_epi16(wl, xl), _mm256_madd_epi16(wh, xh))
);

kernels!(
    vnni,
    "avx2,fma,f16c,avx512vnni,avx512vl",
    2,
    true,
    |w, x| _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x),
    |acc, w, x| _mm256_dpbusd_epi32(acc, w, x),
    |wl, xl, wh, xh| _mm256_dpwssd_epi32(
        _mm256_dpwssd_epi32(_mm256_setzero_si256(), wl, xl),
        wh,
        xh
    )
);

/// Values per block (the kernels assume 32).
const _: () = assert!(BLOCK == 32);
