//! The napkin math of resident weight memory: float parts, NF4 codes and NF4 scales.
//! Pure arithmetic on the config; the memory tests hold the measured bytes against it.

use crate::config::{DOUBLE_QUANT_BLOCK, LlamaConfig, Nf4Config};

/// Resident bytes of a model's weights, by component.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WeightBytes {
    /// Float weights (embedding, norms, LM head; and the block linears unless quantized).
    pub float: u64,
    /// Packed NF4 codes.
    pub codes: u64,
    /// NF4 block scales (and double-quantization constants).
    pub scales: u64,
}

impl WeightBytes {
    /// All of them.
    pub fn total(&self) -> u64 {
        self.float + self.codes + self.scales
    }
}

/// NF4 storage of one tensor of `n` weights: (codes, scales) bytes.
pub fn nf4_tensor_bytes(n: u64, nf4: &Nf4Config) -> (u64, u64) {
    let blocks = n.div_ceil(nf4.block_size as u64);
    let scales = if nf4.double_quant {
        // u8 per block + f32 per 256 blocks + one f32 offset.
        blocks + 4 * blocks.div_ceil(DOUBLE_QUANT_BLOCK as u64) + 4
    } else {
        4 * blocks
    };
    (n.div_ceil(2), scales)
}

/// Resident weight bytes with float parts of `float_bytes` each (4 for f32) and the block
/// linears quantized when `nf4` is given.
pub fn weight_bytes(
    config: &LlamaConfig,
    float_bytes: u64,
    nf4: Option<&Nf4Config>,
) -> WeightBytes {
    let linear_params: Vec<u64> = config
        .block_linears()
        .iter()
        .map(|&(_, out, inp)| (out * inp) as u64)
        .collect();
    let all_linears = config.num_hidden_layers as u64 * linear_params.iter().sum::<u64>();
    let other = config.num_parameters() - all_linears;
    match nf4 {
        None => WeightBytes {
            float: float_bytes * config.num_parameters(),
            codes: 0,
            scales: 0,
        },
        Some(nf4) => {
            let (mut codes, mut scales) = (0, 0);
            for &n in &linear_params {
                let (c, s) = nf4_tensor_bytes(n, nf4);
                codes += c;
                scales += s;
            }
            let layers = config.num_hidden_layers as u64;
            WeightBytes {
                float: float_bytes * other,
                codes: layers * codes,
                scales: layers * scales,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nf4_bytes_follow_the_block_arithmetic() {
        let plain = Nf4Config::default();
        assert_eq!(nf4_tensor_bytes(64 * 1000, &plain), (32_000, 4_000));
        let dq = Nf4Config {
            double_quant: true,
            ..plain
        };
        // 1000 blocks: 1000 u8 codes + 4 second-level scales (256, 256, 256, 232) + offset.
        assert_eq!(nf4_tensor_bytes(64 * 1000, &dq), (32_000, 1000 + 16 + 4));
    }

    #[test]
    fn float_model_is_four_bytes_a_parameter() {
        let c = LlamaConfig::smollm2_135m();
        assert_eq!(weight_bytes(&c, 4, None).total(), 4 * 134_515_008);
    }
}
