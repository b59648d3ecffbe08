//! A training step's settings as a user chooses them, the same for every front end (the CLI's
//! flags, a run file, the page's controls), and the one function that turns them into the
//! predictor's [`Scenario`] and refuses what no step can run.

use crate::config::{
    AttentionKind, Kernels, LlamaConfig, LoraConfig, LoraTarget, Nf4Config, ObjectiveKind,
    OptimizerKind,
};
use crate::error::{Error, Result};
use crate::predict::inventory::Scenario;
use crate::predict::row_layout::RowLayout;

/// The tricks and shapes of one training step, as plain choices (no model yet).
#[derive(Debug, Clone, PartialEq)]
pub struct StepSettings {
    /// B: rows per micro-batch.
    pub micro_batch: usize,
    /// T: tokens per row (a preference objective: per sequence, chosen and rejected each).
    pub seq_len: usize,
    /// What the step minimises.
    pub objective: ObjectiveKind,
    /// LoRA rank r (0: full fine-tuning).
    pub lora_r: usize,
    /// LoRA α (None: 2r).
    pub lora_alpha: Option<f64>,
    /// LoRA dropout probability.
    pub lora_dropout: f64,
    /// rsLoRA's α/√r scale instead of α/r.
    pub rslora: bool,
    /// DoRA's magnitude vectors on the adapters.
    pub dora: bool,
    /// The adapted linears.
    pub lora_targets: Vec<LoraTarget>,
    /// An adapter on the token embedding too.
    pub lora_embedding: bool,
    /// An adapter on the LM head too.
    pub lora_head: bool,
    /// The frozen block linears as NF4 (QLoRA with LoRA), with these settings.
    pub nf4: Option<Nf4Config>,
    /// The optimizer.
    pub optimizer: OptimizerKind,
    /// Block-level gradient checkpointing.
    pub checkpointing: bool,
    /// The head and the loss a chunk of rows at a time (a frozen head; `model::chunked_loss`).
    pub chunked_loss: bool,
    /// Micro-batches per optimizer step.
    pub accumulation: usize,
    /// Rows packed with several samples (no padding).
    pub packed: bool,
    /// The attention's softmax.
    pub attention: AttentionKind,
    /// 16-bit autocast of the products.
    pub half_compute: bool,
    /// The element-wise layers' implementation.
    pub kernels: Kernels,
    /// The device's row layout.
    pub rows: RowLayout,
}

impl Default for StepSettings {
    /// Full fine-tuning of one row of 256 tokens with AdamW, nothing else switched on.
    fn default() -> Self {
        StepSettings {
            micro_batch: 1,
            seq_len: 256,
            objective: ObjectiveKind::Sft,
            lora_r: 0,
            lora_alpha: None,
            lora_dropout: 0.0,
            rslora: false,
            dora: false,
            lora_targets: LoraTarget::ALL.to_vec(),
            lora_embedding: false,
            lora_head: false,
            nf4: None,
            optimizer: OptimizerKind::AdamW,
            checkpointing: false,
            chunked_loss: false,
            accumulation: 1,
            packed: false,
            attention: AttentionKind::Eager,
            half_compute: false,
            kernels: Kernels::FusedCpu,
            rows: RowLayout::Contiguous,
        }
    }
}

impl StepSettings {
    /// LoRA as the settings ask (None: full fine-tuning).
    pub fn lora(&self) -> Option<LoraConfig> {
        (self.lora_r > 0).then(|| LoraConfig {
            r: self.lora_r,
            alpha: self.lora_alpha.unwrap_or(2.0 * self.lora_r as f64),
            dropout: self.lora_dropout,
            targets: self.lora_targets.clone(),
            use_rslora: self.rslora,
            use_dora: self.dora,
            embedding: self.lora_embedding,
            head: self.lora_head,
        })
    }

    /// The predictor's scenario for a model of `config`, or an error naming the setting that
    /// no step can run with.
    pub fn scenario(&self, config: LlamaConfig) -> Result<Scenario> {
        self.check()?;
        if self.lora_r > 0 && (self.lora_embedding || self.lora_head) && config.tie_word_embeddings
        {
            return Err(Error::config(
                "--lora-targets / lora_targets",
                "LoRA on embed_tokens or lm_head of a model whose head is tied to its embedding is not supported",
            ));
        }
        Ok(self.build(config))
    }

    /// The scenario without [`StepSettings::check`]: for a front end whose inputs are bounded
    /// where they are entered (the page's controls accept only what `check` accepts).
    ///
    /// A preference objective's micro-batch is `micro_batch` pairs, each one row of its two
    /// sequences side by side (`data/pair_batch.rs`): rows of up to `2 · seq_len` tokens whose
    /// segments attend apart, as packed rows do.
    pub fn build(&self, config: LlamaConfig) -> Scenario {
        let pairs = self.objective.is_preference();
        Scenario {
            objective: self.objective,
            packed: self.packed || pairs,
            lora: self.lora(),
            nf4: self.nf4,
            optimizer: self.optimizer,
            half_compute: self.half_compute,
            checkpointing: self.checkpointing,
            chunked_loss: self.chunked_loss,
            accumulation: self.accumulation,
            attention: self.attention,
            kernels: self.kernels,
            rows: self.rows,
            ..Scenario::new(
                config,
                self.micro_batch,
                if pairs {
                    2 * self.seq_len
                } else {
                    self.seq_len
                },
            )
        }
    }

    /// Refuses, naming the setting, what no step can run with.
    pub fn check(&self) -> Result<()> {
        // Named as the flag and as the run file's key, for whichever the user wrote.
        let bad = |key: &str, message: String| {
            Err(Error::config(
                format!("--{} / {key}", key.replace('_', "-")),
                message,
            ))
        };
        if self.micro_batch == 0 {
            return bad("micro_batch", "must be at least 1, found 0".into());
        }
        if self.seq_len < 2 {
            return bad(
                "seq_len",
                format!(
                    "must be at least 2 (a token and the one it predicts), found {}",
                    self.seq_len
                ),
            );
        }
        if self.accumulation == 0 {
            return bad("accumulation", "must be at least 1, found 0".into());
        }
        if !(0.0..1.0).contains(&self.lora_dropout) {
            return bad(
                "lora_dropout",
                format!("must be in [0, 1), found {}", self.lora_dropout),
            );
        }
        if self.lora_r > 0
            && self.lora_targets.is_empty()
            && !(self.lora_embedding || self.lora_head)
        {
            return bad(
                "lora_targets",
                "LoRA needs at least one target linear".into(),
            );
        }
        if self.dora && self.lora_r == 0 {
            return bad(
                "dora",
                "DoRA is a kind of LoRA adapter: give --lora-r ≥ 1".into(),
            );
        }
        if self.objective.has_reference() && self.lora_r == 0 {
            return bad(
                "objective",
                format!(
                    "{} needs LoRA (--lora-r ≥ 1): its reference is the base with the adapters off; with full fine-tuning it would be a second copy of every weight, which napkin does not keep",
                    self.objective
                ),
            );
        }
        if self.chunked_loss && (self.lora_r == 0 || self.lora_head) {
            return bad(
                "chunked_loss",
                "needs a frozen LM head: LoRA (--lora-r ≥ 1) without an adapter on lm_head".into(),
            );
        }
        if let Some(nf4) = &self.nf4 {
            nf4.validate()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_settings_become_the_scenario_they_name() {
        let settings = StepSettings {
            micro_batch: 2,
            seq_len: 128,
            lora_r: 8,
            lora_targets: vec![LoraTarget::QProj, LoraTarget::VProj],
            nf4: Some(Nf4Config {
                block_size: 64,
                double_quant: true,
            }),
            checkpointing: true,
            accumulation: 4,
            ..StepSettings::default()
        };
        let s = settings.scenario(LlamaConfig::tiny_smol()).unwrap();
        assert_eq!((s.micro_batch, s.seq_len, s.accumulation), (2, 128, 4));
        let lora = s.lora.expect("LoRA");
        assert_eq!((lora.r, lora.alpha), (8, 16.0));
        assert_eq!(lora.targets, vec![LoraTarget::QProj, LoraTarget::VProj]);
        assert!(s.checkpointing && s.nf4.is_some_and(|n| n.double_quant));
        assert!(
            StepSettings::default()
                .scenario(LlamaConfig::tiny_smol())
                .unwrap()
                .lora
                .is_none()
        );
    }

    /// A preference objective's micro-batch is its pairs, each one packed row of both
    /// sequences; only DPO replays a reference forward.
    #[test]
    fn a_preference_step_is_pair_rows_of_twice_the_sequence() {
        use crate::predict::timeline::step_timeline;
        let settings = |objective| StepSettings {
            objective,
            micro_batch: 2,
            seq_len: 128,
            lora_r: 8,
            ..StepSettings::default()
        };
        let config = LlamaConfig::tiny_smol();
        for objective in [ObjectiveKind::Dpo, ObjectiveKind::Orpo] {
            let s = settings(objective).scenario(config.clone()).unwrap();
            assert_eq!((s.micro_batch, s.seq_len, s.packed), (2, 256, true));
            assert_eq!(s.objective, objective);
            let reference_events = step_timeline(&s)
                .events
                .iter()
                .filter(|e| e.label.starts_with("reference."))
                .count();
            let expected = match objective {
                ObjectiveKind::Dpo => config.num_hidden_layers + 1,
                _ => 0,
            };
            assert_eq!(reference_events, expected, "{objective}");
        }
        let sft = settings(ObjectiveKind::Sft).scenario(config).unwrap();
        assert_eq!((sft.seq_len, sft.packed), (128, false));
    }

    /// Adapters on the embedding or the head: counted on an untied model, refused on a tied one.
    #[test]
    fn outer_adapters_need_an_untied_head() {
        let settings = StepSettings {
            lora_r: 8,
            lora_head: true,
            lora_embedding: true,
            ..StepSettings::default()
        };
        let untied = settings.scenario(LlamaConfig::small()).unwrap();
        assert!(untied.lora.is_some_and(|l| l.head && l.embedding));
        let error = settings
            .scenario(LlamaConfig::tiny_smol())
            .unwrap_err()
            .to_string();
        assert!(error.contains("tied"), "{error}");
    }

    #[test]
    fn settings_no_step_can_run_are_refused_by_name() {
        for (settings, needle) in [
            (
                StepSettings {
                    micro_batch: 0,
                    ..StepSettings::default()
                },
                "micro_batch: must be at least 1",
            ),
            (
                StepSettings {
                    seq_len: 1,
                    ..StepSettings::default()
                },
                "seq_len: must be at least 2",
            ),
            (
                StepSettings {
                    accumulation: 0,
                    ..StepSettings::default()
                },
                "accumulation: must be at least 1",
            ),
            (
                StepSettings {
                    lora_r: 4,
                    lora_dropout: 1.0,
                    ..StepSettings::default()
                },
                "lora_dropout: must be in [0, 1)",
            ),
            (
                StepSettings {
                    lora_r: 4,
                    lora_targets: Vec::new(),
                    ..StepSettings::default()
                },
                "lora_targets: LoRA needs at least one target",
            ),
            (
                StepSettings {
                    objective: ObjectiveKind::Dpo,
                    ..StepSettings::default()
                },
                "objective: dpo needs LoRA",
            ),
            (
                StepSettings {
                    nf4: Some(Nf4Config {
                        block_size: 3,
                        double_quant: false,
                    }),
                    ..StepSettings::default()
                },
                "NF4 block size must be an even number",
            ),
        ] {
            let error = settings
                .scenario(LlamaConfig::tiny_smol())
                .unwrap_err()
                .to_string();
            assert!(error.contains(needle), "{error}");
        }
    }
}
