//! f32 → ggml blocks, for writing GGUF files: F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q5_1 and the
//! K-quants Q4_K, Q5_K and Q6_K (`quantize_k`), each as llama.cpp's reference quantizer
//! (`quantize_row_*_ref`, what its quantizer runs without an importance matrix) computes it:
//! the blocks equal llama.cpp's bit for bit (`tests/corpus/ggml`).

use half::{bf16, f16};

use super::dequant::GgmlType;
use super::quantize_k;

/// The bytes of `values` as `ggml_type` blocks. `values.len()` must be a multiple of the
/// type's block length (the caller picks a type that fits the row).
pub fn quantize(ggml_type: GgmlType, values: &[f32]) -> Result<Vec<u8>, String> {
    let (per_block, bytes_per_block) = ggml_type
        .block()
        .ok_or_else(|| format!("ggml type {ggml_type:?} cannot be written"))?;
    let per_block = per_block as usize;
    if !values.len().is_multiple_of(per_block) {
        return Err(format!(
            "{} values are not whole {ggml_type:?} blocks of {per_block}",
            values.len()
        ));
    }
    let mut out = Vec::with_capacity(values.len() / per_block * bytes_per_block as usize);
    match ggml_type {
        GgmlType::F32 => values.iter().for_each(|v| out.extend(v.to_le_bytes())),
        GgmlType::F16 => values
            .iter()
            .for_each(|&v| out.extend(f16::from_f32(v).to_le_bytes())),
        GgmlType::Bf16 => values
            .iter()
            .for_each(|&v| out.extend(bf16::from_f32(v).to_le_bytes())),
        GgmlType::Q8_0 => values.chunks_exact(32).for_each(|b| q8_0(b, &mut out)),
        GgmlType::Q4_0 => values.chunks_exact(32).for_each(|b| q4_0(b, &mut out)),
        GgmlType::Q5_0 => values.chunks_exact(32).for_each(|b| q5_0(b, &mut out)),
        GgmlType::Q5_1 => values.chunks_exact(32).for_each(|b| q5_1(b, &mut out)),
        GgmlType::Q4K => values
            .chunks_exact(256)
            .for_each(|b| quantize_k::q4_k(b, &mut out)),
        GgmlType::Q5K => values
            .chunks_exact(256)
            .for_each(|b| quantize_k::q5_k(b, &mut out)),
        GgmlType::Q6K => values
            .chunks_exact(256)
            .for_each(|b| quantize_k::q6_k(b, &mut out)),
        other => return Err(format!("napkin does not write {other:?}")),
    }
    Ok(out)
}

/// d = max|x| / 127, q = round(x / d) (half away from zero), d stored as f16.
fn q8_0(block: &[f32], out: &mut Vec<u8>) {
    let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out.extend(f16::from_f32(d).to_le_bytes());
    out.extend(block.iter().map(|&x| (x * id).round() as i8 as u8));
}

/// d = (the value of largest magnitude) / −8, q = min(15, trunc(x / d + 8.5)); elements
/// 0..16 in the low nibbles, 16..32 in the high ones.
fn q4_0(block: &[f32], out: &mut Vec<u8>) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in block {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out.extend(f16::from_f32(d).to_le_bytes());
    let q = |x: f32| ((x * id + 8.5) as u8).min(15);
    out.extend((0..16).map(|j| q(block[j]) | (q(block[j + 16]) << 4)));
}

/// d = (the value of largest magnitude) / −16, q = min(31, trunc(x / d + 16.5)); the low four
/// bits as Q4_0 packs them, the fifth bits in a u32 (bit j for element j).
fn q5_0(block: &[f32], out: &mut Vec<u8>) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in block {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -16.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let q = |x: f32| ((x * id + 16.5) as i8).min(31) as u8;
    five_bits(d, None, block.iter().map(|&x| q(x)), out);
}

/// d = (max − min) / 31, m = min, q = trunc((x − min) / d + 0.5).
fn q5_1(block: &[f32], out: &mut Vec<u8>) {
    let min = block
        .iter()
        .fold(f32::MAX, |m, &v| if v < m { v } else { m });
    let max = block
        .iter()
        .fold(-f32::MAX, |m, &v| if v > m { v } else { m });
    let d = (max - min) / 31.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let q = |x: f32| ((x - min) * id + 0.5) as u8;
    five_bits(d, Some(min), block.iter().map(|&x| q(x)), out);
}

/// A Q5_0 or Q5_1 block: f16 d (and f16 m), the u32 of fifth bits, 16 bytes of low nibbles
/// (elements 0..16 low, 16..32 high).
fn five_bits(d: f32, m: Option<f32>, levels: impl Iterator<Item = u8>, out: &mut Vec<u8>) {
    let levels: Vec<u8> = levels.collect();
    out.extend(f16::from_f32(d).to_le_bytes());
    if let Some(m) = m {
        out.extend(f16::from_f32(m).to_le_bytes());
    }
    let high = (0..32).fold(0u32, |h, j| h | (u32::from(levels[j] >> 4 & 1) << j));
    out.extend(high.to_le_bytes());
    out.extend((0..16).map(|j| (levels[j] & 0x0f) | ((levels[j + 16] & 0x0f) << 4)));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seeded(n: usize, seed: u64) -> Vec<f32> {
        let mut state = seed;
        (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2
            })
            .collect()
    }

    fn rms(a: &[f32], b: &[f32]) -> f32 {
        (a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum::<f32>() / a.len() as f32).sqrt()
    }

    #[test]
    fn each_type_decodes_close_to_its_input() {
        let x = seeded(4096, 3);
        let scale = rms(&x, &vec![0.0; x.len()]);
        // Relative RMS error bounds: 8 bits ≈ 1/250, 4 bits ≈ 1/15 of the range.
        for (t, bound) in [
            (GgmlType::F16, 1e-3),
            (GgmlType::Bf16, 5e-3),
            (GgmlType::Q8_0, 0.01),
            (GgmlType::Q4_0, 0.12),
            (GgmlType::Q5_0, 0.06),
            (GgmlType::Q5_1, 0.06),
            (GgmlType::Q4K, 0.12),
            (GgmlType::Q5K, 0.06),
            (GgmlType::Q6K, 0.03),
        ] {
            let bytes = quantize(t, &x).unwrap();
            let back = t.dequantize(&bytes, x.len()).unwrap();
            let err = rms(&back, &x) / scale;
            assert!(err < bound, "{t:?}: relative RMS error {err}");
        }
    }

    /// On weight-like (Gaussian) values the searched K-quant groups beat the plain blocks of the
    /// same bits, and each bit more helps (RMS errors printed).
    #[test]
    fn k_quants_beat_the_plain_blocks_on_gaussian_weights() {
        let mut state = 7u64;
        let mut gaussian = || {
            let mut sum = 0.0f32;
            for _ in 0..12 {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                sum += (state >> 40) as f32 / (1u64 << 24) as f32;
            }
            (sum - 6.0) * 0.02
        };
        let x: Vec<f32> = (0..256 * 64).map(|_| gaussian()).collect();
        let error = |t: GgmlType| {
            let back = t.dequantize(&quantize(t, &x).unwrap(), x.len()).unwrap();
            rms(&back, &x)
        };
        let [q4_0, q4_k, q5_0, q5_k, q6_k, q8_0] = [
            GgmlType::Q4_0,
            GgmlType::Q4K,
            GgmlType::Q5_0,
            GgmlType::Q5K,
            GgmlType::Q6K,
            GgmlType::Q8_0,
        ]
        .map(error);
        eprintln!(
            "RMS error: Q4_0 {q4_0:.3e}, Q4_K {q4_k:.3e}, Q5_0 {q5_0:.3e}, Q5_K {q5_k:.3e}, \
             Q6_K {q6_k:.3e}, Q8_0 {q8_0:.3e}"
        );
        assert!(q4_k < 0.9 * q4_0, "Q4_K {q4_k} vs Q4_0 {q4_0}");
        assert!(q5_k < 0.9 * q5_0, "Q5_K {q5_k} vs Q5_0 {q5_0}");
        assert!(q5_k < q4_k && q6_k < q5_k && q8_0 < q6_k);
    }

    #[test]
    fn partial_blocks_are_refused() {
        assert!(quantize(GgmlType::Q8_0, &[0.0; 33]).is_err());
        assert!(quantize(GgmlType::Q6K, &[0.0; 300]).is_err());
        assert!(quantize(GgmlType::Q2K, &[0.0; 256]).is_err());
    }
}
