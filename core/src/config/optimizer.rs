//! Which optimizer a run uses: a plain name, shared by the trainer and the predictor.

use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Which optimizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// AdamW, f32 moments (8 bytes of state per trainable value).
    #[default]
    AdamW,
    /// AdamW with blockwise 8-bit moments (≈ 2.03 bytes per value).
    AdamW8bit,
    /// SGD with momentum (4 bytes per value).
    Sgd,
}

impl FromStr for OptimizerKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().replace(['-', '_'], "").as_str() {
            "adamw" => Ok(OptimizerKind::AdamW),
            "adamw8bit" => Ok(OptimizerKind::AdamW8bit),
            "sgd" => Ok(OptimizerKind::Sgd),
            _ => Err(Error::Input(format!(
                "unknown optimizer `{s}`: expected adamw, adamw8bit or sgd"
            ))),
        }
    }
}
