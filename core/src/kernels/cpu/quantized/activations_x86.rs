//! The activations' quantization (`activations.rs`) with AVX2: a block of 32 values as four
//! vectors — its largest magnitude, the rounded values, their sums and byte planes — giving the
//! same integers and scales as the portable code, bit for bit (`kernels::cpu::quantized::tests`).
//!
//! Every product's input is quantized by one thread while the others wait for the product
//! (`model/quantized_llama.rs`), so this is serial time in each decoding step: the portable
//! code took ~2.7 ns a value at 16 bits (a 1.1B model's decode quantizes ~260,000 values a
//! token).

use std::arch::x86_64::*;

use super::BLOCK;
use super::activations::{HalfSums, Q8Block, Q16Block, SplitBlock, WIDE_MAX};

/// A block's rounded values `q = round(x / d)` (ties away from zero, NaN as 0, clamped to
/// `±max`) in element order, and `d = max|x| / max`: the portable `rounded_values`.
///
/// # Panics
/// If `x` holds fewer than 32 values (a bug in the caller).
#[target_feature(enable = "avx2")]
fn rounded_block(x: &[f32], max: f32) -> ([__m256i; 4], f32) {
    assert!(x.len() >= BLOCK);
    // SAFETY: 32 readable values (checked above); unaligned loads.
    let v: [__m256; 4] = std::array::from_fn(|i| unsafe { _mm256_loadu_ps(x.as_ptr().add(8 * i)) });
    let magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    // `vmaxps` returns its second operand when either is NaN: a NaN value is passed over, as
    // `f32::max` passes it over in the portable fold (the running maxima are never NaN).
    let mut largest = _mm256_setzero_ps();
    for &vi in &v {
        largest = _mm256_max_ps(_mm256_and_ps(vi, magnitude), largest);
    }
    let four = _mm_max_ps(
        _mm256_castps256_ps128(largest),
        _mm256_extractf128_ps(largest, 1),
    );
    let two = _mm_max_ps(four, _mm_movehl_ps(four, four));
    let amax = _mm_cvtss_f32(_mm_max_ss(two, _mm_shuffle_ps(two, two, 1)));
    let d = amax / max;
    let inverse = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
    let (high, low) = (_mm256_set1_ps(max), _mm256_set1_ps(-max));
    let (half, minus_half) = (_mm256_set1_ps(0.5), _mm256_set1_ps(-0.5));
    let q = v.map(|vi| {
        let y = _mm256_mul_ps(vi, inverse);
        let y = _mm256_and_ps(y, _mm256_cmp_ps::<_CMP_ORD_Q>(y, y)); // NaN → 0
        let y = _mm256_min_ps(high, _mm256_max_ps(low, y));
        // Truncation, then one step where the dropped fraction is at least a half (exact).
        let truncated = _mm256_cvttps_epi32(y);
        let fraction = _mm256_sub_ps(y, _mm256_cvtepi32_ps(truncated));
        let up = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GE_OQ>(fraction, half));
        let down = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(fraction, minus_half));
        // A true compare is −1: subtracting it adds one.
        _mm256_add_epi32(_mm256_sub_epi32(truncated, up), down)
    });
    (q, d)
}

/// The sum of the eight i32 lanes of `a + b`.
#[target_feature(enable = "avx2")]
fn lane_sum(a: __m256i, b: __m256i) -> i32 {
    let v = _mm256_add_epi32(a, b);
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 1)))
}

/// 32 i32 values within `−128..=127` as bytes, in element order: two saturating packs leave
/// 4-value runs interleaved (`[q0 q1 q2 q3]` of each 128-bit half), put back in order by one
/// 32-bit permutation.
#[target_feature(enable = "avx2")]
fn bytes_of(q: &[__m256i; 4]) -> [i8; BLOCK] {
    let words = _mm256_packs_epi16(
        _mm256_packs_epi32(q[0], q[1]),
        _mm256_packs_epi32(q[2], q[3]),
    );
    let ordered = _mm256_permutevar8x32_epi32(words, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    let mut bytes = [0i8; BLOCK];
    // SAFETY: 32 writable bytes; unaligned store.
    unsafe { _mm256_storeu_si256(bytes.as_mut_ptr().cast(), ordered) };
    bytes
}

/// 16 i32 values within i16 as i16, in element order (a pack, then its 64-bit runs reordered).
#[target_feature(enable = "avx2")]
fn words_of(a: __m256i, b: __m256i) -> __m256i {
    _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(a, b))
}

/// [`super::activations`]' 8-bit block: the block and its half sums.
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn quantize_block(x: &[f32]) -> (Q8Block, HalfSums) {
    let (q, d) = rounded_block(x, 127.0);
    let (first, second) = (lane_sum(q[0], q[1]), lane_sum(q[2], q[3]));
    let sum = first + second;
    let block = Q8Block {
        qs: bytes_of(&q),
        d,
        sum,
        d_sum: d * sum as f32,
    };
    (block, [first as i16, second as i16])
}

/// [`super::activations`]' 16-bit block: the values, their byte planes (`high = ⌊(q +
/// 128)/256⌋`, `low = q − 256·high`), `d`, `Σq` and each plane's half sums.
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn quantize_wide(x: &[f32]) -> (Q16Block, SplitBlock, f32, i32, [HalfSums; 2]) {
    let (q, d) = rounded_block(x, WIDE_MAX as f32);
    let high = q.map(|v| _mm256_srai_epi32::<8>(_mm256_add_epi32(v, _mm256_set1_epi32(128))));
    let low: [__m256i; 4] =
        std::array::from_fn(|i| _mm256_sub_epi32(q[i], _mm256_slli_epi32::<8>(high[i])));
    let all = [lane_sum(q[0], q[1]), lane_sum(q[2], q[3])];
    let highs = [lane_sum(high[0], high[1]), lane_sum(high[2], high[3])];
    let mut qs = [0i16; BLOCK];
    // SAFETY: 32 writable i16 (64 bytes); unaligned stores.
    unsafe {
        _mm256_storeu_si256(qs.as_mut_ptr().cast(), words_of(q[0], q[1]));
        _mm256_storeu_si256(qs.as_mut_ptr().add(16).cast(), words_of(q[2], q[3]));
    }
    let split = SplitBlock {
        low: bytes_of(&low),
        high: bytes_of(&high),
    };
    let half_sums = [
        [
            (all[0] - 256 * highs[0]) as i16,
            (all[1] - 256 * highs[1]) as i16,
        ],
        [highs[0] as i16, highs[1] as i16],
    ];
    (Q16Block { qs }, split, d, all[0] + all[1], half_sums)
}
