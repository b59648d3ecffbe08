//! The portable kernels: one row of a block-format matrix times every token, and one row
//! dequantized. Written for clarity; the SIMD kernels are tested against these.

use half::f16;

use super::activations::{ActivationBits, QuantizedActivations};
use super::{BLOCK, BlockFormat};

fn f16_at(bytes: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([bytes[i], bytes[i + 1]]).to_f32()
}

/// `out[r·T + t] = W[r] · x[t]` for a run of rows of `W` and every token.
pub(super) fn rows(format: BlockFormat, rows: &[u8], x: &QuantizedActivations, out: &mut [f32]) {
    let row_bytes = format.row_bytes(x.cols());
    for (r, out) in rows
        .chunks_exact(row_bytes)
        .zip(out.chunks_exact_mut(x.tokens()))
    {
        row(format, r, x, out);
    }
}

/// `out[t] = row · x[t]` for every token.
pub(super) fn row(format: BlockFormat, row: &[u8], x: &QuantizedActivations, out: &mut [f32]) {
    for (t, o) in out.iter_mut().enumerate() {
        *o = match format {
            BlockFormat::F32 => dot_f32(row, x.values(t)),
            _ => dot_blocks(format, row, x, t),
        };
    }
}

/// `row · x` for an f32 row (little-endian bytes), in eight chains of fixed lanes so that it
/// vectorizes (LoRA's A and B run here, and rows that are not blocks).
pub(super) fn dot_f32(row: &[u8], x: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let (rows, xs) = (row.chunks_exact(32), x.chunks_exact(8));
    let (row_rest, x_rest) = (rows.remainder(), xs.remainder());
    for (w, v) in rows.zip(xs) {
        for (j, lane) in lanes.iter_mut().enumerate() {
            let w = f32::from_le_bytes([w[4 * j], w[4 * j + 1], w[4 * j + 2], w[4 * j + 3]]);
            *lane += w * v[j];
        }
    }
    let rest: f32 = row_rest
        .chunks_exact(4)
        .zip(x_rest)
        .map(|(w, v)| f32::from_le_bytes([w[0], w[1], w[2], w[3]]) * v)
        .sum();
    lanes.iter().sum::<f32>() + rest
}

/// `Σ_b d_w·d_x·(Σ q_w·q_x) + offset·d_x·Σ q_x` over the blocks of a row: the offset is `−8·d_w`
/// for Q4_0, `m` for Q4_1, 0 for Q8_0.
fn dot_blocks(format: BlockFormat, row: &[u8], x: &QuantizedActivations, t: usize) -> f32 {
    let size = format.row_bytes(BLOCK);
    let (scales, d_sums) = (x.scales(t), x.d_sums(t));
    let mut total = 0.0f32;
    for (b, block) in row.chunks_exact(size).enumerate() {
        let (weights, offset) = weight_block(format, block);
        let activations: [i32; BLOCK] = match x.bits() {
            ActivationBits::Eight => x.blocks(t)[b].qs.map(i32::from),
            ActivationBits::Sixteen => x.wide_blocks(t)[b].qs.map(i32::from),
        };
        let dot: i64 = weights
            .iter()
            .zip(&activations)
            .map(|(&w, &v)| w as i64 * v as i64)
            .sum();
        total += f16_at(block, 0) * scales[b] * dot as f32 + offset * d_sums[b];
    }
    total
}

/// A block's 32 integer weights in element order (nibbles 0..15, or i8), and its offset.
fn weight_block(format: BlockFormat, block: &[u8]) -> ([i32; BLOCK], f32) {
    let mut w = [0i32; BLOCK];
    let d = f16_at(block, 0);
    let offset = match format {
        BlockFormat::Q4_0 | BlockFormat::Q4_1 => {
            let qs = if format == BlockFormat::Q4_0 {
                &block[2..18]
            } else {
                &block[4..20]
            };
            for (i, &q) in qs.iter().enumerate() {
                w[i] = (q & 0x0f) as i32;
                w[i + BLOCK / 2] = (q >> 4) as i32;
            }
            if format == BlockFormat::Q4_0 {
                -8.0 * d
            } else {
                f16_at(block, 2)
            }
        }
        BlockFormat::Q8_0 => {
            for (o, &q) in w.iter_mut().zip(&block[2..34]) {
                *o = (q as i8) as i32;
            }
            0.0
        }
        BlockFormat::F32 => unreachable!("f32 rows are not blocks"),
    };
    (w, offset)
}

/// One row as f32 values.
pub(super) fn dequantize_row(format: BlockFormat, row: &[u8], out: &mut [f32]) {
    if format == BlockFormat::F32 {
        for (o, b) in out.iter_mut().zip(row.chunks_exact(4)) {
            *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        return;
    }
    let size = format.row_bytes(BLOCK);
    for (block, out) in row.chunks_exact(size).zip(out.chunks_exact_mut(BLOCK)) {
        let d = f16_at(block, 0);
        match format {
            // Written as the GGUF reader dequantizes, so the two agree bit for bit.
            BlockFormat::Q4_0 => {
                let (low, high) = out.split_at_mut(BLOCK / 2);
                for ((q, l), h) in block[2..18].iter().zip(low).zip(high) {
                    *l = ((q & 0x0f) as i32 - 8) as f32 * d;
                    *h = ((q >> 4) as i32 - 8) as f32 * d;
                }
            }
            BlockFormat::Q4_1 => {
                let m = f16_at(block, 2);
                let (low, high) = out.split_at_mut(BLOCK / 2);
                for ((q, l), h) in block[4..20].iter().zip(low).zip(high) {
                    *l = (q & 0x0f) as f32 * d + m;
                    *h = (q >> 4) as f32 * d + m;
                }
            }
            BlockFormat::Q8_0 => {
                for (o, &q) in out.iter_mut().zip(&block[2..34]) {
                    *o = (q as i8) as f32 * d;
                }
            }
            BlockFormat::F32 => unreachable!("handled above"),
        }
    }
}
