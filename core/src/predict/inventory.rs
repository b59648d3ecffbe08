//! One inventory of named tensors for a training scenario: each with its kind, its bytes and
//! the phases in which it is alive. The predictor sums it, the measurement attaches to the same
//! names, the charts draw it. A new trick edits this list; it does not fork the code.
//!
//! Names follow the module tree (`layers.3.self_attn.q_proj.lora_A`). This first part holds
//! the state that lives across steps — weights, NF4 codes and scales, adapters, gradients,
//! optimizer state — exactly as napkin's engine stores it, and the logits of a step; the saved
//! activations of the blocks join it next.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::config::{LlamaConfig, LoraConfig, LoraTarget, Nf4Config, OptimizerKind};
use crate::memory::weights::nf4_tensor_bytes;
use crate::tricks::blockwise8::adamw8bit_state_bytes;

/// What a tensor is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Float weights (trainable or frozen).
    Weights,
    /// Packed NF4 codes.
    QuantCodes,
    /// NF4 block scales (and double-quantization constants).
    QuantScales,
    /// LoRA A and B.
    Adapters,
    /// Gradients of the trainable tensors.
    Gradients,
    /// Optimizer moments / momentum.
    OptimizerState,
    /// Activations kept from the forward for the backward.
    SavedActivations,
    /// Short-lived buffers inside an operation.
    Workspace,
    /// The LM head's output.
    Logits,
}

/// The phases of one step in which a tensor is alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Phases {
    /// Lives across steps.
    pub persistent: bool,
    /// Alive during the forward.
    pub forward: bool,
    /// Alive during the backward (including recomputation).
    pub backward: bool,
    /// Alive during the optimizer update.
    pub optimizer: bool,
}

impl Phases {
    /// Alive all the time.
    pub const ALWAYS: Phases = Phases {
        persistent: true,
        forward: true,
        backward: true,
        optimizer: true,
    };
    /// Created in the backward, consumed by the optimizer.
    pub const GRADIENT: Phases = Phases {
        persistent: false,
        forward: false,
        backward: true,
        optimizer: true,
    };
    /// Created in the forward, freed by the end of the backward.
    pub const ACTIVATION: Phases = Phases {
        persistent: false,
        forward: true,
        backward: true,
        optimizer: false,
    };
}

/// One tensor.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Entry {
    /// Module-tree name.
    pub name: String,
    /// The decoder block it belongs to (None: embedding, final norm, head, logits).
    pub layer: Option<usize>,
    /// What it is.
    pub kind: Kind,
    /// Bytes.
    pub bytes: u64,
    /// When it is alive.
    pub phases: Phases,
}

/// A training scenario: the model and the tricks.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// The model.
    pub config: LlamaConfig,
    /// LoRA adapters (None: full fine-tuning).
    pub lora: Option<LoraConfig>,
    /// NF4 base (QLoRA).
    pub nf4: Option<Nf4Config>,
    /// The optimizer.
    pub optimizer: OptimizerKind,
    /// B.
    pub micro_batch: usize,
    /// T.
    pub seq_len: usize,
    /// Frozen base stored in 2-byte floats (mixed precision with LoRA).
    pub half_base: bool,
}

/// The inventory of a scenario.
pub fn inventory(s: &Scenario) -> Vec<Entry> {
    let c = &s.config;
    let (v, d) = (c.vocab_size as u64, c.hidden_size as u64);
    let full = s.lora.is_none();
    let mut out = Vec::new();
    // A trainable tensor brings its gradient and its optimizer state.
    let trainable = |out: &mut Vec<Entry>, name: &str, layer: Option<usize>, n: u64| {
        out.push(Entry {
            name: format!("{name}.grad"),
            layer,
            kind: Kind::Gradients,
            bytes: 4 * n,
            phases: Phases::GRADIENT,
        });
        let state = match s.optimizer {
            OptimizerKind::AdamW => 8 * n,
            OptimizerKind::AdamW8bit => adamw8bit_state_bytes(n as usize),
            OptimizerKind::Sgd => 4 * n,
        };
        out.push(Entry {
            name: format!("{name}.optimizer_state"),
            layer,
            kind: Kind::OptimizerState,
            bytes: state,
            phases: Phases::ALWAYS,
        });
    };
    let weight = |name: &str, layer: Option<usize>, n: u64| Entry {
        name: name.to_string(),
        layer,
        kind: Kind::Weights,
        bytes: 4 * n,
        phases: Phases::ALWAYS,
    };

    out.push(weight("embed_tokens", None, v * d));
    if full {
        trainable(&mut out, "embed_tokens", None, v * d);
    }
    for layer in 0..c.num_hidden_layers {
        let l = Some(layer);
        for norm in ["input_layernorm", "post_attention_layernorm"] {
            let name = format!("layers.{layer}.{norm}");
            out.push(weight(&name, l, d));
            if full {
                trainable(&mut out, &name, l, d);
            }
        }
        for (&(_, rows, cols), target) in c.block_linears().iter().zip(LoraTarget::ALL) {
            let name = format!("layers.{layer}.{}", target.block_path());
            let n = (rows * cols) as u64;
            match &s.nf4 {
                Some(nf4) => {
                    let (codes, scales) = nf4_tensor_bytes(n, nf4);
                    out.push(Entry {
                        name: format!("{name}.nf4_codes"),
                        layer: l,
                        kind: Kind::QuantCodes,
                        bytes: codes,
                        phases: Phases::ALWAYS,
                    });
                    out.push(Entry {
                        name: format!("{name}.nf4_scales"),
                        layer: l,
                        kind: Kind::QuantScales,
                        bytes: scales,
                        phases: Phases::ALWAYS,
                    });
                }
                None => {
                    let bytes_per = if s.half_base && !full { 2 } else { 4 };
                    out.push(Entry {
                        bytes: bytes_per * n,
                        ..weight(&format!("{name}.weight"), l, n)
                    });
                    if full {
                        trainable(&mut out, &format!("{name}.weight"), l, n);
                    }
                }
            }
            if let Some(lora) = &s.lora
                && lora.targets(target)
            {
                let r = lora.r as u64;
                for (part, values) in [("lora_A", r * cols as u64), ("lora_B", r * rows as u64)] {
                    let adapter = format!("{name}.{part}");
                    out.push(Entry {
                        name: adapter.clone(),
                        layer: l,
                        kind: Kind::Adapters,
                        bytes: 4 * values,
                        phases: Phases::ALWAYS,
                    });
                    trainable(&mut out, &adapter, l, values);
                }
            }
        }
    }
    out.push(weight("norm", None, d));
    if full {
        trainable(&mut out, "norm", None, d);
    }
    if !c.tie_word_embeddings {
        out.push(weight("lm_head", None, v * d));
        if full {
            trainable(&mut out, "lm_head", None, v * d);
        }
    }
    out.push(Entry {
        name: "logits".into(),
        layer: None,
        kind: Kind::Logits,
        bytes: 4 * (s.micro_batch * s.seq_len) as u64 * v,
        phases: Phases::ACTIVATION,
    });
    out
}

/// A phase of one optimizer step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The forward pass.
    Forward,
    /// The backward pass (with recomputation when checkpointing).
    Backward,
    /// The optimizer update.
    Optimizer,
}

impl Phases {
    /// Whether the tensor is alive in `phase`.
    pub fn includes(&self, phase: Phase) -> bool {
        self.persistent
            || match phase {
                Phase::Forward => self.forward,
                Phase::Backward => self.backward,
                Phase::Optimizer => self.optimizer,
            }
    }
}

/// Where the step's memory peaks.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Peak {
    /// The phase.
    pub phase: Phase,
    /// Bytes alive then.
    pub bytes: u64,
    /// The largest tensors alive then, largest first (at most five).
    pub largest: Vec<(String, u64)>,
}

/// Bytes alive in `phase`.
pub fn alive_in(entries: &[Entry], phase: Phase) -> u64 {
    entries
        .iter()
        .filter(|e| e.phases.includes(phase))
        .map(|e| e.bytes)
        .sum()
}

/// The phase with the most bytes alive, and what makes it.
pub fn peak(entries: &[Entry]) -> Peak {
    let phase = [Phase::Forward, Phase::Backward, Phase::Optimizer]
        .into_iter()
        .max_by_key(|&p| alive_in(entries, p))
        .unwrap_or(Phase::Forward);
    let mut alive: Vec<&Entry> = entries
        .iter()
        .filter(|e| e.phases.includes(phase))
        .collect();
    alive.sort_by(|a, b| b.bytes.cmp(&a.bytes));
    Peak {
        phase,
        bytes: alive_in(entries, phase),
        largest: alive
            .iter()
            .take(5)
            .map(|e| (e.name.clone(), e.bytes))
            .collect(),
    }
}

/// Bytes by kind.
pub fn totals_by_kind(entries: &[Entry]) -> BTreeMap<Kind, u64> {
    let mut totals = BTreeMap::new();
    for e in entries {
        *totals.entry(e.kind).or_insert(0) += e.bytes;
    }
    totals
}

/// Bytes by decoder block (None: outside the blocks).
pub fn totals_by_layer(entries: &[Entry]) -> BTreeMap<Option<usize>, u64> {
    let mut totals = BTreeMap::new();
    for e in entries {
        *totals.entry(e.layer).or_insert(0) += e.bytes;
    }
    totals
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::weights::weight_bytes;

    fn scenario(lora: Option<LoraConfig>, nf4: Option<Nf4Config>) -> Scenario {
        Scenario {
            config: LlamaConfig::smollm2_135m(),
            lora,
            nf4,
            optimizer: OptimizerKind::AdamW,
            micro_batch: 1,
            seq_len: 256,
            half_base: false,
        }
    }

    /// The inventory's resident weights agree with the resident-bytes arithmetic the memory
    /// tests measure (1.002 measured/predicted), and its trainable counts with the configs'.
    #[test]
    fn inventory_agrees_with_the_parameter_arithmetic() {
        let c = LlamaConfig::smollm2_135m();
        for nf4 in [None, Some(Nf4Config::default())] {
            let totals = totals_by_kind(&inventory(&scenario(None, nf4)));
            let w = weight_bytes(&c, 4, nf4.as_ref());
            assert_eq!(totals[&Kind::Weights], w.float);
            assert_eq!(totals.get(&Kind::QuantCodes).copied().unwrap_or(0), w.codes);
            assert_eq!(
                totals.get(&Kind::QuantScales).copied().unwrap_or(0),
                w.scales
            );
        }
        // Full fine-tuning with AdamW: gradients 4 and state 8 bytes per parameter.
        let full = totals_by_kind(&inventory(&scenario(None, None)));
        assert_eq!(full[&Kind::Gradients], 4 * c.num_parameters());
        assert_eq!(full[&Kind::OptimizerState], 8 * c.num_parameters());
        // LoRA r=16 on all linears: adapters as peft counts them, gradients and state only there.
        let lora = LoraConfig::default();
        let trainable = lora.trainable_parameters(&c);
        let totals = totals_by_kind(&inventory(&scenario(
            Some(lora),
            Some(Nf4Config::default()),
        )));
        assert_eq!(totals[&Kind::Adapters], 4 * trainable);
        assert_eq!(totals[&Kind::Gradients], 4 * trainable);
        assert_eq!(totals[&Kind::OptimizerState], 8 * trainable);
        assert_eq!(totals[&Kind::Logits], 4 * 256 * 49_152);
    }

    /// Gradients appear in the backward, so with full fine-tuning the backward holds the most;
    /// the optimizer phase no longer holds the logits.
    #[test]
    fn the_peak_is_in_the_backward_of_full_fine_tuning() {
        let entries = inventory(&scenario(None, None));
        let peak = peak(&entries);
        assert_eq!(peak.phase, Phase::Backward);
        let totals = totals_by_kind(&entries);
        assert_eq!(
            peak.bytes,
            totals[&Kind::Weights]
                + totals[&Kind::Gradients]
                + totals[&Kind::OptimizerState]
                + totals[&Kind::Logits]
        );
        assert_eq!(
            alive_in(&entries, Phase::Optimizer),
            peak.bytes - totals[&Kind::Logits]
        );
        assert_eq!(
            peak.largest[0].0, "embed_tokens.optimizer_state",
            "of the 49152 × 576 embedding"
        );
    }
}
