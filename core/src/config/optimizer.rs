//! Which optimizer a run uses: a plain name, shared by the trainer and the predictor.

use super::spellings;

/// Which optimizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OptimizerKind {
    /// AdamW, f32 moments (8 bytes of state per trainable value).
    #[default]
    AdamW,
    /// AdamW with blockwise 8-bit moments (≈ 2.03 bytes per value).
    AdamW8bit,
    /// SGD with momentum (4 bytes per value).
    Sgd,
}

spellings! {
    OptimizerKind, "optimizer", "optimizer", serde;
    AdamW => "adamw" []: "AdamW, f32 moments (8 bytes of state per trainable value)",
    AdamW8bit => "adamw8bit" ["adamw-8bit", "adamw_8bit"]: "AdamW with blockwise 8-bit moments (about 2.03 bytes a value)",
    Sgd => "sgd" []: "SGD with momentum (4 bytes a value)",
}
