//! `LoraConfig`: which linear layers get low-rank adapters, and how large.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A linear layer of a decoder block that LoRA can adapt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoraTarget {
    /// `self_attn.q_proj`.
    QProj,
    /// `self_attn.k_proj`.
    KProj,
    /// `self_attn.v_proj`.
    VProj,
    /// `self_attn.o_proj`.
    OProj,
    /// `mlp.gate_proj`.
    GateProj,
    /// `mlp.up_proj`.
    UpProj,
    /// `mlp.down_proj`.
    DownProj,
}

impl LoraTarget {
    /// All seven, in module order.
    pub const ALL: [LoraTarget; 7] = [
        LoraTarget::QProj,
        LoraTarget::KProj,
        LoraTarget::VProj,
        LoraTarget::OProj,
        LoraTarget::GateProj,
        LoraTarget::UpProj,
        LoraTarget::DownProj,
    ];

    /// The module name peft uses in `target_modules` (`q_proj`, ...).
    pub fn module_name(self) -> &'static str {
        match self {
            LoraTarget::QProj => "q_proj",
            LoraTarget::KProj => "k_proj",
            LoraTarget::VProj => "v_proj",
            LoraTarget::OProj => "o_proj",
            LoraTarget::GateProj => "gate_proj",
            LoraTarget::UpProj => "up_proj",
            LoraTarget::DownProj => "down_proj",
        }
    }

    /// The path inside a decoder block (`self_attn.q_proj`, `mlp.up_proj`, ...).
    pub fn block_path(self) -> &'static str {
        match self {
            LoraTarget::QProj => "self_attn.q_proj",
            LoraTarget::KProj => "self_attn.k_proj",
            LoraTarget::VProj => "self_attn.v_proj",
            LoraTarget::OProj => "self_attn.o_proj",
            LoraTarget::GateProj => "mlp.gate_proj",
            LoraTarget::UpProj => "mlp.up_proj",
            LoraTarget::DownProj => "mlp.down_proj",
        }
    }

    /// Parses a comma-separated list: short names (`q`, `gate`), peft names (`q_proj`),
    /// Phi-3's fused modules (`qkv_proj`: q, k and v; `gate_up_proj`: gate and up) or
    /// `all-linear` / `all`.
    pub fn parse_list(list: &str) -> Result<Vec<LoraTarget>> {
        let mut out = Vec::new();
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match item {
                "all-linear" | "all_linear" | "all" => out.extend(LoraTarget::ALL),
                other => match fused_parts(other) {
                    Some(parts) => out.extend(
                        LoraTarget::ALL
                            .into_iter()
                            .filter(|t| parts.contains(&t.block_path())),
                    ),
                    None => out.push(other.parse()?),
                },
            }
        }
        out.sort();
        out.dedup();
        if out.is_empty() {
            return Err(Error::config("--targets", "no LoRA target modules given"));
        }
        Ok(out)
    }
}

/// A list of adapted modules split into the block linears and the two that are none: the
/// token embedding and the LM head (peft's `embed_tokens`, `lm_head`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TargetNames {
    /// The block linears.
    pub blocks: Vec<LoraTarget>,
    /// `embed_tokens`.
    pub embedding: bool,
    /// `lm_head`.
    pub head: bool,
}

impl TargetNames {
    /// Parses a comma-separated list as [`LoraTarget::parse_list`] does, with `embed_tokens`
    /// and `lm_head` besides (at least one module in all).
    pub fn parse(list: &str) -> Result<TargetNames> {
        let mut names = TargetNames::default();
        let mut blocks = Vec::new();
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match item {
                "embed_tokens" => names.embedding = true,
                "lm_head" => names.head = true,
                other => blocks.push(other),
            }
        }
        if !blocks.is_empty() {
            names.blocks = LoraTarget::parse_list(&blocks.join(","))?;
        } else if !(names.embedding || names.head) {
            return Err(Error::config("--targets", "no LoRA target modules given"));
        }
        Ok(names)
    }

    /// The list in peft's names, block linears first.
    pub fn peft_names(&self) -> Vec<&'static str> {
        let mut out: Vec<&str> = self.blocks.iter().map(|t| t.module_name()).collect();
        if self.embedding {
            out.push("embed_tokens");
        }
        if self.head {
            out.push("lm_head");
        }
        out
    }
}

/// The block paths of Phi-3's fused module `name` (`qkv_proj`, `gate_up_proj`).
fn fused_parts(name: &str) -> Option<&'static [&'static str]> {
    super::FUSED_PROJECTIONS
        .iter()
        .find(|(path, _)| path.rsplit('.').next() == Some(name))
        .map(|(_, parts)| *parts)
}

impl FromStr for LoraTarget {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let name = s.trim().trim_end_matches("_proj");
        LoraTarget::ALL
            .into_iter()
            .find(|t| t.module_name().trim_end_matches("_proj") == name)
            .ok_or_else(|| {
                Error::config(
                    "--targets",
                    format!(
                        "unknown LoRA target `{s}`; expected q, k, v, o, gate, up, down, \
                         qkv_proj, gate_up_proj or all-linear"
                    ),
                )
            })
    }
}

impl fmt::Display for LoraTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.module_name())
    }
}

/// Low-rank adaptation settings (peft `LoraConfig`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoraConfig {
    /// r: the rank of each adapter.
    pub r: usize,
    /// α: the adapter output is scaled by α/r (or α/√r with rsLoRA).
    pub alpha: f64,
    /// Dropout probability on the adapter's input during training.
    pub dropout: f64,
    /// The adapted modules.
    pub targets: Vec<LoraTarget>,
    /// Rank-stabilised scaling α/√r.
    pub use_rslora: bool,
    /// DoRA: a trainable magnitude per output row over the adapted weight's direction.
    #[serde(default)]
    pub use_dora: bool,
    /// An adapter on the token embedding (peft's `embed_tokens`: A `[r, V]`, B `[D, r]`).
    #[serde(default)]
    pub embedding: bool,
    /// An adapter on the LM head (peft's `lm_head`, an untied head).
    #[serde(default)]
    pub head: bool,
}

impl Default for LoraConfig {
    fn default() -> Self {
        LoraConfig {
            r: 16,
            alpha: 32.0,
            dropout: 0.0,
            targets: LoraTarget::ALL.to_vec(),
            use_rslora: false,
            use_dora: false,
            embedding: false,
            head: false,
        }
    }
}

impl LoraConfig {
    /// The factor applied to the adapter's output.
    pub fn scaling(&self) -> f64 {
        if self.use_rslora {
            self.alpha / (self.r as f64).sqrt()
        } else {
            self.alpha / self.r as f64
        }
    }

    /// Checks rank, alpha and dropout.
    pub fn validate(&self) -> Result<()> {
        if self.r == 0 || self.r > 65_536 {
            return Err(Error::config(
                "--lora-r",
                format!("rank must be from 1 to 65536, found {}", self.r),
            ));
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return Err(Error::config(
                "--lora-alpha",
                format!("alpha must be positive, found {}", self.alpha),
            ));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(Error::config(
                "--lora-dropout",
                format!("dropout must be in [0, 1), found {}", self.dropout),
            ));
        }
        if self.targets.is_empty() && !(self.embedding || self.head) {
            return Err(Error::config("--targets", "no LoRA target modules given"));
        }
        Ok(())
    }

    /// Trainable values of these adapters on a model: r·(in + out) per adapted linear, and
    /// with DoRA its `out` magnitudes.
    pub fn trainable_parameters(&self, model: &super::LlamaConfig) -> u64 {
        let magnitude = usize::from(self.use_dora);
        let per_block: usize = model
            .block_linears()
            .iter()
            .zip(LoraTarget::ALL)
            .filter(|(_, t)| self.targets(*t))
            .map(|(&(_, out, inp), _)| self.r * (out + inp) + magnitude * out)
            .sum();
        // The embedding's A `[r, V]` and B `[D, r]`; the head's A `[r, D]`, B `[V, r]` (and its
        // magnitude with DoRA).
        let (v, d) = (model.vocab_size, model.hidden_size);
        let outer = usize::from(self.embedding) * self.r * (v + d)
            + usize::from(self.head) * (self.r * (v + d) + magnitude * v);
        (per_block * model.num_hidden_layers + outer) as u64
    }

    /// The adapted modules by name (block linears, embedding, head).
    pub fn target_names(&self) -> TargetNames {
        TargetNames {
            blocks: self.targets.clone(),
            embedding: self.embedding,
            head: self.head,
        }
    }

    /// Whether a block's linear is adapted.
    pub fn targets(&self, target: LoraTarget) -> bool {
        self.targets.contains(&target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_short_peft_and_all_linear_names() {
        assert_eq!(
            LoraTarget::parse_list("all-linear").unwrap(),
            LoraTarget::ALL.to_vec()
        );
        assert_eq!(
            LoraTarget::parse_list("v_proj, q").unwrap(),
            vec![LoraTarget::QProj, LoraTarget::VProj]
        );
        use LoraTarget::{DownProj, GateProj, KProj, QProj, UpProj, VProj};
        assert_eq!(
            LoraTarget::parse_list("qkv_proj,gate_up_proj,down").unwrap(),
            vec![QProj, KProj, VProj, GateProj, UpProj, DownProj]
        );
        assert!(
            LoraTarget::parse_list("qkv")
                .unwrap_err()
                .to_string()
                .contains("qkv")
        );
    }

    #[test]
    fn smollm2_r16_all_linear_trains_4_884_480_values() {
        let lora = LoraConfig {
            r: 16,
            ..Default::default()
        };
        assert_eq!(
            lora.trainable_parameters(&super::super::LlamaConfig::smollm2_135m()),
            4_884_480
        );
    }

    #[test]
    fn scaling_is_alpha_over_r_or_over_sqrt_r() {
        let mut c = LoraConfig {
            r: 16,
            alpha: 32.0,
            ..Default::default()
        };
        assert_eq!(c.scaling(), 2.0);
        c.use_rslora = true;
        assert_eq!(c.scaling(), 8.0);
    }
}
