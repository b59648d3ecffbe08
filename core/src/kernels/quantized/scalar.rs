//! The portable kernels: one row of a block-format matrix times every token, and one row
//! dequantized. Written for clarity; the SIMD kernels are tested against these.

use half::f16;

use super::activations::{Q8Activations, Q8Block};
use super::{BLOCK, BlockFormat};

fn f16_at(bytes: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([bytes[i], bytes[i + 1]]).to_f32()
}

/// `out[r·T + t] = W[r] · x[t]` for a run of rows of `W` and every token.
pub(super) fn rows(format: BlockFormat, rows: &[u8], x: &Q8Activations, out: &mut [f32]) {
    let row_bytes = format.row_bytes(x.cols());
    for (r, out) in rows
        .chunks_exact(row_bytes)
        .zip(out.chunks_exact_mut(x.tokens()))
    {
        row(format, r, x, out);
    }
}

/// `out[t] = row · x[t]` for every token.
pub(super) fn row(format: BlockFormat, row: &[u8], x: &Q8Activations, out: &mut [f32]) {
    for (t, o) in out.iter_mut().enumerate() {
        *o = match format {
            BlockFormat::F32 => dot_f32(row, x.values(t)),
            _ => dot_blocks(format, row, x.blocks(t)),
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

fn dot_blocks(format: BlockFormat, row: &[u8], x: &[Q8Block]) -> f32 {
    let size = format.row_bytes(BLOCK);
    let mut total = 0.0f32;
    for (block, xb) in row.chunks_exact(size).zip(x) {
        let d = f16_at(block, 0);
        total += match format {
            BlockFormat::Q4_0 => {
                let dot = nibble_dot(&block[2..18], &xb.qs);
                d * xb.d * (dot - 8 * xb.sum) as f32
            }
            BlockFormat::Q4_1 => {
                let dot = nibble_dot(&block[4..20], &xb.qs);
                d * xb.d * dot as f32 + f16_at(block, 2) * xb.d * xb.sum as f32
            }
            BlockFormat::Q8_0 => {
                let dot: i32 = block[2..34]
                    .iter()
                    .zip(&xb.qs)
                    .map(|(&w, &v)| (w as i8) as i32 * v as i32)
                    .sum();
                d * xb.d * dot as f32
            }
            BlockFormat::F32 => unreachable!("f32 rows are not blocks"),
        };
    }
    total
}

/// `Σ q·x` over a block's 32 nibbles (low halves are elements 0..16, high halves 16..32).
fn nibble_dot(qs: &[u8], x: &[i8; BLOCK]) -> i32 {
    let (low, high) = x.split_at(BLOCK / 2);
    qs.iter()
        .zip(low.iter().zip(high))
        .map(|(&q, (&a, &b))| (q & 0x0f) as i32 * a as i32 + (q >> 4) as i32 * b as i32)
        .sum()
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
