//! One inventory of named tensors for a training scenario: each with its kind, its bytes and
//! the phases in which it is alive. The predictor sums it, the measurement attaches to the same
//! names, the charts draw it. A new trick edits this list; it does not fork the code.
//!
//! Names follow the module tree (`layers.3.self_attn.q_proj.lora_A`). It holds the state that
//! lives across steps — weights, NF4 codes and scales, adapters, gradients, optimizer state —
//! exactly as napkin's engine stores it; the activations the forward keeps for the backward,
//! named by the op that produced them (see `activations`); the block inputs that gradient
//! checkpointing keeps instead; and the short-lived workspaces of the step's largest ops.
//! When each of them is alive in one optimizer step is the business of `timeline`.

use std::collections::BTreeMap;

use serde::Serialize;

use super::activations::{LinearCompute, Trainable, kept_activations};
use super::recompute::is_recomputed;
use super::row_layout::{RowLayout, Size};
use super::workspace;
use crate::config::{
    AttentionKind, Kernels, LlamaConfig, LoraConfig, LoraTarget, Nf4Config, ObjectiveKind,
    OptimizerKind,
};
use crate::predict::weights::nf4_tensor_bytes;
use crate::quant::blockwise8::adamw8bit_state_bytes;

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
    /// Activations kept from the forward for the backward (and burn's graph that holds them).
    SavedActivations,
    /// Block inputs kept by gradient checkpointing.
    CheckpointInputs,
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
    /// B: rows per micro-batch (a preference objective: pairs, one row each).
    pub micro_batch: usize,
    /// T: tokens per row (a preference objective: the row holds a pair's two sequences, so
    /// up to twice the sequence length; [`StepSettings`](super::settings::StepSettings) maps it).
    pub seq_len: usize,
    /// What the step minimises: a preference objective runs pair rows, and DPO a graph-free
    /// reference forward of each micro-batch before the policy's.
    pub objective: ObjectiveKind,
    /// The linear layers compute in bf16/f16 (napkin's autocast): each product keeps the
    /// 2-byte cast copies of its operands instead of the f32 tensors, and a LoRA run stores
    /// its frozen dense base in 16 bits ([`Scenario::half_base`]).
    pub half_compute: bool,
    /// Block-level gradient checkpointing.
    pub checkpointing: bool,
    /// The head and the loss a chunk of rows at a time (`model::chunked_loss`): no whole
    /// `[B·T, V]` logits, one chunk's at a time.
    pub chunked_loss: bool,
    /// Micro-batches per optimizer step (1: none).
    pub accumulation: usize,
    /// Packed rows (one attention mask per row instead of one shared).
    pub packed: bool,
    /// Eager attention (keeps `[B, H, T, T]` tensors) or the tiled, memory-efficient one.
    pub attention: AttentionKind,
    /// napkin's fused CPU kernels or burn's ops (the GPU backends) for the element-wise layers.
    pub kernels: Kernels,
    /// How the device lays rows out: contiguous, or pitched (CUDA pads each row).
    pub rows: RowLayout,
}

/// [`Scenario::attention_value_bytes`] from its two settings.
pub fn attention_value_bytes(half_compute: bool, kernels: Kernels) -> u64 {
    match half_compute && kernels == Kernels::FusedGpu {
        true => 2,
        false => 4,
    }
}

impl Scenario {
    /// A scenario with AdamW, f32, no checkpointing, no accumulation.
    pub fn new(config: LlamaConfig, micro_batch: usize, seq_len: usize) -> Self {
        Scenario {
            config,
            lora: None,
            nf4: None,
            optimizer: OptimizerKind::AdamW,
            micro_batch,
            seq_len,
            objective: ObjectiveKind::Sft,
            half_compute: false,
            checkpointing: false,
            chunked_loss: false,
            accumulation: 1,
            packed: false,
            attention: AttentionKind::Eager,
            kernels: Kernels::FusedCpu,
            rows: RowLayout::Contiguous,
        }
    }

    /// Whether the frozen dense base is stored in 2-byte floats: LoRA under 16-bit autocast
    /// (`Llama::cast_frozen_base`). An NF4 base is 4-bit already; full fine-tuning trains the
    /// block linears in f32. Derived, never set, so every caller maps the settings the same way.
    pub fn half_base(&self) -> bool {
        self.half_compute && self.lora.is_some() && self.nf4.is_none()
    }

    /// Bytes a value of the eager attention's `[B, H, T, T]` tensors takes: 2 under autocast
    /// on a GPU, whose attention computes in 16 bits (`model/attention.rs`), else 4.
    pub fn attention_value_bytes(&self) -> u64 {
        attention_value_bytes(self.half_compute, self.kernels)
    }

    /// What the step trains.
    pub fn trainable(&self) -> Trainable<'_> {
        Trainable {
            embedding_and_norms: self.lora.is_none(),
            block_linears: self.lora.is_none() && self.nf4.is_none(),
            lora: self.lora.as_ref(),
        }
    }

    /// Parameters the optimizer updates: every one, or the LoRA adapters'.
    pub fn trainable_parameters(&self) -> u64 {
        self.lora
            .as_ref()
            .map_or(self.config.num_parameters(), |l| {
                l.trainable_parameters(&self.config)
            })
    }

    /// Whether the step checkpoints its blocks: asked for, and something below the LM head
    /// trains (with an adapter on the head alone, the blocks run without a graph and keep
    /// nothing to recompute; `train/step.rs` then runs the plain step).
    pub fn checkpoints_blocks(&self) -> bool {
        self.checkpointing
            && self
                .lora
                .as_ref()
                .is_none_or(|l| !l.targets.is_empty() || l.embedding)
    }

    /// B·T.
    pub fn tokens(&self) -> u64 {
        (self.micro_batch * self.seq_len) as u64
    }

    /// Whether the step runs the chunked loss: asked for, with a frozen head (LoRA without an
    /// adapter on it; `StepSettings::check` refuses the rest).
    pub fn chunks_loss(&self) -> bool {
        self.chunked_loss && self.lora.as_ref().is_some_and(|l| !l.head)
    }

    /// The logits rows a chunk of the chunked loss takes, where the step runs it
    /// ([`Scenario::chunks_loss`]); None: the whole logits at once.
    pub fn loss_chunk_rows(&self) -> Option<usize> {
        self.chunks_loss()
            .then(|| crate::config::default_chunk_rows(self.config.vocab_size))
    }
}

/// Bytes of one f32 value.
const F32: u64 = 4;

/// The checkpointed step's head input (`[B·T, D]`).
pub const HEAD_INPUT: &str = "head.checkpoint_input";

/// The entry of the chunked loss's transients (`model/chunked_loss.rs`), in the forward.
pub const CHUNKED_LOSS: &str = "loss.chunks_workspace";
/// The entry of the optimizer state's map (host memory; in a CPU inventory only).
pub const OPTIMIZER_MAP: &str = "optimizer.map";
/// The entry of the gradients' map (host memory; in a CPU inventory only).
pub const GRADIENTS_MAP: &str = "gradients.map";
/// The entry of burn's bookkeeping of the parameter tensors (CPU backends), beside their values.
pub const PARAMETER_BOOKKEEPING: &str = "parameters.bookkeeping";

/// The inventory of a scenario.
pub fn inventory(s: &Scenario) -> Vec<Entry> {
    let c = &s.config;
    let (v, d) = (c.vocab_size as u64, c.hidden_size as u64);
    let full = s.lora.is_none();
    let f32_bytes = |size: Size| s.rows.bytes(size, F32);
    let mut out = Vec::new();
    // A trainable tensor brings its gradient and its optimizer state. Both take their values'
    // bytes on every device: on CUDA too, as measured (napkin's update kernels allocate their
    // state contiguous; the gradients the backward leaves were measured unpadded).
    let trainable = |out: &mut Vec<Entry>, name: &str, layer: Option<usize>, size: Size| {
        let n = size.values;
        out.push(Entry {
            name: format!("{name}.grad"),
            layer,
            kind: Kind::Gradients,
            bytes: F32 * n,
            phases: Phases::GRADIENT,
        });
        let state = match s.optimizer {
            OptimizerKind::AdamW => 2 * F32 * n,
            OptimizerKind::AdamW8bit => adamw8bit_state_bytes(n as usize),
            OptimizerKind::Sgd => F32 * n,
        };
        out.push(Entry {
            name: format!("{name}.optimizer_state"),
            layer,
            kind: Kind::OptimizerState,
            bytes: state,
            phases: Phases::ALWAYS,
        });
    };
    let weight = |name: &str, layer: Option<usize>, size: Size| Entry {
        name: name.to_string(),
        layer,
        kind: Kind::Weights,
        bytes: f32_bytes(size),
        phases: Phases::ALWAYS,
    };

    // [V, D]
    out.push(weight("embed_tokens", None, Size::rows(v, d)));
    if full {
        trainable(&mut out, "embed_tokens", None, Size::rows(v, d));
    }
    for layer in 0..c.num_hidden_layers {
        let l = Some(layer);
        // The block's norms: two `[D]`, and Qwen3's `[Dh]` q and k head norms.
        let head_norms = match c.qk_norm {
            true => &["self_attn.q_norm", "self_attn.k_norm"][..],
            false => &[],
        };
        let norms = [("input_layernorm", d), ("post_attention_layernorm", d)]
            .into_iter()
            .chain(head_norms.iter().map(|&n| (n, c.head_dim as u64)));
        for (norm, width) in norms {
            let name = format!("layers.{layer}.{norm}");
            out.push(weight(&name, l, Size::flat(width)));
            if full {
                trainable(&mut out, &name, l, Size::flat(width));
            }
        }
        for (&(module, rows, cols), target) in c.block_linears().iter().zip(LoraTarget::ALL) {
            let name = format!("layers.{layer}.{}", target.block_path());
            let (rows, cols) = (rows as u64, cols as u64);
            // Qwen2's q, k, v biases: f32 `[out]` under NF4 and a 16-bit base too.
            if c.linear_has_bias(module) {
                let bias = format!("{name}.bias");
                out.push(weight(&bias, l, Size::flat(rows)));
                if full {
                    trainable(&mut out, &bias, l, Size::flat(rows));
                }
            }
            let n = rows * cols;
            match &s.nf4 {
                Some(nf4) => {
                    // One-dimensional buffers on every device: codes, scales.
                    let (codes, scales) = nf4_tensor_bytes(n, nf4);
                    let (codes, scales) = (
                        s.rows.bytes(Size::flat(codes), 1),
                        s.rows.bytes(Size::flat(scales), 1),
                    );
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
                    // [out, in]
                    let size = Size::rows(rows, cols);
                    let bytes_per = if s.half_base() && !full { 2 } else { 4 };
                    out.push(Entry {
                        bytes: s.rows.bytes(size, bytes_per),
                        ..weight(&format!("{name}.weight"), l, size)
                    });
                    if full {
                        trainable(&mut out, &format!("{name}.weight"), l, size);
                    }
                }
            }
            if let Some(lora) = &s.lora
                && lora.targets(target)
            {
                let r = lora.r as u64;
                // A: [r, in], B: [out, r]; DoRA's magnitude: [out]
                let magnitude = lora
                    .use_dora
                    .then_some(("lora_magnitude", Size::flat(rows)));
                for (part, size) in [
                    ("lora_A", Size::rows(r, cols)),
                    ("lora_B", Size::rows(rows, r)),
                ]
                .into_iter()
                .chain(magnitude)
                {
                    let adapter = format!("{name}.{part}");
                    out.push(Entry {
                        name: adapter.clone(),
                        layer: l,
                        kind: Kind::Adapters,
                        bytes: f32_bytes(size),
                        phases: Phases::ALWAYS,
                    });
                    trainable(&mut out, &adapter, l, size);
                }
                // DoRA keeps the frozen base's squared row norms beside the magnitude, for the
                // norm without the weight-sized `W + s·BA` (`model/lora.rs`): not trained.
                if lora.use_dora {
                    out.push(Entry {
                        name: format!("{name}.lora_base_row_squares"),
                        layer: l,
                        kind: Kind::Adapters,
                        bytes: f32_bytes(Size::flat(rows)),
                        phases: Phases::ALWAYS,
                    });
                }
            }
        }
    }
    // Adapters outside the blocks: the embedding's A `[r, V]` and B `[D, r]`; the untied
    // head's A `[r, D]` and B `[V, r]` (with DoRA, its magnitude and kept squares `[V]`).
    if let Some(lora) = s.lora.as_ref().filter(|l| l.embedding || l.head) {
        let r = lora.r as u64;
        let adapter = |out: &mut Vec<Entry>, name: String, size: Size, trains: bool| {
            out.push(Entry {
                name: name.clone(),
                layer: None,
                kind: Kind::Adapters,
                bytes: f32_bytes(size),
                phases: Phases::ALWAYS,
            });
            if trains {
                trainable(out, &name, None, size);
            }
        };
        if lora.embedding {
            adapter(
                &mut out,
                "embed_tokens.lora_A".into(),
                Size::rows(r, v),
                true,
            );
            adapter(
                &mut out,
                "embed_tokens.lora_B".into(),
                Size::rows(d, r),
                true,
            );
        }
        if lora.head {
            adapter(&mut out, "lm_head.lora_A".into(), Size::rows(r, d), true);
            adapter(&mut out, "lm_head.lora_B".into(), Size::rows(v, r), true);
            if lora.use_dora {
                adapter(
                    &mut out,
                    "lm_head.lora_magnitude".into(),
                    Size::flat(v),
                    true,
                );
                adapter(
                    &mut out,
                    "lm_head.lora_base_row_squares".into(),
                    Size::flat(v),
                    false,
                );
            }
        }
    }
    out.push(weight("norm", None, Size::flat(d)));
    if full {
        trainable(&mut out, "norm", None, Size::flat(d));
    }
    if !c.tie_word_embeddings {
        out.push(weight("lm_head", None, Size::rows(v, d)));
        if full {
            trainable(&mut out, "lm_head", None, Size::rows(v, d));
        }
    }
    // On the CPU backends every parameter tensor (embedding, norms, dense weights, head,
    // adapters; not the NF4 codes, which are no burn parameters) also costs burn's bookkeeping
    // in the same heap.
    if s.kernels.graph_beside_tensors() {
        let parameters = out
            .iter()
            .filter(|e| matches!(e.kind, Kind::Weights | Kind::Adapters))
            .count() as u64;
        out.push(Entry {
            name: PARAMETER_BOOKKEEPING.into(),
            layer: None,
            kind: Kind::Weights,
            bytes: workspace::parameter_bytes() * parameters,
            phases: Phases::ALWAYS,
        });
    }
    // The optimizer's and the gradients' maps (one entry per tensor) are host memory: the
    // device's own on the CPU backends, beside it on a GPU, where the device pool does not see
    // them (measured on CUDA: the gradients take their values' bytes exactly).
    if s.kernels.graph_beside_tensors() {
        let gradient_tensors = out.iter().filter(|e| e.kind == Kind::Gradients).count() as u64;
        out.push(Entry {
            name: OPTIMIZER_MAP.into(),
            layer: None,
            kind: Kind::OptimizerState,
            bytes: workspace::optimizer_map_bytes(s.optimizer, gradient_tensors),
            phases: Phases::ALWAYS,
        });
        out.push(Entry {
            name: GRADIENTS_MAP.into(),
            layer: None,
            kind: Kind::Gradients,
            bytes: workspace::gradient_map_bytes(gradient_tensors),
            phases: Phases::GRADIENT,
        });
    }
    out.extend(activation_entries(s));
    out
}

/// What the forward keeps, the checkpointed block inputs, the logits and the workspaces.
fn activation_entries(s: &Scenario) -> Vec<Entry> {
    let c = &s.config;
    let n = s.tokens();
    let mut out = Vec::new();
    let keeps = kept_activations(
        c,
        s.trainable(),
        s.micro_batch,
        s.seq_len,
        s.packed,
        s.attention,
        s.kernels,
        LinearCompute {
            half: s.half_compute,
            nf4_base: s.nf4.is_some(),
            half_base: s.half_base(),
        },
        s.rows,
        s.chunked_loss,
    );
    // The blocks whose down projection keeps its input (`silu(gate)·up`) as an f32 tensor.
    let down_input_kept: Vec<usize> = keeps
        .tensors
        .iter()
        .filter(|k| k.name.ends_with(".mlp.swiglu") && k.bytes_per_value == F32)
        .filter_map(|k| k.layer)
        .collect();
    // With checkpointing a block's kept tensors exist only while its backward recomputes it.
    let recomputed = |layer: Option<usize>| s.checkpoints_blocks() && layer.is_some();
    let kept_phases = |layer| Phases {
        forward: !recomputed(layer),
        ..Phases::ACTIVATION
    };
    for kept in keeps.tensors {
        out.push(Entry {
            phases: kept_phases(kept.layer),
            bytes: kept.bytes(s.rows),
            name: kept.name,
            layer: kept.layer,
            kind: Kind::SavedActivations,
        });
    }
    let graph_ops = keeps
        .recorded_ops
        .iter()
        .filter(|_| s.kernels.graph_beside_tensors());
    for (&layer, &ops) in graph_ops {
        out.push(Entry {
            name: match layer {
                Some(l) => format!("layers.{l}.autodiff_graph"),
                None => "autodiff_graph".into(),
            },
            layer,
            kind: Kind::SavedActivations,
            bytes: ops * workspace::GRAPH_BYTES_PER_OP,
            phases: kept_phases(layer),
        });
    }
    if s.checkpoints_blocks() {
        for layer in 0..c.num_hidden_layers {
            out.push(Entry {
                name: format!("layers.{layer}.checkpoint_input"),
                layer: Some(layer),
                kind: Kind::CheckpointInputs,
                bytes: s.rows.bytes(Size::rows(n, c.hidden_size as u64), F32),
                phases: Phases::ACTIVATION,
            });
        }
        // The last block's output, the head's input: a leaf of the head's graph, alive from
        // the end of the forward until the head's backward (`train/step.rs`: `top`); no block
        // input, so a workspace of the step's middle, not a checkpoint input.
        out.push(Entry {
            name: HEAD_INPUT.into(),
            layer: None,
            kind: Kind::Workspace,
            bytes: s.rows.bytes(Size::rows(n, c.hidden_size as u64), F32),
            phases: Phases::ACTIVATION,
        });
    }
    match s.loss_chunk_rows() {
        // The chunked loss keeps no logits: one chunk's at a time exist while it runs.
        Some(rows) => out.push(Entry {
            name: CHUNKED_LOSS.into(),
            layer: None,
            kind: Kind::Workspace,
            bytes: chunked_loss_bytes(s, rows as u64),
            phases: Phases {
                forward: true,
                ..Phases::default()
            },
        }),
        None => out.push(Entry {
            name: "logits".into(),
            layer: None,
            kind: Kind::Logits,
            bytes: s.rows.bytes(Size::rows(n, c.vocab_size as u64), F32),
            // Kept by the loss for its backward, which turns them into their own gradient.
            phases: Phases::ACTIVATION,
        }),
    }
    out.extend(workspace::entries(s, &down_input_kept));
    out
}

/// The most the chunked loss (`model/chunked_loss.rs`) holds while it runs, beyond what the
/// forward keeps (its `G` is the replay's `loss.head_input_gradient`, counted from the start):
/// the final norm's output `[B·T, D]`, the chunks' `∂h` rows so far, and one chunk's logits
/// (`[R + 1, V]`, their gradient written over them) and `∂h` (`[R + 1, D]`); at the end the
/// chunks' `∂h` beside `G`, which they are joined into.
fn chunked_loss_bytes(s: &Scenario, chunk_rows: u64) -> u64 {
    let c = &s.config;
    let (n, d, v) = (s.tokens(), c.hidden_size as u64, c.vocab_size as u64);
    let row = |width: u64| s.rows.bytes(Size::rows(1, width), F32);
    let labels = n.saturating_sub(1);
    let chunk_rows = chunk_rows.max(1);
    let mut most = n * row(d); // the joining: the chunks' `∂h` and `G`
    let mut start = 0;
    while start < labels {
        let rows = chunk_rows.min(labels - start);
        // `G` is counted from the forward's start but made only after the chunks.
        let chunk = start * row(d) + (rows + 1) * (row(v) + row(d));
        most = most.max(chunk.saturating_sub(n * row(d)));
        start += rows;
    }
    n * row(d) + most
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

/// One block's bytes (or those outside the blocks) by the kinds a learner compares.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LayerBytes {
    /// `layers.3`, or `outside blocks`.
    pub layer: String,
    /// Float weights.
    pub weights: u64,
    /// NF4 codes and scales.
    pub quant: u64,
    /// LoRA adapters.
    pub adapters: u64,
    /// Gradients.
    pub gradients: u64,
    /// Optimizer state.
    pub optimizer_state: u64,
    /// Activations alive from the forward to the backward: what the block keeps for its
    /// backward, or with checkpointing its input alone.
    pub activations: u64,
    /// With checkpointing: the activations its backward recomputes, alive only while that
    /// backward runs (0 without checkpointing; see `recompute`).
    pub recomputed: u64,
}

/// Bytes per decoder block, then outside the blocks.
pub fn per_layer(entries: &[Entry], layers: usize) -> Vec<LayerBytes> {
    (0..layers)
        .map(Some)
        .chain([None])
        .map(|layer| {
            let sum_if = |keep: &dyn Fn(&Entry) -> bool| -> u64 {
                entries
                    .iter()
                    .filter(|e| e.layer == layer && keep(e))
                    .map(|e| e.bytes)
                    .sum()
            };
            let sum = |kinds: &[Kind]| sum_if(&|e| kinds.contains(&e.kind));
            LayerBytes {
                layer: layer.map_or("outside blocks".to_string(), |l| format!("layers.{l}")),
                weights: sum(&[Kind::Weights]),
                quant: sum(&[Kind::QuantCodes, Kind::QuantScales]),
                adapters: sum(&[Kind::Adapters]),
                gradients: sum(&[Kind::Gradients]),
                optimizer_state: sum(&[Kind::OptimizerState]),
                activations: sum(&[Kind::CheckpointInputs])
                    + sum_if(&|e| e.kind == Kind::SavedActivations && !is_recomputed(e)),
                recomputed: sum_if(&is_recomputed),
            }
        })
        .collect()
}

/// Activations kept for the backward (and burn's graph) by block (None: outside the blocks).
pub fn kept_by_layer(entries: &[Entry]) -> BTreeMap<Option<usize>, u64> {
    let mut totals = BTreeMap::new();
    for e in entries.iter().filter(|e| e.kind == Kind::SavedActivations) {
        *totals.entry(e.layer).or_insert(0) += e.bytes;
    }
    totals
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
    use crate::predict::weights::weight_bytes;

    fn scenario(lora: Option<LoraConfig>, nf4: Option<Nf4Config>) -> Scenario {
        Scenario {
            lora,
            nf4,
            ..Scenario::new(LlamaConfig::smollm2_135m(), 1, 256)
        }
    }

    /// The inventory's resident weights agree with the resident-bytes arithmetic the memory
    /// tests measure (1.002 measured/predicted), and its trainable counts with the configs'.
    #[test]
    fn inventory_agrees_with_the_parameter_arithmetic() {
        let c = LlamaConfig::smollm2_135m();
        for nf4 in [None, Some(Nf4Config::default())] {
            let entries = inventory(&scenario(None, nf4));
            let totals = totals_by_kind(&entries);
            let w = weight_bytes(&c, 4, nf4.as_ref());
            // Beside the values, burn's bookkeeping of each parameter tensor: embedding, 61
            // norms and, without NF4, 210 block linears (SmolLM2's head is tied).
            let parameters = if nf4.is_some() { 62 } else { 62 + 210 };
            let bookkeeping = entries
                .iter()
                .find(|e| e.name == PARAMETER_BOOKKEEPING)
                .map(|e| e.bytes);
            assert_eq!(bookkeeping, Some(workspace::parameter_bytes() * parameters));
            assert_eq!(
                totals[&Kind::Weights],
                w.float + workspace::parameter_bytes() * parameters
            );
            assert_eq!(totals.get(&Kind::QuantCodes).copied().unwrap_or(0), w.codes);
            assert_eq!(
                totals.get(&Kind::QuantScales).copied().unwrap_or(0),
                w.scales
            );
        }
        // Full fine-tuning with AdamW: gradients 4 and state 8 bytes per parameter.
        let full = totals_by_kind(&inventory(&scenario(None, None)));
        let map = |s: &Scenario| {
            inventory(s)
                .into_iter()
                .find(|e| e.name == "gradients.map")
                .map_or(0, |e| e.bytes)
        };
        let full_map = map(&scenario(None, None));
        assert_eq!(full[&Kind::Gradients], 4 * c.num_parameters() + full_map);
        let optimizer_map = |s: &Scenario| {
            inventory(s)
                .into_iter()
                .find(|e| e.name == "optimizer.map")
                .map_or(0, |e| e.bytes)
        };
        assert_eq!(
            full[&Kind::OptimizerState],
            8 * c.num_parameters() + optimizer_map(&scenario(None, None))
        );
        // LoRA r=16 on all linears: adapters as peft counts them, gradients and state only there.
        let lora = LoraConfig::default();
        let trainable = lora.trainable_parameters(&c);
        let totals = totals_by_kind(&inventory(&scenario(
            Some(lora.clone()),
            Some(Nf4Config::default()),
        )));
        assert_eq!(totals[&Kind::Adapters], 4 * trainable);
        let lora_map = map(&scenario(Some(lora.clone()), Some(Nf4Config::default())));
        assert_eq!(totals[&Kind::Gradients], 4 * trainable + lora_map);
        assert_eq!(
            totals[&Kind::OptimizerState],
            8 * trainable
                + optimizer_map(&scenario(Some(lora.clone()), Some(Nf4Config::default())))
        );
        assert_eq!(totals[&Kind::Logits], 4 * 256 * 49_152);
    }

    /// A checkpointed block's recomputation holds its down projection's input on top of what
    /// the block keeps only where the replay did not keep it already: full fine-tuning keeps
    /// it (the weight trains), LoRA on q and v does not; under autocast the kept copy is 16-bit
    /// and the f32 input is counted again.
    #[test]
    fn the_recomputation_counts_the_down_projections_input_once() {
        let c = LlamaConfig::smollm2_135m();
        let (n, d, f) = (256u64, c.hidden_size as u64, c.intermediate_size as u64);
        let qv = LoraConfig {
            targets: vec![LoraTarget::QProj, LoraTarget::VProj],
            ..LoraConfig::default()
        };
        let recompute = |s: Scenario| {
            let s = Scenario {
                checkpointing: true,
                ..s
            };
            inventory(&s)
                .into_iter()
                .find(|e| e.name == "layers.0.recompute_workspace")
                .map(|e| e.bytes)
        };
        let upstream = 4 * n * d;
        assert_eq!(recompute(scenario(None, None)), Some(upstream));
        assert_eq!(
            recompute(scenario(Some(qv.clone()), None)),
            Some(upstream + 4 * n * f)
        );
        let half = Scenario {
            half_compute: true,
            ..scenario(None, None)
        };
        assert_eq!(recompute(half), Some(upstream + 4 * n * f));
        assert!(
            !inventory(&scenario(Some(qv), None))
                .iter()
                .any(|e| e.name.ends_with("recompute_workspace")),
            "without checkpointing nothing is recomputed"
        );
    }
}
