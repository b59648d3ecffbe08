//! The portable kernels: one row of a block-format matrix times every token, and one row
//! dequantized. Written for clarity; the SIMD kernels are tested against these.

use half::f16;

use super::activations::{ActivationBits, QuantizedActivations};
use super::{BLOCK, BlockFormat, SUPER_BLOCK};

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
            BlockFormat::Nf4 => super::nf4::dot(row, x, t),
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

/// `Σ_b d_w·d_x·(Σ w·q_x) + offset·d_x·Σ q_x` over the blocks of 32 of a row: the offset is
/// `−8·d_w` for Q4_0, `m` for Q4_1, `−dmin·m` for Q4_K/Q5_K, 0 for Q8_0 and Q6_K (whose integer
/// weights carry their scales: `sc·(q − 32)`).
fn dot_blocks(format: BlockFormat, row: &[u8], x: &QuantizedActivations, t: usize) -> f32 {
    let (scales, d_sums) = (x.scales(t), x.d_sums(t));
    let mut total = 0.0f32;
    for (b, block) in blocks_of_32(format, row).enumerate() {
        let activations: [i32; BLOCK] = match x.bits() {
            ActivationBits::Eight => x.blocks(t)[b].qs.map(i32::from),
            ActivationBits::Sixteen => x.wide_blocks(t)[b].qs.map(i32::from),
        };
        let dot: i64 = block
            .integer_weights()
            .iter()
            .zip(&activations)
            .map(|(&w, &v)| w as i64 * v as i64)
            .sum();
        total += block.scale * scales[b] * dot as f32 + block.offset * d_sums[b];
    }
    total
}

/// A block of 32 weights as every format's product sees it: `w = scale·(q·s) + offset`, where
/// `s` is Q6_K's scale of each half (16 values) and 1 for every other format.
#[derive(Debug, Clone, Copy)]
pub(super) struct BlockOf32 {
    /// The stored integers in element order (Q4: 0..15, Q5_K: 0..31, Q8_0: −128..127, Q6_K:
    /// `q − 32`, −32..31).
    pub q: [i32; BLOCK],
    /// `d_w`: f16 `d`, or `d·sc` for Q4_K/Q5_K.
    pub scale: f32,
    /// Added to every weight.
    pub offset: f32,
    /// Q6_K's i8 scales of elements 0..16 and 16..32.
    pub halves: Option<[i32; 2]>,
}

impl BlockOf32 {
    /// The integers the block's product sums (`q`, or `s·q` for Q6_K).
    fn integer_weights(&self) -> [i32; BLOCK] {
        match self.halves {
            Some(s) => std::array::from_fn(|i| s[i / 16] * self.q[i]),
            None => self.q,
        }
    }
}

/// The blocks of 32 of a row in element order (a K-quant super-block is eight of them).
pub(super) fn blocks_of_32(
    format: BlockFormat,
    row: &[u8],
) -> impl Iterator<Item = BlockOf32> + '_ {
    let unit = format.row_bytes(format.values_per_block());
    let super_blocks = format.values_per_block() == SUPER_BLOCK;
    let small = (!super_blocks).then(|| {
        row.chunks_exact(unit)
            .map(move |block| small_block(format, block))
    });
    let eights = super_blocks.then(|| {
        row.chunks_exact(unit).flat_map(move |block| match format {
            BlockFormat::Q6K => q6_k_blocks(block),
            _ => k4_blocks(format, block),
        })
    });
    small
        .into_iter()
        .flatten()
        .chain(eights.into_iter().flatten())
}

/// A Q4_0, Q4_1 or Q8_0 block.
fn small_block(format: BlockFormat, block: &[u8]) -> BlockOf32 {
    let mut q = [0i32; BLOCK];
    let d = f16_at(block, 0);
    let offset = match format {
        BlockFormat::Q4_0 | BlockFormat::Q4_1 => {
            let qs = if format == BlockFormat::Q4_0 {
                &block[2..18]
            } else {
                &block[4..20]
            };
            for (i, &b) in qs.iter().enumerate() {
                q[i] = (b & 0x0f) as i32;
                q[i + BLOCK / 2] = (b >> 4) as i32;
            }
            if format == BlockFormat::Q4_0 {
                -8.0 * d
            } else {
                f16_at(block, 2)
            }
        }
        BlockFormat::Q8_0 => {
            for (o, &b) in q.iter_mut().zip(&block[2..34]) {
                *o = (b as i8) as i32;
            }
            0.0
        }
        _ => unreachable!("{format:?} is not a block of 32"),
    };
    BlockOf32 {
        q,
        scale: d,
        offset,
        halves: None,
    }
}

/// The eight 6-bit scales and eight 6-bit mins of a Q4_K/Q5_K super-block's 12 packed bytes
/// `[a | b | c]` (three little-endian words): scales 0..4 are the low 6 bits of `a`'s bytes, mins
/// 0..4 of `b`'s; scales 4..8 are `c`'s low nibbles under the top 2 bits of `a`'s bytes, mins 4..8
/// `c`'s high nibbles under those of `b`'s. Byte-wise on whole words (masks keep each byte's
/// bits in that byte).
#[inline]
pub(super) fn k4_scales_and_mins(packed: &[u8]) -> ([u8; 8], [u8; 8]) {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const TOP2: u32 = 0x0303_0303;
    let word = |i: usize| {
        u32::from_le_bytes([
            packed[4 * i],
            packed[4 * i + 1],
            packed[4 * i + 2],
            packed[4 * i + 3],
        ])
    };
    let (a, b, c) = (word(0), word(1), word(2));
    let scales_high = (c & LOW4) | (((a >> 6) & TOP2) << 4);
    let mins_high = ((c >> 4) & LOW4) | (((b >> 6) & TOP2) << 4);
    let join = |low: u32, high: u32| {
        let mut out = [0u8; 8];
        out[..4].copy_from_slice(&low.to_le_bytes());
        out[4..].copy_from_slice(&high.to_le_bytes());
        out
    };
    (join(a & LOW6, scales_high), join(b & LOW6, mins_high))
}

/// A Q4_K/Q5_K super-block: four chunks of 32 bytes of nibbles, the low nibbles block 2g and
/// the high ones block 2g + 1; Q5_K's fifth bit of element l of block k is bit k of `qh[l]`.
fn k4_blocks(format: BlockFormat, block: &[u8]) -> [BlockOf32; SUPER_BLOCK / BLOCK] {
    let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
    let packed = &block[4..16];
    let (qh, qs) = match format {
        BlockFormat::Q5K => (Some(&block[16..48]), &block[48..176]),
        _ => (None, &block[16..144]),
    };
    let (scales, mins) = k4_scales_and_mins(packed);
    std::array::from_fn(|k| {
        let (sc, m) = (scales[k], mins[k]);
        let chunk = &qs[32 * (k / 2)..32 * (k / 2 + 1)];
        let q = std::array::from_fn(|l| {
            let nibble = if k % 2 == 0 {
                chunk[l] & 0x0f
            } else {
                chunk[l] >> 4
            };
            let fifth = qh.map_or(0, |qh| ((qh[l] >> k) & 1) << 4);
            (nibble | fifth) as i32
        });
        BlockOf32 {
            q,
            scale: d * sc as f32,
            offset: -(dmin * m as f32),
            halves: None,
        }
    })
}

/// A Q6_K super-block: two halves of 128 values, each from 64 bytes of low nibbles `ql`, 32
/// bytes of bit pairs `qh` and 8 scales. Block k (0..4) of a half takes the low (k = 0, 1) or high
/// (k = 2, 3) nibbles of `ql[32·(k % 2)..][..32]` and bits 2k, 2k + 1 of `qh`, and scales
/// `2k`, `2k + 1`.
fn q6_k_blocks(block: &[u8]) -> [BlockOf32; SUPER_BLOCK / BLOCK] {
    let d = f16_at(block, 208);
    std::array::from_fn(|i| {
        let (half, k) = (i / 4, i % 4);
        let ql = &block[64 * half..64 * (half + 1)];
        let qh = &block[128 + 32 * half..128 + 32 * (half + 1)];
        let sc = &block[192 + 8 * half..192 + 8 * (half + 1)];
        let low = &ql[32 * (k % 2)..32 * (k % 2 + 1)];
        let q = std::array::from_fn(|l| {
            let nibble = if k < 2 { low[l] & 0x0f } else { low[l] >> 4 };
            let high = (qh[l] >> (2 * k)) & 3;
            (nibble | (high << 4)) as i32 - 32
        });
        BlockOf32 {
            q,
            scale: d,
            offset: 0.0,
            halves: Some([sc[2 * k] as i8 as i32, sc[2 * k + 1] as i8 as i32]),
        }
    })
}

/// One row as f32 values.
pub(super) fn dequantize_row(format: BlockFormat, row: &[u8], out: &mut [f32]) {
    if format == BlockFormat::F32 {
        for (o, b) in out.iter_mut().zip(row.chunks_exact(4)) {
            *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        return;
    }
    if format == BlockFormat::Nf4 {
        return super::nf4::dequantize_row(row, out);
    }
    if format.values_per_block() == SUPER_BLOCK {
        // Written as the GGUF reader dequantizes, so the two agree bit for bit: `d·sc·q − dmin·m`
        // is `scale·q + offset`; Q6_K's is `(d·s)·(q − 32)`.
        for (block, out) in blocks_of_32(format, row).zip(out.chunks_exact_mut(BLOCK)) {
            for (i, (o, &q)) in out.iter_mut().zip(&block.q).enumerate() {
                *o = match block.halves {
                    Some(s) => (block.scale * s[i / 16] as f32) * q as f32,
                    None => block.scale * q as f32 + block.offset,
                };
            }
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
            _ => unreachable!("handled above"),
        }
    }
}
