//! Activations quantized to 8 bits per block of 32 for the integer block products.

use super::BLOCK;

/// Each token's blocks are a multiple of this many (zero blocks at the end).
pub const PADDING: usize = 8;

const ZERO: Q8Block = Q8Block {
    qs: [0; BLOCK],
    d: 0.0,
    sum: 0,
    d_sum: 0.0,
};

/// 32 activations as `x ≈ d·q`: `d = max|x| / 127`, `q = round(x / d)` (ties away from zero, as
/// llama.cpp's `quantize_row_q8_1`), and `sum = Σ q` (exact, for the formats with an offset;
/// `d_sum = d·sum` saves the SIMD kernels a conversion per block).
#[derive(Debug, Clone, Copy)]
#[repr(C, align(8))]
pub struct Q8Block {
    /// The 32 quantized values.
    pub qs: [i8; BLOCK],
    /// The scale.
    pub d: f32,
    /// `Σ qs`.
    pub sum: i32,
    /// `d · Σ qs`.
    pub d_sum: f32,
}

/// T rows of `cols` activations, as f32 and (when `cols` is a multiple of 32) as [`Q8Block`]s.
/// Each token's blocks are padded with zero blocks to a multiple of [`PADDING`], so that the SIMD
/// kernels take every block in groups (a zero block adds nothing to a product).
#[derive(Debug, Clone, Default)]
pub struct Q8Activations {
    tokens: usize,
    cols: usize,
    values: Vec<f32>,
    blocks: Vec<Q8Block>,
    /// Each block's `d`, `[T, cols / 32]` (contiguous, for vector loads).
    scales: Vec<f32>,
    /// Each block's `d·Σq`, `[T, cols / 32]`.
    d_sums: Vec<f32>,
}

impl Q8Activations {
    /// Quantizes `x`.
    ///
    /// # Shapes
    /// - `x`: `[T, cols]`
    ///
    /// # Panics
    /// If `x.len()` is not a multiple of `cols` (a bug in the caller).
    pub fn new(x: &[f32], cols: usize) -> Self {
        assert!(
            cols > 0 && x.len().is_multiple_of(cols),
            "{} values in rows of {cols}",
            x.len()
        );
        let blocks: Vec<Q8Block> = if cols.is_multiple_of(BLOCK) {
            let padded = padded_blocks(cols);
            x.chunks_exact(cols)
                .flat_map(|row| {
                    let real = row.chunks_exact(BLOCK).map(quantize_block);
                    real.chain(std::iter::repeat_n(ZERO, padded - cols / BLOCK))
                })
                .collect()
        } else {
            Vec::new()
        };
        Q8Activations {
            tokens: x.len() / cols,
            cols,
            values: x.to_vec(),
            scales: blocks.iter().map(|b| b.d).collect(),
            d_sums: blocks.iter().map(|b| b.d_sum).collect(),
            blocks,
        }
    }

    /// T.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Values per token.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Token `t`'s f32 values.
    pub fn values(&self, t: usize) -> &[f32] {
        &self.values[t * self.cols..(t + 1) * self.cols]
    }

    /// Token `t`'s blocks, zero blocks at the end included (empty when `cols` is not a multiple
    /// of 32).
    pub fn blocks(&self, t: usize) -> &[Q8Block] {
        let n = padded_blocks(self.cols);
        self.blocks.get(t * n..(t + 1) * n).unwrap_or(&[])
    }

    /// Token `t`'s block scales `d`.
    pub fn scales(&self, t: usize) -> &[f32] {
        let n = padded_blocks(self.cols);
        self.scales.get(t * n..(t + 1) * n).unwrap_or(&[])
    }

    /// Token `t`'s `d·Σq` per block.
    pub fn d_sums(&self, t: usize) -> &[f32] {
        let n = padded_blocks(self.cols);
        self.d_sums.get(t * n..(t + 1) * n).unwrap_or(&[])
    }
}

/// Blocks per token, padding included.
pub fn padded_blocks(cols: usize) -> usize {
    (cols / BLOCK).div_ceil(PADDING) * PADDING
}

fn quantize_block(x: &[f32]) -> Q8Block {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let inverse = if d > 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0i8; BLOCK];
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = (v * inverse).round().clamp(-127.0, 127.0) as i8;
    }
    let sum = qs.iter().map(|&q| q as i32).sum();
    Q8Block {
        qs,
        d,
        sum,
        d_sum: d * sum as f32,
    }
}
