//! One optimizer step replayed event by event over the inventory: which tensors are alive
//! after each block's forward, at the loss, during each block's backward and at the optimizer
//! update; the peak is the largest of these, with the tensors that make it.
//!
//! The order is napkin's engine's (`train/step.rs`): a plain step runs the whole forward with
//! its graph, then the backward from the loss down, each block's kept tensors freed as its
//! backward finishes and its gradients appearing. With checkpointing the forward keeps only
//! each block's input; the backward recomputes one block at a time with its graph (an event
//! of its own: the recomputation's last product, with all the block keeps, can be the step's
//! peak). DPO runs a graph-free reference forward of each micro-batch first: the residual
//! stream and the forward's tables with one block's transients at a time, then the reference
//! logits. With accumulation
//! the gradients of the earlier micro-batches stay alive through the
//! later ones, and each micro-batch's gradients exist beside the running sum until they are
//! added.

use std::collections::BTreeMap;

use serde::Serialize;

use super::inventory::{CHUNKED_LOSS, Entry, HEAD_INPUT, Kind, Phase, Scenario, inventory};

/// The bytes alive at one point of the step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Event {
    /// What just happened (`forward.layers.3`, `backward.loss`, `optimizer`).
    pub label: String,
    /// The phase it belongs to.
    pub phase: Phase,
    /// The micro-batch (0-based; the optimizer update counts as the last).
    pub micro_batch: usize,
    /// Bytes alive.
    pub bytes: u64,
}

/// The step's peak: where it happens and what makes it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepPeak {
    /// The event.
    pub label: String,
    /// Its phase.
    pub phase: Phase,
    /// Bytes alive then.
    pub bytes: u64,
    /// Bytes alive then, by kind.
    pub by_kind: BTreeMap<Kind, u64>,
    /// The largest of the step's own tensors alive then (not the weights and optimizer state
    /// that live across steps), largest first, at most eight.
    pub largest: Vec<(String, u64)>,
}

/// The replayed step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepTimeline {
    /// Every event in order.
    pub events: Vec<Event>,
    /// The largest.
    pub peak: StepPeak,
    /// Bytes that live across steps (weights, codes, scales, adapters, optimizer state).
    pub persistent: u64,
}

/// The tensors alive at a moment.
#[derive(Default)]
struct Alive {
    tensors: BTreeMap<String, (Kind, u64)>,
    persistent: std::collections::BTreeSet<String>,
    events: Vec<Event>,
    peak: Option<StepPeak>,
    micro_batch: usize,
}

impl Alive {
    fn add(&mut self, e: &Entry) {
        self.add_as(e.name.clone(), e);
    }

    fn add_as(&mut self, name: String, e: &Entry) {
        self.tensors.insert(name, (e.kind, e.bytes));
    }

    fn remove(&mut self, name: &str) {
        self.tensors.remove(name);
    }

    fn bytes(&self) -> u64 {
        self.tensors.values().map(|&(_, b)| b).sum()
    }

    fn event(&mut self, label: String, phase: Phase) {
        let bytes = self.bytes();
        if self.peak.as_ref().is_none_or(|p| bytes > p.bytes) {
            let mut by_kind = BTreeMap::new();
            for &(kind, b) in self.tensors.values() {
                *by_kind.entry(kind).or_insert(0) += b;
            }
            let mut largest: Vec<(String, u64)> = self
                .tensors
                .iter()
                .filter(|(name, _)| !self.persistent.contains(*name))
                .map(|(name, &(_, b))| (name.clone(), b))
                .collect();
            largest.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            largest.truncate(8);
            self.peak = Some(StepPeak {
                label: label.clone(),
                phase,
                bytes,
                by_kind,
                largest,
            });
        }
        self.events.push(Event {
            label,
            phase,
            micro_batch: self.micro_batch,
            bytes,
        });
    }
}

/// Replays one optimizer step of `s`.
pub fn step_timeline(s: &Scenario) -> StepTimeline {
    let entries = inventory(s);
    let select =
        |f: &dyn Fn(&Entry) -> bool| -> Vec<&Entry> { entries.iter().filter(|e| f(e)).collect() };
    let named = |name: &str| entries.iter().find(|e| e.name == name);
    let persistent = select(&|e| e.phases.persistent);
    let grads_of =
        |layer: Option<usize>| select(&|e| e.kind == Kind::Gradients && e.layer == layer);
    let kept_of =
        |layer: Option<usize>| select(&|e| e.kind == Kind::SavedActivations && e.layer == layer);
    let is_table = |e: &Entry| e.name.starts_with("rope.") || e.name == "attention_mask";
    // `layers.3.input_layernorm.…` and `layers.3.self_attn.…` belong to a block's first half.
    let attention_half = |e: &Entry| {
        let local = e.name.splitn(3, '.').nth(2).unwrap_or("");
        local.starts_with("input_layernorm.") || local.starts_with("self_attn.")
    };
    let layers = s.config.num_hidden_layers;

    let mut alive = Alive::default();
    for e in &persistent {
        alive.add(e);
        alive.persistent.insert(e.name.clone());
    }
    let accumulation = s.accumulation.max(1);
    for micro in 0..accumulation {
        alive.micro_batch = micro;
        // The gradients of this micro-batch: the running sum itself for the first, a second
        // set beside it for the others until they are added.
        let grad_name = |e: &Entry| {
            if micro == 0 {
                e.name.clone()
            } else {
                format!("{} (micro-batch {micro})", e.name)
            }
        };
        let outside = kept_of(None);
        // DPO: the reference forward of this micro-batch, graph-free, before the policy's: the
        // stream and the forward's tables (RoPE, the mask) through the blocks, the tables
        // freed before the head.
        if let Some(hidden) = named("reference.hidden") {
            alive.add(hidden);
            let tables = named("reference.tables");
            if let Some(t) = tables {
                alive.add(t);
            }
            for layer in 0..layers {
                let name = format!("reference.layers.{layer}.forward_workspace");
                if let Some(w) = named(&name) {
                    alive.add(w);
                    alive.event(format!("reference.layers.{layer}"), Phase::Forward);
                    alive.remove(&w.name);
                }
            }
            if let Some(t) = tables {
                alive.remove(&t.name);
            }
            if let Some(logits) = named("reference.logits") {
                alive.add(logits);
                alive.event("reference.logits".into(), Phase::Forward);
                alive.remove(&logits.name);
            }
            alive.remove(&hidden.name);
        }
        for e in outside
            .iter()
            .filter(|e| !s.checkpoints_blocks() || is_table(e))
        {
            alive.add(e);
        }
        for layer in 0..layers {
            if s.checkpoints_blocks() {
                if let Some(input) = named(&format!("layers.{layer}.checkpoint_input")) {
                    alive.add(input);
                }
                let workspace = named(&format!("layers.{layer}.self_attn.forward_workspace"));
                if let Some(w) = workspace {
                    alive.add(w);
                }
                alive.event(format!("forward.layers.{layer}"), Phase::Forward);
                if let Some(w) = workspace {
                    alive.remove(&w.name);
                }
            } else {
                for e in kept_of(Some(layer)) {
                    alive.add(e);
                }
                alive.event(format!("forward.layers.{layer}"), Phase::Forward);
            }
        }
        for e in &outside {
            alive.add(e);
        }
        if let Some(top) = named(HEAD_INPUT) {
            alive.add(top);
        }
        // The loss keeps the logits; its backward writes their gradient in place, which
        // lives until the head's backward has used it. The chunked loss keeps none: one
        // chunk's at a time exist while it runs.
        let logits = named("logits");
        if let Some(logits) = logits {
            alive.add(logits);
            // A head adapter's product, beside the logits until it is added to them.
            if let Some(w) = named("lm_head.lora_workspace") {
                alive.add(w);
                alive.event("forward.lm_head.lora".into(), Phase::Forward);
                alive.remove(&w.name);
            }
            alive.event("forward.loss".into(), Phase::Forward);
        }
        if let Some(chunks) = named(CHUNKED_LOSS) {
            alive.add(chunks);
            alive.event("forward.loss".into(), Phase::Forward);
            alive.remove(&chunks.name);
        }

        // The loss backward, then the head's.
        let transient = |alive: &mut Alive, name: &str, label: &str| {
            if let Some(w) = named(name) {
                alive.add(w);
                alive.event(label.into(), Phase::Backward);
                alive.remove(&w.name);
            }
        };
        alive.event("backward.loss".into(), Phase::Backward);
        for e in outside.iter().filter(|e| e.name.starts_with("loss.")) {
            alive.remove(&e.name);
        }
        for e in grads_of(None)
            .into_iter()
            .filter(|e| !e.name.starts_with("embed_tokens") || s.config.tie_word_embeddings)
        {
            alive.add_as(grad_name(e), e);
        }
        transient(&mut alive, "lm_head.backward_workspace", "backward.lm_head");
        if let Some(logits) = logits {
            alive.remove(&logits.name);
        }
        for e in outside
            .iter()
            .filter(|e| e.name.starts_with("lm_head.") || e.name.starts_with("norm."))
        {
            alive.remove(&e.name);
        }
        alive.remove(HEAD_INPUT);

        for layer in (0..layers).rev() {
            let kept = kept_of(Some(layer));
            if s.checkpoints_blocks() {
                for e in &kept {
                    alive.add(e);
                }
                transient(
                    &mut alive,
                    &format!("layers.{layer}.recompute_workspace"),
                    &format!("backward.layers.{layer}.recompute"),
                );
            }
            // The MLP half's backward runs first, then the attention half's. Each begins with
            // its output projection, whose gradient appears while the half's kept tensors and
            // workspace are alive; the half's other gradients appear as those are freed.
            let (attention_grads, mlp_grads): (Vec<&Entry>, Vec<&Entry>) = grads_of(Some(layer))
                .into_iter()
                .partition(|e| attention_half(e));
            let halves: [(&str, Vec<&Entry>, Vec<&Entry>); 2] = [
                (
                    "mlp",
                    mlp_grads,
                    kept.iter()
                        .copied()
                        .filter(|e| !attention_half(e))
                        .collect(),
                ),
                (
                    "self_attn",
                    attention_grads,
                    kept.iter().copied().filter(|e| attention_half(e)).collect(),
                ),
            ];
            for (half, grads, half_kept) in halves {
                let output_projection =
                    |e: &&&Entry| e.name.contains(".down_proj.") || e.name.contains(".o_proj.");
                for e in grads.iter().filter(output_projection) {
                    alive.add_as(grad_name(e), e);
                }
                transient(
                    &mut alive,
                    &format!("layers.{layer}.{half}.backward_workspace"),
                    &format!("backward.layers.{layer}.{half}"),
                );
                for e in half_kept {
                    alive.remove(&e.name);
                }
                for e in &grads {
                    alive.add_as(grad_name(e), e);
                }
            }
            if let Some(input) = named(&format!("layers.{layer}.checkpoint_input")) {
                alive.remove(&input.name);
            }
        }
        for e in grads_of(None) {
            alive.add_as(grad_name(e), e);
        }
        alive.event("backward.embed_tokens".into(), Phase::Backward);
        for e in &outside {
            alive.remove(&e.name);
        }
        if micro > 0 {
            for e in select(&|e| e.kind == Kind::Gradients) {
                alive.remove(&grad_name(e));
            }
        }
    }
    alive.event("optimizer".into(), Phase::Optimizer);

    let persistent = persistent.iter().map(|e| e.bytes).sum();
    let Alive { events, peak, .. } = alive;
    StepTimeline {
        peak: peak.unwrap_or(StepPeak {
            label: String::new(),
            phase: Phase::Optimizer,
            bytes: 0,
            by_kind: BTreeMap::new(),
            largest: Vec::new(),
        }),
        events,
        persistent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{LlamaConfig, LoraConfig, Nf4Config};

    fn smollm2(lora: bool, checkpointing: bool, accumulation: usize) -> Scenario {
        Scenario {
            lora: lora.then(LoraConfig::default),
            nf4: lora.then(Nf4Config::default),
            checkpointing,
            accumulation,
            ..Scenario::new(LlamaConfig::smollm2_135m(), 1, 256)
        }
    }

    /// Checkpointing keeps one block's activations instead of all 30: the peak falls by more
    /// than 25 blocks' worth, and the largest tensor at the peak is no longer a block's.
    #[test]
    fn checkpointing_keeps_one_block_instead_of_all() {
        let plain = step_timeline(&smollm2(true, false, 1));
        let ckpt = step_timeline(&smollm2(true, true, 1));
        let entries = inventory(&smollm2(true, false, 1));
        let block: u64 = entries
            .iter()
            .filter(|e| e.kind == Kind::SavedActivations && e.layer == Some(10))
            .map(|e| e.bytes)
            .sum();
        assert!(plain.peak.bytes - ckpt.peak.bytes > 25 * block);
        assert_eq!(plain.persistent, ckpt.persistent);
    }

    /// With full fine-tuning and accumulation, a micro-batch's gradients exist beside the
    /// running sum: the peak grows by about one set of gradients over a single micro-batch.
    #[test]
    fn accumulation_holds_a_second_set_of_gradients() {
        let one = step_timeline(&smollm2(false, true, 1));
        let four = step_timeline(&smollm2(false, true, 4));
        let grads = inventory(&smollm2(false, true, 1))
            .iter()
            .filter(|e| e.kind == Kind::Gradients)
            .map(|e| e.bytes)
            .sum::<u64>();
        let extra = four.peak.bytes - one.peak.bytes;
        assert!(
            extra > grads * 9 / 10 && extra <= grads,
            "{extra} vs {grads}"
        );
        assert_eq!(four.events.len(), 4 * (one.events.len() - 1) + 1);
    }
}
