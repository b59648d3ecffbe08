//! The seed-style napkin formulas: bytes per parameter for each kind of training memory, as the
//! EleutherAI "Transformer Math 101" rules state them. What they leave out (activations, the
//! logits, quantization scales, workspace) is what the exact inventory adds.

use serde::{Deserialize, Serialize};

/// How weights and gradients are held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Precision {
    /// Everything in f32.
    Fp32,
    /// bf16/f16 weights and gradients for compute, with an f32 master copy in the optimizer.
    Mixed,
}

/// The optimizer's state per trainable parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum OptimizerRule {
    /// AdamW: momentum and variance, f32.
    AdamW,
    /// 8-bit AdamW: both moments in one byte each.
    AdamW8bit,
    /// SGD with momentum: one f32 buffer.
    SgdMomentum,
}

impl From<crate::config::OptimizerKind> for OptimizerRule {
    fn from(kind: crate::config::OptimizerKind) -> Self {
        match kind {
            crate::config::OptimizerKind::AdamW => OptimizerRule::AdamW,
            crate::config::OptimizerKind::AdamW8bit => OptimizerRule::AdamW8bit,
            crate::config::OptimizerKind::Sgd => OptimizerRule::SgdMomentum,
        }
    }
}

/// Bytes per parameter of the model weights: 4 in f32, 2 in half precision.
pub fn weight_bytes_per_param(precision: Precision) -> f64 {
    match precision {
        Precision::Fp32 => 4.0,
        Precision::Mixed => 2.0,
    }
}

/// Bytes per parameter of the gradients: stored in the weights' precision.
pub fn gradient_bytes_per_param(precision: Precision) -> f64 {
    weight_bytes_per_param(precision)
}

/// Bytes per trainable parameter of optimizer state. Mixed precision adds the f32 master
/// copy of the weights (4 bytes), which the rules count with the optimizer: AdamW 12 (master
/// 4 + two moments 8), 8-bit AdamW 6, SGD with momentum 8. In f32 there is no master copy.
pub fn optimizer_bytes_per_param(optimizer: OptimizerRule, precision: Precision) -> f64 {
    let moments = match optimizer {
        OptimizerRule::AdamW => 8.0,
        OptimizerRule::AdamW8bit => 2.0,
        OptimizerRule::SgdMomentum => 4.0,
    };
    let master = match precision {
        Precision::Fp32 => 0.0,
        Precision::Mixed => 4.0,
    };
    moments + master
}

/// The seed formula for full fine-tuning: (weights + gradients + optimizer) × parameters.
pub fn full_training_bytes(params: u64, optimizer: OptimizerRule, precision: Precision) -> f64 {
    params as f64
        * (weight_bytes_per_param(precision)
            + gradient_bytes_per_param(precision)
            + optimizer_bytes_per_param(optimizer, precision))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rules as EleutherAI's Transformer Math 101 states them.
    #[test]
    fn bytes_per_parameter_rules() {
        use OptimizerRule::*;
        use Precision::*;
        assert_eq!(optimizer_bytes_per_param(AdamW, Mixed), 12.0);
        assert_eq!(optimizer_bytes_per_param(AdamW8bit, Mixed), 6.0);
        assert_eq!(optimizer_bytes_per_param(SgdMomentum, Mixed), 8.0);
        assert_eq!(
            weight_bytes_per_param(Mixed) + 4.0,
            6.0,
            "mixed: 2 + master 4"
        );
        // Full fine-tuning in f32 with AdamW: the classic 16 bytes a parameter.
        assert_eq!(full_training_bytes(1, AdamW, Fp32), 16.0);
        // Mixed precision AdamW: 2 + 2 + 12 = 16 as well (the master copy moves, not vanishes).
        assert_eq!(full_training_bytes(1, AdamW, Mixed), 16.0);
    }
}
