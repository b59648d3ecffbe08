//! Blockwise 8-bit quantization with a dynamic code table, as bitsandbytes stores the state of
//! its 8-bit optimizers: each block of [`STATE_BLOCK`] values keeps one f32 absmax, each value
//! one byte, the index of the code nearest to `value / absmax`.
//!
//! Bytes per value: 1 + 4 / 256 ≈ 1.016, against 4 for f32.

use super::nf4::nearest_code;

/// Values per absmax block of an 8-bit optimizer state (bitsandbytes' blockwise optimizers).
pub const STATE_BLOCK: usize = 256;

/// Tensors smaller than this keep 32-bit optimizer moments (bitsandbytes' `min_8bit_size`).
pub const MIN_8BIT_SIZE: usize = 4096;

/// State bytes of 8-bit AdamW for a tensor of `n` values: two quantized moments (a byte each
/// plus an f32 absmax per block), or two f32 moments below [`MIN_8BIT_SIZE`].
pub fn adamw8bit_state_bytes(n: usize) -> u64 {
    if n < MIN_8BIT_SIZE {
        8 * n as u64
    } else {
        2 * (n as u64 + 4 * n.div_ceil(STATE_BLOCK) as u64)
    }
}

/// A quantized vector.
#[derive(Debug, Clone, PartialEq)]
pub struct Blockwise8 {
    /// One code per value.
    pub codes: Vec<u8>,
    /// `[ceil(n / STATE_BLOCK)]` block scales.
    pub absmax: Vec<f32>,
}

impl Blockwise8 {
    /// Quantizes `values` against the sorted code table `map` (values in [-1, 1]).
    pub fn quantize(values: &[f32], map: &[f32; 256]) -> Self {
        Self::quantize_blocks(values, map, STATE_BLOCK)
    }

    /// As [`Blockwise8::quantize`] with `block` values per absmax (double quantization of NF4
    /// scales uses it too).
    pub fn quantize_blocks(values: &[f32], map: &[f32; 256], block: usize) -> Self {
        let mut codes = Vec::with_capacity(values.len());
        let mut absmax = Vec::with_capacity(values.len().div_ceil(block));
        for chunk in values.chunks(block) {
            let am = chunk.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            absmax.push(am);
            let inv = 1.0 / am.max(1e-38);
            codes.extend(
                chunk
                    .iter()
                    .map(|&v| nearest_code(map, (v * inv).clamp(-1.0, 1.0))),
            );
        }
        Blockwise8 { codes, absmax }
    }

    /// The values the codes stand for.
    pub fn dequantize(&self, map: &[f32; 256]) -> Vec<f32> {
        self.codes
            .chunks(STATE_BLOCK)
            .zip(&self.absmax)
            .flat_map(|(block, &am)| block.iter().map(move |&c| map[c as usize] * am))
            .collect()
    }

    /// Bytes held: one per code, four per block scale.
    pub fn bytes(&self) -> u64 {
        self.codes.len() as u64 + 4 * self.absmax.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dynamic_map::{dynamic_map_signed, dynamic_map_unsigned};

    /// The error of each value is at most half the gap between its neighbouring codes, times
    /// the block's absmax.
    #[test]
    fn round_trip_error_is_bounded_by_the_code_spacing() {
        let values: Vec<f32> = (0..1000)
            .map(|i| ((i as f32 * 0.37).sin() * 3.0).powi(3))
            .collect();
        for (map, values) in [
            (dynamic_map_signed(), values.clone()),
            (
                dynamic_map_unsigned(),
                values.iter().map(|v| v.abs()).collect(),
            ),
        ] {
            let q = Blockwise8::quantize(&values, &map);
            assert_eq!(q.absmax.len(), 4);
            assert_eq!(q.bytes(), 1000 + 16);
            let back = q.dequantize(&map);
            let max_gap = map.windows(2).map(|w| w[1] - w[0]).fold(0.0, f32::max);
            for (block, (orig, got)) in values.chunks(256).zip(back.chunks(256)).enumerate() {
                let am = q.absmax[block];
                for (a, b) in orig.iter().zip(got) {
                    assert!((a - b).abs() <= 0.5 * max_gap * am * 1.0001, "{a} vs {b}");
                }
                // Code 255 is +1.0 in both maps, so a positive absmax comes back exactly (the
                // signed map's most negative code is -0.99297, not -1).
                let top = orig.iter().fold(0.0f32, |m, v| m.max(*v));
                if top == am {
                    assert!(got.contains(&top), "a positive absmax is exact");
                }
            }
        }
    }
}
