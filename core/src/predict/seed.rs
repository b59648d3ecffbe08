//! The seed-style napkin formulas a learner meets first, shown beside the exact inventory so the
//! difference is visible: bytes per parameter × parameters for weights, gradients and optimizer
//! state, and the activation rule of Korthikanti et al. ("Reducing Activation Recomputation in
//! Large Transformer Models", 2022): per layer `s·b·h·(34 + 5·a·s/h)` bytes with 16-bit
//! activations (twice that in f32), or `2·s·b·h` per layer when only each layer's input is kept
//! (full recomputation).

use serde::Serialize;

use super::inventory::Scenario;

use super::rules::{
    OptimizerRule, Precision, gradient_bytes_per_param, optimizer_bytes_per_param,
    weight_bytes_per_param,
};

/// The seed formulas' answer for one training setup.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SeedEstimate {
    /// Weights.
    pub weights: f64,
    /// Gradients (of the trainable parameters).
    pub gradients: f64,
    /// Optimizer state (of the trainable parameters).
    pub optimizer: f64,
    /// Activations of all layers (with full recomputation: all layers' inputs).
    pub activations: f64,
    /// One layer's activations without recomputation, the formula's per-layer figure: what a
    /// checkpointed block holds while its backward recomputes it.
    pub one_layer_activations: f64,
}

impl SeedEstimate {
    /// The sum.
    /// The sum of what is kept through the step (one recomputed layer is not counted).
    pub fn total(&self) -> f64 {
        self.weights + self.gradients + self.optimizer + self.activations
    }
}

/// The shape of the activations a layer keeps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ActivationShape {
    /// s: sequence length.
    pub seq: f64,
    /// b: micro-batch.
    pub batch: f64,
    /// h: hidden size.
    pub hidden: f64,
    /// a: attention heads.
    pub heads: f64,
    /// L: layers.
    pub layers: f64,
}

/// Korthikanti et al.'s activation bytes of all layers: `L·s·b·h·(34 + 5·a·s/h)` for 16-bit
/// activations, doubled for f32; with full recomputation only the layer inputs (`L·2·s·b·h`
/// in 16 bits).
pub fn activation_bytes(shape: ActivationShape, precision: Precision, recompute: bool) -> f64 {
    let ActivationShape {
        seq: s,
        batch: b,
        hidden: h,
        heads: a,
        layers,
    } = shape;
    let per_layer_16bit = if recompute {
        2.0 * s * b * h
    } else {
        s * b * h * (34.0 + 5.0 * a * s / h)
    };
    let width = match precision {
        Precision::Fp32 => 2.0,
        Precision::Mixed => 1.0,
    };
    layers * per_layer_16bit * width
}

/// The seed estimate: `params` weights, `trainable` of them trained.
pub fn seed_estimate(
    params: u64,
    trainable: u64,
    optimizer: OptimizerRule,
    precision: Precision,
    shape: ActivationShape,
    recompute: bool,
) -> SeedEstimate {
    SeedEstimate {
        weights: params as f64 * weight_bytes_per_param(precision),
        gradients: trainable as f64 * gradient_bytes_per_param(precision),
        optimizer: trainable as f64 * optimizer_bytes_per_param(optimizer, precision),
        activations: activation_bytes(shape, precision, recompute),
        one_layer_activations: activation_bytes(
            ActivationShape {
                layers: 1.0,
                ..shape
            },
            precision,
            false,
        ),
    }
}

/// The seed formulas for a scenario: what they say knowing only the parameter counts, the
/// optimizer, the precision and the activation shape (not NF4, not the engine).
pub fn scenario_seed_estimate(s: &Scenario, precision: Precision) -> SeedEstimate {
    let config = &s.config;
    seed_estimate(
        config.num_parameters(),
        s.trainable_parameters(),
        s.optimizer.into(),
        precision,
        ActivationShape {
            seq: s.seq_len as f64,
            batch: s.micro_batch as f64,
            hidden: config.hidden_size as f64,
            heads: config.num_attention_heads as f64,
            layers: config.num_hidden_layers as f64,
        },
        s.checkpointing,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activation_rule_by_hand() {
        // s = 256, b = 1, h = 576, a = 9, one layer, 16-bit: 256·576·(34 + 5·9·256/576)
        // = 147456 · 54 = 7,962,624 bytes.
        let shape = ActivationShape {
            seq: 256.0,
            batch: 1.0,
            hidden: 576.0,
            heads: 9.0,
            layers: 1.0,
        };
        assert_eq!(
            activation_bytes(shape, Precision::Mixed, false),
            7_962_624.0
        );
        assert_eq!(
            activation_bytes(shape, Precision::Fp32, false),
            2.0 * 7_962_624.0
        );
        assert_eq!(
            activation_bytes(shape, Precision::Mixed, true),
            2.0 * 147_456.0
        );
    }
}
