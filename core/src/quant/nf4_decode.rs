//! Packed NF4 codes to values through a 16-entry table: the inner loop of dequantization.
//!
//! Each byte holds two codes, the first value in the high nibble. The plain loop does two
//! table loads and two stores per byte; on x86-64 with AVX2 eight values come from one
//! vector step: the nibbles are spread to eight 32-bit lanes, each half of the table is
//! permuted by the code's low three bits, and the code's fourth bit picks the half. With
//! AVX-512 the whole 16-entry codebook sits in one register: sixteen values a step, one
//! permute, then the block's scale ([`decode_blocks`]).

/// A decoder: `out[2i] = table[bytes[i] >> 4]`, `out[2i + 1] = table[bytes[i] & 0xf]`; an
/// odd-length `out` ends with the high nibble of its last byte. `bytes` holds at least
/// `out.len().div_ceil(2)` bytes.
pub(crate) type Decode = fn(&[f32; 16], &[u8], &mut [f32]);

/// The fastest decoder this CPU runs (asked once per dequantization, not per block).
pub(crate) fn decoder() -> Decode {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        return decode_with_avx2;
    }
    decode_plain
}

/// Decodes consecutive blocks: `out[b·bs + i] = codebook[code(b·bs + i)] · scales[b]` for
/// `bs = block_size` (even), `out.len()` a multiple of it, one scale per block, the codes
/// packed as [`Decode`] reads them. The same products as a per-block table `codebook · scale`
/// (one f32 multiply each), so every value is bit-identical to [`decoder`]'s.
pub(crate) fn decode_blocks(
    codebook: &[f32; 16],
    scales: &[f32],
    block_size: usize,
    bytes: &[u8],
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if block_size.is_multiple_of(16) && std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F detected just above.
        unsafe { avx512::decode_blocks(codebook, scales, block_size, bytes, out) };
        return;
    }
    let decode = decoder();
    for ((block, &scale), codes) in out
        .chunks_mut(block_size)
        .zip(scales)
        .zip(bytes.chunks(block_size / 2))
    {
        let table: [f32; 16] = std::array::from_fn(|c| codebook[c] * scale);
        decode(&table, codes, block);
    }
}

/// [`decoder`]'s choice on AVX2 machines: the vector loop, then the plain one for the tail.
#[cfg(target_arch = "x86_64")]
fn decode_with_avx2(table: &[f32; 16], bytes: &[u8], out: &mut [f32]) {
    // SAFETY: `decoder` hands this function out only after detecting AVX2.
    let done = unsafe { avx2::decode(table, bytes, out) };
    decode_plain(table, &bytes[done / 2..], &mut out[done..]);
}

/// The portable loop.
fn decode_plain(table: &[f32; 16], bytes: &[u8], out: &mut [f32]) {
    let len = out.len();
    let mut pairs = out.chunks_exact_mut(2);
    for (pair, &byte) in (&mut pairs).zip(bytes) {
        pair[0] = table[usize::from(byte >> 4)];
        pair[1] = table[usize::from(byte & 0x0f)];
    }
    if let [last] = pairs.into_remainder() {
        *last = table[usize::from(bytes[len / 2] >> 4)];
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// Decodes whole groups of eight values (four bytes) and returns how many values it wrote.
    #[target_feature(enable = "avx2")]
    pub(super) fn decode(table: &[f32; 16], bytes: &[u8], out: &mut [f32]) -> usize {
        let groups = (out.len() / 8).min(bytes.len() / 4);
        // SAFETY: `table` holds 16 floats, read as two unaligned groups of 8.
        let (low_half, high_half) = unsafe {
            (
                _mm256_loadu_ps(table.as_ptr()),
                _mm256_loadu_ps(table.as_ptr().add(8)),
            )
        };
        // Lane 2k takes its byte's high nibble, lane 2k + 1 the low one.
        let shifts = _mm256_setr_epi32(4, 0, 4, 0, 4, 0, 4, 0);
        let nibble = _mm256_set1_epi32(0x0f);
        for (group, four) in out
            .chunks_exact_mut(8)
            .zip(bytes.chunks_exact(4))
            .take(groups)
        {
            let word = u32::from_le_bytes([four[0], four[1], four[2], four[3]]);
            let packed = _mm_cvtsi32_si128(word as i32);
            let doubled = _mm_unpacklo_epi8(packed, packed); // b0 b0 b1 b1 b2 b2 b3 b3
            let lanes = _mm256_cvtepu8_epi32(doubled);
            let codes = _mm256_and_si256(_mm256_srlv_epi32(lanes, shifts), nibble);
            let from_low = _mm256_permutevar8x32_ps(low_half, codes);
            let from_high = _mm256_permutevar8x32_ps(high_half, codes);
            // The code's bit 3 moved to the sign bit: blendv's selector.
            let upper = _mm256_castsi256_ps(_mm256_slli_epi32::<28>(codes));
            let values = _mm256_blendv_ps(from_low, from_high, upper);
            // SAFETY: `group` is 8 floats.
            unsafe { _mm256_storeu_ps(group.as_mut_ptr(), values) };
        }
        groups * 8
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// [`super::decode_blocks`] for a block size that is a multiple of 16.
    #[target_feature(enable = "avx512f")]
    pub(super) fn decode_blocks(
        codebook: &[f32; 16],
        scales: &[f32],
        block_size: usize,
        bytes: &[u8],
        out: &mut [f32],
    ) {
        assert!(block_size.is_multiple_of(16) && out.len() <= scales.len() * block_size);
        assert!(bytes.len() * 2 >= out.len());
        // SAFETY: `codebook` holds 16 floats; unaligned load.
        let table = unsafe { _mm512_loadu_ps(codebook.as_ptr()) };
        // Lane 2k takes byte k's high nibble, lane 2k + 1 its low one.
        let shifts = _mm512_set_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
        let nibble = _mm512_set1_epi32(0x0f);
        for ((block, &scale), codes) in out
            .chunks_exact_mut(block_size)
            .zip(scales)
            .zip(bytes.chunks_exact(block_size / 2))
        {
            let scale = _mm512_set1_ps(scale);
            for (sixteen, eight) in block.chunks_exact_mut(16).zip(codes.chunks_exact(8)) {
                let word = u64::from_le_bytes(eight.try_into().expect("8 bytes"));
                let packed = _mm_cvtsi64_si128(word as i64);
                let doubled = _mm_unpacklo_epi8(packed, packed); // b0 b0 b1 b1 … b7 b7
                let lanes = _mm512_cvtepu8_epi32(doubled);
                let codes = _mm512_and_si512(_mm512_srlv_epi32(lanes, shifts), nibble);
                let values = _mm512_mul_ps(_mm512_permutexvar_ps(codes, table), scale);
                // SAFETY: `sixteen` is 16 floats; unaligned store.
                unsafe { _mm512_storeu_ps(sixteen.as_mut_ptr(), values) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{decode_blocks, decode_plain, decoder};

    /// Whole blocks (sizes 16, 64, 128; one to five blocks) through [`decode_blocks`] (the
    /// AVX-512 loop where the CPU has it) equal a per-block table `codebook · scale` through the
    /// plain loop, bit for bit.
    #[test]
    fn block_decoding_equals_per_block_tables() {
        let codebook: [f32; 16] = std::array::from_fn(|i| (i as f32 - 7.3) / 7.7);
        let bytes: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
        for block_size in [16usize, 64, 128] {
            for blocks in 1..=5 {
                let scales: Vec<f32> = (0..blocks).map(|b| 0.37 + b as f32 * 1.91).collect();
                let len = block_size * blocks;
                let mut fast = vec![f32::NAN; len];
                decode_blocks(&codebook, &scales, block_size, &bytes, &mut fast);
                let mut plain = vec![f32::NAN; len];
                for (b, block) in plain.chunks_mut(block_size).enumerate() {
                    let table: [f32; 16] = std::array::from_fn(|c| codebook[c] * scales[b]);
                    decode_plain(&table, &bytes[b * block_size / 2..], block);
                }
                assert_eq!(
                    fast.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    plain.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "block size {block_size}, {blocks} blocks"
                );
            }
        }
    }

    /// Every byte value, in runs of every length up to 40 (odd ones included), through the
    /// dispatching decoder (the AVX2 loop where the CPU has it) against the plain loop and
    /// against the nibbles read by hand.
    #[test]
    fn vector_and_plain_loops_agree_with_the_nibbles() {
        let table: [f32; 16] = std::array::from_fn(|i| i as f32 * 1.5 - 7.0);
        let bytes: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
        for start in [0usize, 3, 100] {
            for len in 0..=40 {
                let source = &bytes[start..];
                let mut fast = vec![f32::NAN; len];
                let mut plain = vec![f32::NAN; len];
                decoder()(&table, source, &mut fast);
                decode_plain(&table, source, &mut plain);
                let by_hand: Vec<f32> = (0..len)
                    .map(|i| {
                        let byte = source[i / 2];
                        let code = if i % 2 == 0 { byte >> 4 } else { byte & 0x0f };
                        table[usize::from(code)]
                    })
                    .collect();
                assert_eq!(fast, by_hand, "start {start}, len {len}");
                assert_eq!(plain, by_hand, "start {start}, len {len}");
            }
        }
    }
}
