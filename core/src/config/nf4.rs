//! `Nf4Config`: how the frozen base weights are quantized to 4-bit NormalFloat (QLoRA).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Block-wise NF4 quantization settings (bitsandbytes' `quantize_4bit(quant_type="nf4")`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Nf4Config {
    /// Consecutive weights sharing one absmax scale (bitsandbytes: 64).
    pub block_size: usize,
    /// Quantize the absmax scales themselves to 8 bits in blocks of 256 (QLoRA's "DQ").
    pub double_quant: bool,
}

impl Default for Nf4Config {
    fn default() -> Self {
        Nf4Config {
            block_size: 64,
            double_quant: false,
        }
    }
}

/// Scales per second-level block in double quantization (bitsandbytes' fixed 256).
pub const DOUBLE_QUANT_BLOCK: usize = 256;

impl Nf4Config {
    /// Checks the block size.
    pub fn validate(&self) -> Result<()> {
        if self.block_size < 2 || !self.block_size.is_multiple_of(2) || self.block_size > 1 << 20 {
            return Err(Error::config(
                "--block-size",
                format!(
                    "NF4 block size must be an even number from 2 to 2^20, found {}",
                    self.block_size
                ),
            ));
        }
        Ok(())
    }

    /// Bytes of storage per weight: 4-bit codes plus the scales.
    ///
    /// Without double quantization: 0.5 + 4/block. With it: 0.5 + 1/block + 4/(256·block) + a
    /// 4-byte offset per tensor (ignored here: it does not scale with the weight count).
    pub fn bytes_per_weight(&self) -> f64 {
        let b = self.block_size as f64;
        if self.double_quant {
            0.5 + 1.0 / b + 4.0 / (DOUBLE_QUANT_BLOCK as f64 * b)
        } else {
            0.5 + 4.0 / b
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_per_weight_match_the_qlora_paper() {
        let plain = Nf4Config::default();
        assert_eq!(plain.bytes_per_weight(), 0.5 + 4.0 / 64.0); // 4.5 bits
        let dq = Nf4Config {
            double_quant: true,
            ..plain
        };
        // QLoRA: 8/64 + 32/(64·256) = 0.127 bits per parameter for the scales.
        assert!(
            (dq.bytes_per_weight() * 8.0 - 4.127).abs() < 1e-3,
            "{}",
            dq.bytes_per_weight() * 8.0
        );
    }
}
