//! The K-quant super-blocks (256 values) as llama.cpp's reference quantizers make them
//! (`quantize_row_q{4,5,6}_K_ref` in ggml-quants.c, which its quantizer uses without an
//! importance matrix), written from their algorithm: the same searches, in f32, in the same
//! order of operations, so the blocks equal llama.cpp's bit for bit (checked against its
//! quantizer's output in `tests/corpus/ggml`).
//!
//! - Q4_K and Q5_K: eight groups of 32, x ≈ d·sc·q − dmin·m. Each group's step and offset are
//!   searched ([`fit_with_offset`]), weighting each value by the group's RMS plus its own
//!   magnitude; the 6-bit sc and m then express them against the super-block's d and dmin.
//! - Q6_K: sixteen groups of 16, x ≈ d·sc·(q − 32) with an 8-bit sc ([`fit_symmetric`]).

use half::f16;

/// llama.cpp's `nearest_int`: round half to even, through the float's mantissa (exact for
/// |v| < 2²²; the levels and scales rounded here are far smaller).
fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12_582_912.0f32).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

/// A group's step and offset for x ≈ step·l − offset, l in 0..=nmax (`make_qkx2_quants`): the
/// levels of the min/max range first, then `nstep + 1` steps around it, each refitted by
/// weighted least squares (the offset kept ≥ 0), the one of smallest weighted squared error
/// kept. Writes the chosen levels into `levels`; returns (step, offset).
fn fit_with_offset(
    x: &[f32],
    weights: &[f32],
    nmax: i32,
    (rmin, rdelta, nstep): (f32, f32, i32),
    levels: &mut [u8],
) -> (f32, f32) {
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for (&v, &w) in x.iter().zip(weights).skip(1) {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
        sum_w += w;
        sum_x += w * v;
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        levels.fill(0);
        return (0.0, -min);
    }
    // `min` moves to each better fit's offset, and the later steps are taken from there (as
    // llama.cpp's search does).
    let level = |iscale: f32, v: f32, min: f32| nearest_int(iscale * (v - min)).clamp(0, nmax);
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for ((l, &v), &w) in levels.iter_mut().zip(x).zip(weights) {
        *l = level(iscale, v, min) as u8;
        let diff = scale * *l as f32 + min - v;
        best_error += w * (diff * diff);
    }
    let mut aux = [0u8; 32];
    let aux = &mut aux[..x.len()];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for ((a, &v), &w) in aux.iter_mut().zip(x).zip(weights) {
            let l = level(iscale, v, min);
            *a = l as u8;
            let l = l as f32;
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * v;
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut error = 0.0f32;
            for ((&a, &v), &w) in aux.iter().zip(x).zip(weights) {
                let diff = this_scale * a as f32 + this_min - v;
                error += w * (diff * diff);
            }
            if error < best_error {
                levels.copy_from_slice(aux);
                best_error = error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// A group's signed step for x ≈ step·(l − nmax), l in 0..2·nmax (`make_qx_quants` with its
/// x² weights): the step of the largest magnitude and 18 around it, the one that explains the
/// most weighted variance kept. Writes the levels (offset by nmax) into `levels`.
fn fit_symmetric(x: &[f32], nmax: i32, levels: &mut [u8]) -> f32 {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < 1e-15 {
        levels.fill(0);
        return 0.0;
    }
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let sums = |iscale: f32| {
        x.iter().fold((0.0f32, 0.0f32), |(lx, l2), &v| {
            let (w, l) = (v * v, level(iscale, v) as f32);
            (lx + w * v * l, l2 + w * l * l)
        })
    };
    let mut iscale = -(nmax as f32) / max;
    for (l, &v) in levels.iter_mut().zip(x) {
        *l = (level(iscale, v) + nmax) as u8;
    }
    let (sum_lx, sum_l2) = sums(iscale);
    let mut scale = if sum_l2 != 0.0 { sum_lx / sum_l2 } else { 0.0 };
    let mut best = scale * sum_lx;
    for is in (-9..=9).filter(|&is| is != 0) {
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sum_lx, sum_l2) = sums(iscale);
        if sum_l2 > 0.0 && sum_lx * sum_lx > best * sum_l2 {
            for (l, &v) in levels.iter_mut().zip(x) {
                *l = (level(iscale, v) + nmax) as u8;
            }
            scale = sum_lx / sum_l2;
            best = scale * sum_lx;
        }
    }
    scale
}

/// Group g's 6-bit scale and minimum from the 12 packed bytes (ggml's `get_scale_min_k4`).
fn scale_min(scales: &[u8; 12], g: usize) -> (u8, u8) {
    if g < 4 {
        (scales[g] & 63, scales[g + 4] & 63)
    } else {
        (
            (scales[g + 4] & 0x0f) | ((scales[g - 4] >> 6) << 4),
            (scales[g + 4] >> 4) | ((scales[g] >> 6) << 4),
        )
    }
}

/// Q4_K's and Q5_K's shared part: the super-block's f16 d and dmin, the 12 scale bytes and
/// the 256 levels (0..=nmax), each rounded against the stored scales.
fn with_offsets(
    block: &[f32],
    nmax: i32,
    search: (f32, f32, i32),
) -> (f16, f16, [u8; 12], [u8; 256]) {
    let mut levels = [0u8; 256];
    let mut steps = [0.0f32; 8];
    let mut offsets = [0.0f32; 8];
    let (mut max_step, mut max_offset) = (0.0f32, 0.0f32);
    for (g, group) in block.chunks_exact(32).enumerate() {
        let sum_x2 = group.iter().fold(0.0f32, |s, &v| s + v * v);
        let rms = (sum_x2 / 32.0).sqrt();
        let weights: [f32; 32] = std::array::from_fn(|i| rms + group[i].abs());
        (steps[g], offsets[g]) = fit_with_offset(
            group,
            &weights,
            nmax,
            search,
            &mut levels[32 * g..32 * (g + 1)],
        );
        if steps[g] > max_step {
            max_step = steps[g];
        }
        if offsets[g] > max_offset {
            max_offset = offsets[g];
        }
    }
    let inverse = |max: f32| if max > 0.0 { 63.0 / max } else { 0.0 };
    let (inv_step, inv_offset) = (inverse(max_step), inverse(max_offset));
    let mut scales = [0u8; 12];
    for g in 0..8 {
        let ls = (nearest_int(inv_step * steps[g]) as u8).min(63);
        let lm = (nearest_int(inv_offset * offsets[g]) as u8).min(63);
        if g < 4 {
            scales[g] = ls;
            scales[g + 4] = lm;
        } else {
            scales[g + 4] = (ls & 0x0f) | ((lm & 0x0f) << 4);
            scales[g - 4] |= (ls >> 4) << 6;
            scales[g] |= (lm >> 4) << 6;
        }
    }
    let d = f16::from_f32(max_step / 63.0);
    let dmin = f16::from_f32(max_offset / 63.0);
    for (g, group) in block.chunks_exact(32).enumerate() {
        let (sc, m) = scale_min(&scales, g);
        let step = d.to_f32() * sc as f32;
        if step == 0.0 {
            continue; // the group decodes to −dmin·m whatever its levels
        }
        let offset = dmin.to_f32() * m as f32;
        for (l, &v) in levels[32 * g..].iter_mut().zip(group) {
            *l = nearest_int((v + offset) / step).clamp(0, nmax) as u8;
        }
    }
    (d, dmin, scales, levels)
}

/// One Q4_K super-block (144 bytes): d, dmin, 12 scale bytes, 128 bytes of nibbles (groups 2p
/// and 2p + 1 share 32 bytes, low nibbles the first).
pub(super) fn q4_k(block: &[f32], out: &mut Vec<u8>) {
    let (d, dmin, scales, levels) = with_offsets(block, 15, (-1.0, 0.1, 20));
    out.extend(d.to_le_bytes());
    out.extend(dmin.to_le_bytes());
    out.extend(scales);
    for pair in levels.chunks_exact(64) {
        out.extend((0..32).map(|l| pair[l] | (pair[l + 32] << 4)));
    }
}

/// One Q5_K super-block (176 bytes): as Q4_K, with 32 bytes of fifth bits (bit 2p of byte l for
/// value l of group 2p, bit 2p + 1 for group 2p + 1) before the nibbles.
pub(super) fn q5_k(block: &[f32], out: &mut Vec<u8>) {
    let (d, dmin, scales, levels) = with_offsets(block, 31, (-0.5, 0.1, 15));
    out.extend(d.to_le_bytes());
    out.extend(dmin.to_le_bytes());
    out.extend(scales);
    let mut high = [0u8; 32];
    let mut low = [0u8; 128];
    for (p, pair) in levels.chunks_exact(64).enumerate() {
        for l in 0..32 {
            let (a, b) = (pair[l], pair[l + 32]);
            high[l] |= ((a >> 4) << (2 * p)) | ((b >> 4) << (2 * p + 1));
            low[32 * p + l] = (a & 0x0f) | ((b & 0x0f) << 4);
        }
    }
    out.extend(high);
    out.extend(low);
}

/// One Q6_K super-block (210 bytes): 128 bytes of low nibbles, 64 of high bit pairs, 16 i8
/// scales, f16 d. A block of zeros (every group's step below 1e-15) is 210 zero bytes.
pub(super) fn q6_k(block: &[f32], out: &mut Vec<u8>) {
    let mut levels = [0u8; 256];
    let mut steps = [0.0f32; 16];
    let (mut max_step, mut max_abs) = (0.0f32, 0.0f32);
    for (g, group) in block.chunks_exact(16).enumerate() {
        steps[g] = fit_symmetric(group, 32, &mut levels[16 * g..16 * (g + 1)]);
        if steps[g].abs() > max_abs {
            max_abs = steps[g].abs();
            max_step = steps[g];
        }
    }
    if max_abs < 1e-15 {
        out.extend([0u8; 210]);
        return;
    }
    let iscale = -128.0 / max_step;
    let d = f16::from_f32(1.0 / iscale);
    let scales: [i8; 16] = std::array::from_fn(|g| nearest_int(iscale * steps[g]).min(127) as i8);
    for (g, group) in block.chunks_exact(16).enumerate() {
        let step = d.to_f32() * scales[g] as f32;
        if step == 0.0 {
            continue;
        }
        for (l, &v) in levels[16 * g..].iter_mut().zip(group) {
            *l = (nearest_int(v / step).clamp(-32, 31) + 32) as u8;
        }
    }
    let mut low = [0u8; 128];
    let mut high = [0u8; 64];
    for (h, quarter) in levels.chunks_exact(128).enumerate() {
        for l in 0..32 {
            let q = [
                quarter[l],
                quarter[l + 32],
                quarter[l + 64],
                quarter[l + 96],
            ];
            low[64 * h + l] = (q[0] & 0x0f) | ((q[2] & 0x0f) << 4);
            low[64 * h + l + 32] = (q[1] & 0x0f) | ((q[3] & 0x0f) << 4);
            high[32 * h + l] =
                (q[0] >> 4) | ((q[1] >> 4) << 2) | ((q[2] >> 4) << 4) | ((q[3] >> 4) << 6);
        }
    }
    out.extend(low);
    out.extend(high);
    out.extend(scales.map(|s| s as u8));
    out.extend(d.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        for (v, want) in [
            (0.5, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (3.49, 3),
            (-7.6, -8),
        ] {
            assert_eq!(nearest_int(v), want, "{v}");
        }
    }
}
