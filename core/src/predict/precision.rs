//! The mixed-precision recipes learners meet, as bytes per trainable parameter of model state
//! (AdamW full fine-tuning) and bytes per saved activation value.
//!
//! Each recipe is the dtype of every copy a parameter has:
//!
//! | recipe | weights | FP8 copy | gradients | master | 1st moment | 2nd moment | total |
//! |---|---|---|---|---|---|---|---|
//! | fp32 | 4 | – | 4 | – | 4 | 4 | 16 |
//! | fp16 / bf16 autocast (torch.amp) | 4 | 2 (cast cache) | 4 | – | 4 | 4 | 18 |
//! | bf16 params + fp32 master (Megatron / DeepSpeed) | 2 | – | 2 | 4 | 4 | 4 | 16 |
//! | pure bf16 (bf16 state, no master) | 2 | – | 2 | – | 2 | 2 | 8 |
//! | FP8 GEMMs, TransformerEngine-style | 2 | 1 | 2 | 4 | 4 | 4 | 17 |
//! | MS-AMP O1 | 2 | – | 1 | – | 4 | 4 | 11 |
//! | MS-AMP O2 | 2 | – | 1 | – | 1 | 2 | 6 |
//! | MS-AMP O3 | 1 | – | 1 | 2 | 1 | 2 | 7, ZeRO shards all but the FP8 weights |
//!
//! - torch.amp keeps the parameters, gradients and optimizer in f32 and casts each weight to
//!   16 bits on first use inside the autocast region, caching the cast copy until the region
//!   ends (2 bytes per weight during the forward).
//! - TransformerEngine runs the GEMMs in FP8 (E4M3 forward, E5M2 gradients) from bf16
//!   parameters, keeping an FP8 copy of each weight; the master weights and AdamW stay f32.
//!   FP8 saves GEMM time and the FP8 inputs it keeps for the backward, not model state.
//! - MS-AMP (its README's table, which seed 004 quotes, and `FP8Linear`'s default
//!   `weight_qtype=kfloat16`): O1 keeps each weight once, in FP16, and casts it to FP8 for
//!   every GEMM; weight gradients are FP8 and AdamW's moments f32. O2 moves the moments to
//!   FP8 + FP16 (the FP8-LM paper's "16 → 6 bytes a parameter"). O3 stores the weights in FP8
//!   with an FP16 master copy, inside ZeRO's sharded optimizer. Per-tensor scaling factors (a
//!   few bytes per tensor) are left out.
//!
//! Only fp32 and the 16-bit autocast run in napkin's engine (burn on the CPU and wgpu); the
//! other rows are predicted only, and say so.

use serde::Serialize;

/// A mixed-precision recipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PrecisionRecipe {
    /// Everything in f32.
    Fp32,
    /// torch.amp with f16 (f32 parameters, gradients and state; a loss scaler).
    Fp16Autocast,
    /// torch.amp with bf16.
    Bf16Autocast,
    /// bf16 parameters and gradients, f32 master weights in the optimizer.
    Bf16Master,
    /// bf16 everywhere, AdamW moments in bf16, no master copy.
    PureBf16,
    /// FP8 GEMMs from bf16 parameters with f32 master weights (TransformerEngine-style).
    Fp8TransformerEngine,
    /// MS-AMP O1: FP16 weights (cast to FP8 per GEMM), FP8 weight gradients, f32 moments.
    MsAmpO1,
    /// MS-AMP O2: O1 with an FP8 first moment and an FP16 second moment.
    MsAmpO2,
    /// MS-AMP O3: FP8 weights with FP16 master weights, O2's moments, ZeRO sharding.
    MsAmpO3,
}

/// Bytes a trainable parameter costs in each copy, and bytes per saved activation value.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BytesPerParameter {
    /// The weights the model computes with.
    pub weights: f64,
    /// A low-precision copy kept beside them (autocast's cast cache, TE's FP8 weights).
    pub weight_copy: f64,
    /// Gradients.
    pub gradients: f64,
    /// The optimizer's master copy of the weights.
    pub master: f64,
    /// AdamW's first moment.
    pub first_moment: f64,
    /// AdamW's second moment.
    pub second_moment: f64,
    /// A value the forward keeps for the backward (most of them; see the module notes).
    pub activation: f64,
}

impl BytesPerParameter {
    /// Model state per trainable parameter.
    pub fn total(&self) -> f64 {
        self.weights
            + self.weight_copy
            + self.gradients
            + self.master
            + self.first_moment
            + self.second_moment
    }

    /// The part ZeRO-2 shards (gradients, master weights, moments).
    fn shardable(&self) -> f64 {
        self.gradients + self.master + self.first_moment + self.second_moment
    }
}

impl PrecisionRecipe {
    /// Every recipe, in the order of the table.
    pub const ALL: [PrecisionRecipe; 9] = [
        PrecisionRecipe::Fp32,
        PrecisionRecipe::Fp16Autocast,
        PrecisionRecipe::Bf16Autocast,
        PrecisionRecipe::Bf16Master,
        PrecisionRecipe::PureBf16,
        PrecisionRecipe::Fp8TransformerEngine,
        PrecisionRecipe::MsAmpO1,
        PrecisionRecipe::MsAmpO2,
        PrecisionRecipe::MsAmpO3,
    ];

    /// A short name.
    pub fn name(self) -> &'static str {
        match self {
            PrecisionRecipe::Fp32 => "fp32",
            PrecisionRecipe::Fp16Autocast => "fp16 autocast",
            PrecisionRecipe::Bf16Autocast => "bf16 autocast",
            PrecisionRecipe::Bf16Master => "bf16 + fp32 master",
            PrecisionRecipe::PureBf16 => "pure bf16",
            PrecisionRecipe::Fp8TransformerEngine => "FP8 GEMMs (TE-style)",
            PrecisionRecipe::MsAmpO1 => "MS-AMP O1",
            PrecisionRecipe::MsAmpO2 => "MS-AMP O2",
            PrecisionRecipe::MsAmpO3 => "MS-AMP O3",
        }
    }

    /// Whether napkin's engine can run it (the others are predicted only).
    pub fn runs_in_napkin(self) -> bool {
        matches!(
            self,
            PrecisionRecipe::Fp32 | PrecisionRecipe::Fp16Autocast | PrecisionRecipe::Bf16Autocast
        )
    }

    /// Bytes per trainable parameter of each copy (AdamW), and per saved activation value.
    pub fn bytes(self) -> BytesPerParameter {
        let (weights, weight_copy, gradients, master, first_moment, second_moment, activation) =
            match self {
                PrecisionRecipe::Fp32 => (4.0, 0.0, 4.0, 0.0, 4.0, 4.0, 4.0),
                PrecisionRecipe::Fp16Autocast | PrecisionRecipe::Bf16Autocast => {
                    (4.0, 2.0, 4.0, 0.0, 4.0, 4.0, 2.0)
                }
                PrecisionRecipe::Bf16Master => (2.0, 0.0, 2.0, 4.0, 4.0, 4.0, 2.0),
                PrecisionRecipe::PureBf16 => (2.0, 0.0, 2.0, 0.0, 2.0, 2.0, 2.0),
                PrecisionRecipe::Fp8TransformerEngine => (2.0, 1.0, 2.0, 4.0, 4.0, 4.0, 2.0),
                PrecisionRecipe::MsAmpO1 => (2.0, 0.0, 1.0, 0.0, 4.0, 4.0, 2.0),
                PrecisionRecipe::MsAmpO2 => (2.0, 0.0, 1.0, 0.0, 1.0, 2.0, 2.0),
                PrecisionRecipe::MsAmpO3 => (1.0, 0.0, 1.0, 2.0, 1.0, 2.0, 2.0),
            };
        BytesPerParameter {
            weights,
            weight_copy,
            gradients,
            master,
            first_moment,
            second_moment,
            activation,
        }
    }
}

/// One row of the precision table for a model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PrecisionRow {
    /// The recipe.
    pub recipe: PrecisionRecipe,
    /// Its name.
    pub name: &'static str,
    /// Bytes per trainable parameter of each copy.
    pub per_parameter: BytesPerParameter,
    /// Model-state bytes per GPU (weights, copies, gradients, master, moments).
    pub model_state_bytes: f64,
    /// Whether the numbers are predicted only (napkin cannot run the recipe).
    pub predicted_only: bool,
}

/// The table for full fine-tuning of `parameters` with AdamW on `gpus` GPUs (only MS-AMP O3
/// shards: its gradients, master weights and moments are divided over the GPUs).
pub fn precision_table(parameters: u64, gpus: u64) -> Vec<PrecisionRow> {
    let p = parameters as f64;
    PrecisionRecipe::ALL
        .into_iter()
        .map(|recipe| {
            let bytes = recipe.bytes();
            let per_gpu = match recipe {
                PrecisionRecipe::MsAmpO3 => {
                    bytes.total() - bytes.shardable() + bytes.shardable() / gpus.max(1) as f64
                }
                _ => bytes.total(),
            };
            PrecisionRow {
                recipe,
                name: recipe.name(),
                per_parameter: bytes,
                model_state_bytes: p * per_gpu,
                predicted_only: !recipe.runs_in_napkin(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::predict::rules::{OptimizerRule, Precision, full_training_bytes};

    /// fp32 and bf16-with-master agree with the seed rules (16 bytes); the lean recipes come
    /// out at the documented sizes.
    #[test]
    fn bytes_per_parameter_of_each_recipe() {
        let total = |r: PrecisionRecipe| r.bytes().total();
        assert_eq!(
            total(PrecisionRecipe::Fp32),
            full_training_bytes(1, OptimizerRule::AdamW, Precision::Fp32)
        );
        assert_eq!(
            total(PrecisionRecipe::Bf16Master),
            full_training_bytes(1, OptimizerRule::AdamW, Precision::Mixed)
        );
        assert_eq!(total(PrecisionRecipe::PureBf16), 8.0);
        assert_eq!(total(PrecisionRecipe::Fp8TransformerEngine), 17.0);
        // MS-AMP's table: O1 FP16 + FP8 + f32 + f32, O2 FP16 + FP8 + FP8 + FP16 (the FP8-LM
        // paper's 6 bytes), O3 FP8 + FP16 master + FP8 + FP8 + FP16.
        assert_eq!(total(PrecisionRecipe::MsAmpO1), 11.0);
        assert_eq!(total(PrecisionRecipe::MsAmpO2), 6.0);
        assert_eq!(total(PrecisionRecipe::MsAmpO3), 7.0);
        // MS-AMP's "up to 62.5 % of the optimizer's memory" is the moments: 8 → 3 bytes.
        let o2 = PrecisionRecipe::MsAmpO2.bytes();
        assert_eq!(1.0 - (o2.first_moment + o2.second_moment) / 8.0, 0.625);
    }

    /// O3 keeps the FP8 weights whole on every GPU and an eighth of the rest on 8; O2 does not
    /// shard.
    #[test]
    fn ms_amp_o3_shards_over_the_gpus() {
        let row = |gpus, recipe| {
            precision_table(1_000_000, gpus)
                .into_iter()
                .find(|r| r.recipe == recipe)
                .expect("every recipe has a row")
        };
        let o2 = row(1, PrecisionRecipe::MsAmpO2).model_state_bytes;
        assert_eq!(
            row(1, PrecisionRecipe::MsAmpO3).model_state_bytes,
            7_000_000.0
        );
        assert_eq!(
            row(8, PrecisionRecipe::MsAmpO3).model_state_bytes,
            1_000_000.0 * (1.0 + 6.0 / 8.0)
        );
        assert!(row(8, PrecisionRecipe::MsAmpO2).model_state_bytes == o2);
        assert!(row(1, PrecisionRecipe::MsAmpO1).predicted_only);
        assert!(!row(1, PrecisionRecipe::Bf16Autocast).predicted_only);
    }
}
