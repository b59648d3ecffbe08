//! The activations a training forward keeps for its backward, named per op.
//!
//! The predictor replays napkin's forward (embedding, blocks, head, loss) op by op with the
//! rules burn's autodiff uses to decide what each op saves:
//! - `a·b`, `a/b`, `a @ b` (and napkin's `x·Wᵀ`): each operand is kept when the *other* one
//!   needs a gradient;
//! - `exp`, `sigmoid`, `sqrt`, `recip`, `log`: the input is kept when it needs a gradient;
//!   `x²` is `x·x` and keeps `x`;
//! - sums, means, adds, subtractions, scalar products, reshapes, transposes, slices,
//!   negation, concatenation: nothing but shapes.
//!
//! A tensor needs a gradient ("is tracked") when a trainable parameter is among its inputs,
//! directly or not. So under LoRA the first block's frozen input path keeps nothing, and the
//! attention keeps `q`, `k`, `v`, the shifted scores, their exponentials and the
//! probabilities only because gradients flow through them.
//!
//! On a GPU the eager attention's scale, mask and softmax are one op keeping the probabilities
//! only; under autocast there the attention keeps 16-bit casts of `q`, `k`, `v` and 16-bit
//! probabilities (2 bytes a value, `Replay::half_attention`).
//!
//! The memory-efficient attention is one custom op: it keeps `q`, `k`, `v`, its output and
//! one log-sum-exp per query row, and no `T × T` tensor (nor a dense mask) at all.
//!
//! napkin's fused CPU ops (`kernels/cpu/fused/`) are one op each: RMSNorm keeps its input and one
//! `1/rms` per row, SwiGLU its two inputs, the loss the logits and one log-sum-exp per
//! position, RoPE nothing (it rotates back from the shared tables). On the GPU backends
//! napkin's cubecl kernels run RMSNorm, RoPE and SwiGLU with the same keeps
//! ([`Kernels::FusedGpu`]), and the loss as burn's ops. Where burn's ops run a layer
//! ([`Kernels::BurnOps`], or the GPU's loss) it is replayed op by op: RMSNorm `x²`, `√`, `1/·`,
//! `x·r`, `w·(x·r)`; SwiGLU `σ(g)`, `g·σ(g)`, `silu(g)·u`; the loss burn's log-softmax (`exp`
//! of the shifted logits, `log` of their row sums), RoPE products with the tables (which keep
//! nothing of the projection).
//!
//! A kept tensor is counted once however many ops keep it (burn shares the buffer), under the
//! name of the op that produced it: `layers.3.mlp.gate_proj.output`. Weights and other
//! persistent tensors are kept by reference and cost nothing here.

use std::collections::{BTreeMap, BTreeSet};

use super::inventory::attention_value_bytes;
use super::link::causal_tile_mask_values;
use super::row_layout::{RowLayout, Size};
use crate::config::{AttentionKind, Kernels, LlamaConfig, LoraConfig, LoraTarget};

/// What the step trains, which decides what is tracked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Trainable<'a> {
    /// Embedding, norms and the untied head (full fine-tuning).
    pub embedding_and_norms: bool,
    /// The dense base weights of the block linears (full fine-tuning without NF4).
    pub block_linears: bool,
    /// LoRA adapters.
    pub lora: Option<&'a LoraConfig>,
}

/// One kept tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Kept {
    /// The producing op's name in the module tree.
    pub name: String,
    /// The block that produced it (None: embedding, head, loss, tables).
    pub layer: Option<usize>,
    /// Values, and the values in one row (the last dimension, which a pitched layout pads).
    pub size: Size,
    /// Bytes per value: 4 (f32), or 2 for the bf16/f16 cast copies a product keeps under
    /// autocast.
    pub bytes_per_value: u64,
}

impl Kept {
    /// Bytes on a device that lays rows out as `rows`.
    pub fn bytes(&self, rows: RowLayout) -> u64 {
        rows.bytes(self.size, self.bytes_per_value)
    }
}

/// How the linear layers compute, which decides what their products keep.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LinearCompute {
    /// Inside a bf16/f16 autocast region (`model/autocast.rs`): a product casts its input and
    /// weight to 16 bits and keeps those copies (2 bytes a value) instead of the f32 tensors;
    /// its 16-bit output is cast back to f32 (a cast keeps nothing).
    pub half: bool,
    /// The block linears' base is NF4: one custom op that keeps nothing, in any dtype.
    pub nf4_base: bool,
    /// The frozen dense base is stored in 16 bits already: its "cast" is the weight itself.
    pub half_base: bool,
}

/// What a forward keeps: the tensors, and how many ops it records in the autodiff graph.
#[derive(Debug, Clone, PartialEq)]
pub struct ForwardKeeps {
    /// The kept tensors, in production order.
    pub tensors: Vec<Kept>,
    /// Ops recorded in burn's graph per block (None: embedding, head, loss). Each holds a
    /// node, its parents and its saved state until the backward frees it.
    pub recorded_ops: BTreeMap<Option<usize>, u64>,
}

/// A value in the replay: which tensor it is (None: a parameter, kept by reference for free)
/// and whether it needs a gradient.
#[derive(Debug, Clone, Copy)]
struct Value {
    id: Option<usize>,
    tracked: bool,
}

/// The replayed forward: every tensor produced, and which of them some op keeps.
#[derive(Debug, Default)]
struct Replay {
    produced: Vec<Kept>,
    kept: BTreeSet<usize>,
    layer: Option<usize>,
    prefix: String,
    /// Ops recorded in the autodiff graph (tracked outputs), per block (None: outside).
    recorded: BTreeMap<Option<usize>, u64>,
    /// Fused CPU kernels or burn's ops for the element-wise layers.
    kernels: Kernels,
    /// How the linear layers compute.
    compute: LinearCompute,
    /// How the device lays rows out.
    rows: RowLayout,
}

impl Replay {
    /// What the replayed forward kept, in production order, and the ops it recorded.
    fn finish(self) -> ForwardKeeps {
        let Replay {
            produced,
            kept,
            recorded,
            ..
        } = self;
        ForwardKeeps {
            tensors: kept.into_iter().map(|id| produced[id].clone()).collect(),
            recorded_ops: recorded,
        }
    }

    fn produce(&mut self, name: &str, size: Size, tracked: bool) -> Value {
        self.produce_as(name, size, tracked, 4)
    }

    fn produce_as(&mut self, name: &str, size: Size, tracked: bool, bytes_per_value: u64) -> Value {
        self.record(tracked, 1);
        self.produced.push(Kept {
            name: format!("{}{name}", self.prefix),
            layer: self.layer,
            size,
            bytes_per_value,
        });
        Value {
            id: Some(self.produced.len() - 1),
            tracked,
        }
    }

    fn record(&mut self, tracked: bool, ops: u64) {
        if tracked {
            *self.recorded.entry(self.layer).or_insert(0) += ops;
        }
    }

    /// `ops` reshapes, transposes or slices of `x`: recorded, no new buffer.
    fn view(&mut self, x: Value, ops: u64) -> Value {
        self.record(x.tracked, ops);
        x
    }

    /// `[B, T, w]` → `[B·T, w]` for the products: a view of a contiguous tensor, but a copy of
    /// a pitched one whose rows are padded (merging dimensions across the padding cannot be a
    /// view; burn's reshape copies), made anew by every reshape.
    fn merge_rows(&mut self, x: Value, n: u64, width: u64) -> Value {
        if self.rows.pads(width, 4) {
            self.stateless("input_rows", &[x], Size::rows(n, width))
        } else {
            self.view(x, 1)
        }
    }

    /// Whether splitting a projection of `width`-value rows into heads (`[B, T, n·Dh]` →
    /// `[B, T, n, Dh]`) copies it, which only a padded (so non-contiguous) projection can make
    /// it do. burn's reshape analysis (burn-std 0.22 `reshape_analysis`) calls the split a view
    /// for `B > 1`, but with `B = 1` it skips the new shape's leading 1 and not the old one's,
    /// finds the dimensions "highly permuted" and copies into a contiguous `[1, T, n, Dh]`.
    /// False on contiguous layouts, where it is always a view; the bytes match either way.
    fn heads_split_copies(&self, b: u64, width: u64) -> bool {
        self.rows.pads(width, 4) && b == 1
    }

    /// Whether the heads (`[B, n, T, Dh]`) are a view of a padded projection buffer of
    /// `width`-value rows: the split is a view (`B > 1`) of rows that a pitched layout pads.
    fn heads_in_padded_rows(&self, b: u64, width: u64) -> bool {
        self.rows.pads(width, 4) && b > 1
    }

    fn param(trainable: bool) -> Value {
        Value {
            id: None,
            tracked: trainable,
        }
    }

    fn keep(&mut self, v: Value) {
        if let Some(id) = v.id {
            self.kept.insert(id);
        }
    }

    /// `a·b`, `a/b`, `a @ b`: each operand kept when the other needs a gradient.
    fn binary(&mut self, name: &str, a: Value, b: Value, size: Size) -> Value {
        self.binary_as(name, a, b, size, 4)
    }

    /// [`Replay::binary`] with an output of `bytes_per_value`.
    fn binary_as(
        &mut self,
        name: &str,
        a: Value,
        b: Value,
        size: Size,
        bytes_per_value: u64,
    ) -> Value {
        if b.tracked {
            self.keep(a);
        }
        if a.tracked {
            self.keep(b);
        }
        self.produce_as(name, size, a.tracked || b.tracked, bytes_per_value)
    }

    /// `exp`, `sigmoid`, `sqrt`, `recip`, `log`: the input kept when it needs a gradient.
    fn unary(&mut self, name: &str, x: Value, size: Size) -> Value {
        if x.tracked {
            self.keep(x);
        }
        self.produce(name, size, x.tracked)
    }

    /// A fused op that keeps all its inputs when its output needs a gradient.
    fn fused(&mut self, name: &str, inputs: &[Value], size: Size) -> Value {
        let tracked = inputs.iter().any(|v| v.tracked);
        if tracked {
            for &input in inputs {
                self.keep(input);
            }
        }
        self.produce(name, size, tracked)
    }

    /// Ops that keep only shapes.
    fn stateless(&mut self, name: &str, inputs: &[Value], size: Size) -> Value {
        let tracked = inputs.iter().any(|v| v.tracked);
        self.produce(name, size, tracked)
    }

    fn scoped<R>(&mut self, scope: &str, f: impl FnOnce(&mut Self) -> R) -> R {
        let outer = self.prefix.clone();
        self.prefix = format!("{outer}{scope}.");
        let out = f(self);
        self.prefix = outer;
        out
    }

    /// RMSNorm over `n` rows of width `d`. Fused: one op that keeps its input and one `1/rms`
    /// per row when its output needs a gradient. burn's ops: `x·x`, its row mean, `+ε`, `√`,
    /// `1/·`, `x·r`, `w·(x·r)`.
    fn rms_norm(&mut self, x: Value, n: u64, d: u64, gain_trainable: bool) -> Value {
        let gain = Self::param(gain_trainable);
        if !self.kernels.fuses_norm_and_gating() {
            // [n, d] → [n, 1] statistics → [n, d]
            let square = self.binary("square", x, x, Size::rows(n, d));
            let mean = self.stateless("mean_square", &[square], Size::rows(n, 1));
            let shifted = self.stateless("mean_square_eps", &[mean], Size::rows(n, 1));
            let rms = self.unary("rms", shifted, Size::rows(n, 1));
            let inv = self.unary("inv_rms", rms, Size::rows(n, 1));
            let normed = self.binary("normed", x, inv, Size::rows(n, d));
            return self.binary("output", gain, normed, Size::rows(n, d));
        }
        let inv = self.produce("inv_rms", Size::flat(n), false);
        let out = self.fused("output", &[x, gain], Size::rows(n, d));
        if out.tracked {
            self.keep(inv);
        }
        out
    }

    /// `silu(g)·u` over tensors of `size`. Fused: one op keeping `g` and `u`. burn's ops:
    /// `σ(g)` (kept: its backward reads its output), `g·σ(g)`, `silu(g)·u`.
    fn swiglu(&mut self, gate: Value, up: Value, size: Size) -> Value {
        if !self.kernels.fuses_norm_and_gating() {
            let sigmoid = self.produce("gate_sigmoid", size, gate.tracked);
            if gate.tracked {
                self.keep(sigmoid);
            }
            let silu = self.binary("gate_silu", gate, sigmoid, size);
            return self.binary("swiglu", silu, up, size);
        }
        self.fused("swiglu", &[gate, up], size)
    }

    /// The eager attention in f32 on `[q, k, v]` (their heads, Kᵀ a view): the scores
    /// (`scores`: `[B, H, T, T]`), the scale, mask and softmax (one op keeping its output on a
    /// GPU, burn's ops elsewhere) and their product with `v`, `out` (`[B·T·H, Dh]`).
    fn f32_attention(&mut self, [q, k, v]: [Value; 3], scores: Size, out: Size) -> Value {
        let raw = self.binary("scores", q, k, scores);
        let probs = if self.kernels.fuses_softmax() {
            // One op (scale, mask, softmax) that keeps its output only.
            let raw = self.view(raw, 1);
            let probs = self.produce("probs", scores, raw.tracked);
            if raw.tracked {
                self.keep(probs);
            }
            probs
        } else {
            let scaled = self.stateless("scores_scaled", &[raw], scores);
            let scaled = self.view(scaled, 1);
            let masked = self.stateless("scores_masked", &[scaled], scores);
            let shifted = self.stateless("scores_shifted", &[masked], scores);
            let exp = self.unary("scores_exp", shifted, scores);
            let sum = self.stateless(
                "scores_exp_sum",
                &[exp],
                Size::rows(scores.values / scores.row, 1),
            );
            self.binary("probs", exp, sum, scores)
        };
        let probs = self.view(probs, 1);
        self.binary("probs_v", probs, v, out)
    }

    /// The eager attention under autocast on a GPU (`model/attention.rs`): q and k arrive in
    /// 16 bits from RoPE's kernel, v is cast (`v_heads`: its size); the products keep those
    /// instead of f32 tensors; 16-bit scores, the fused softmax keeping its 16-bit output, and
    /// the 16-bit product with `v` cast back to f32 (a cast keeps nothing).
    fn half_attention(
        &mut self,
        [q, k, v]: [Value; 3],
        v_heads: Size,
        scores: Size,
        out: Size,
    ) -> Value {
        let v = self.produce_as("v_16", v_heads, v.tracked, 2);
        let q = self.view(q, 1); // the groups folded into the rows
        let k = self.view(k, 1); // Kᵀ
        let raw = self.binary_as("scores_16", q, k, scores, 2);
        let raw = self.view(raw, 1);
        let probs = self.produce_as("probs_16", scores, raw.tracked, 2);
        if raw.tracked {
            self.keep(probs);
        }
        let probs = self.view(probs, 1);
        let out16 = self.binary_as("probs_v_16", probs, v, out, 2);
        self.stateless("probs_v", &[out16], out)
    }

    /// `x·Wᵀ` for `x` of `n` rows of `inp` and a `[out, inp]` weight (`weight`: None for the
    /// block linears' NF4 base, else whether it trains): f32, or under autocast the product of
    /// the two 16-bit casts, cast back to f32.
    fn product(&mut self, name: &str, x: Value, weight: Weight, n: u64, shape: [u64; 2]) -> Value {
        let [out, inp] = shape;
        let w = match weight {
            // One custom op (`model/nf4_matmul.rs`): it keeps the codes, which are resident.
            Weight::Nf4 => return self.produce(name, Size::rows(n, out), x.tracked),
            Weight::Dense { trainable, .. } => Self::param(trainable),
        };
        if !self.compute.half {
            return self.binary(name, x, w, Size::rows(n, out));
        }
        let x16 = self.produce_as(
            &format!("{name}.input_16"),
            Size::rows(n, inp),
            x.tracked,
            2,
        );
        let w16 = match weight {
            Weight::Dense {
                stored_half: true, ..
            } => w,
            _ => self.produce_as(
                &format!("{name}.weight_16"),
                Size::rows(out, inp),
                w.tracked,
                2,
            ),
        };
        let y16 = self.binary(&format!("{name}.output_16"), x16, w16, Size::rows(n, out));
        self.stateless(name, &[y16], Size::rows(n, out))
    }

    /// A bias-free linear `x·Wᵀ` over `n` rows, with an optional LoRA adapter of rank `r`.
    fn linear(&mut self, x: Value, n: u64, shape: [u64; 2], base: Weight, lora: Lora) -> Value {
        let [out, inp] = shape;
        let x = self.merge_rows(x, n, inp); // [B, T, in] → [B·T, in]
        let y = self.product("base_output", x, base, n, shape);
        let Some((r, _, dropout, dora)) = lora else {
            return self.view(y, 1); // back to [B, T, out]
        };
        if dora {
            let y = self.dora(x, y, n, shape, base, r, dropout);
            return self.view(y, 1);
        }
        let x = if dropout {
            let mask = self.produce("lora_dropout.mask", Size::rows(n, inp), false);
            let dropped = self.binary("lora_dropout.masked", x, mask, Size::rows(n, inp));
            self.stateless("lora_dropout.output", &[dropped], Size::rows(n, inp))
        } else {
            x
        };
        let trains = Weight::Dense {
            trainable: true,
            stored_half: false,
        };
        let down = self.product("lora_A.output", x, trains, n, [r, inp]);
        let up = self.product("lora_B.output", down, trains, n, [out, r]);
        // On a GPU one fused op adds the scaled adapter product to the base's.
        let y = if self.kernels == Kernels::FusedGpu {
            self.stateless("output", &[y, up], Size::rows(n, out))
        } else {
            let scaled = self.stateless("lora_scaled", &[up], Size::rows(n, out));
            self.stateless("output", &[y, scaled], Size::rows(n, out))
        };
        self.view(y, 1)
    }
}

impl Replay {
    /// DoRA's output (`model/lora.rs::dora_output`) for the linear's input `x` and base
    /// product `y`: the factor `m / ‖W + s·BA‖` (the norm has no graph: the division keeps it),
    /// the adapter's `x·Aᵀ·Bᵀ` scaled, then `(y + s·low) · factor`, which keeps its `[n, out]`
    /// left side and the factor. With dropout in training the dropped input's base product is
    /// added and taken off around it (`y + (x_d·Wᵀ + s·low)·f − x_d·Wᵀ`).
    #[allow(clippy::too_many_arguments)]
    fn dora(
        &mut self,
        x: Value,
        y: Value,
        n: u64,
        [out, inp]: [u64; 2],
        base: Weight,
        r: u64,
        dropout: bool,
    ) -> Value {
        let magnitude = Self::param(true);
        let norm = self.produce("dora_norm", Size::flat(out), false);
        let factor = self.binary("dora_factor", magnitude, norm, Size::flat(out));
        let factor = self.view(factor, 1); // [1, out]
        let x = if dropout {
            let mask = self.produce("lora_dropout.mask", Size::rows(n, inp), false);
            let dropped = self.binary("lora_dropout.masked", x, mask, Size::rows(n, inp));
            self.stateless("lora_dropout.output", &[dropped], Size::rows(n, inp))
        } else {
            x
        };
        let trains = Weight::Dense {
            trainable: true,
            stored_half: false,
        };
        let down = self.product("lora_A.output", x, trains, n, [r, inp]);
        let up = self.product("lora_B.output", down, trains, n, [out, r]);
        let low = self.stateless("lora_scaled", &[up], Size::rows(n, out));
        if !dropout {
            let sum = self.stateless("dora_sum", &[y, low], Size::rows(n, out));
            return self.binary("output", sum, factor, Size::rows(n, out));
        }
        let dropped_base = self.product("dora_dropped_base", x, base, n, [out, inp]);
        let sum = self.stateless("dora_sum", &[dropped_base, low], Size::rows(n, out));
        let scaled = self.binary("dora_scaled", sum, factor, Size::rows(n, out));
        let with_base = self.stateless("dora_plus_base", &[y, scaled], Size::rows(n, out));
        self.stateless("output", &[with_base, dropped_base], Size::rows(n, out))
    }
}

/// A product's weight: the NF4 base of a block linear, or a dense one (trainable or not;
/// stored in 16 bits already or not).
#[derive(Debug, Clone, Copy)]
enum Weight {
    Nf4,
    Dense { trainable: bool, stored_half: bool },
}

/// (r, in features, dropout > 0, DoRA) of a linear's adapter.
type Lora = Option<(u64, u64, bool, bool)>;

/// Everything the forward of one micro-batch of `b` rows × `t` tokens keeps for the backward
/// (blocks, head and loss), in production order.
// Each argument is one axis the replay reads; `inventory.rs` passes them from its `Scenario`,
// and the tests here vary them one at a time (taking a `Scenario` is the architecture issue's).
#[allow(clippy::too_many_arguments)]
pub fn kept_activations(
    config: &LlamaConfig,
    trainable: Trainable,
    b: usize,
    t: usize,
    packed: bool,
    attention: AttentionKind,
    kernels: Kernels,
    compute: LinearCompute,
    rows: RowLayout,
    chunked_loss: bool,
) -> ForwardKeeps {
    let c = config;
    let (b, t) = (b as u64, t as u64);
    let n = b * t;
    let (d, f, v) = (
        c.hidden_size as u64,
        c.intermediate_size as u64,
        c.vocab_size as u64,
    );
    let (h, hkv, dh) = (
        c.num_attention_heads as u64,
        c.num_key_value_heads as u64,
        c.head_dim as u64,
    );
    let mut r = Replay {
        kernels,
        compute,
        rows,
        ..Replay::default()
    };
    let base = if compute.nf4_base {
        Weight::Nf4
    } else {
        Weight::Dense {
            trainable: trainable.block_linears,
            // `Llama::cast_frozen_base`: the frozen block linears only.
            stored_half: compute.half_base && !trainable.block_linears,
        }
    };
    let norms_trainable = trainable.embedding_and_norms;
    // The eager attention in 16 bits (`Replay::half_attention`).
    let half_attention =
        attention == AttentionKind::Eager && attention_value_bytes(compute.half, kernels) == 2;
    let lora_of = |target: LoraTarget, inp: usize| -> Lora {
        trainable
            .lora
            .filter(|l| l.targets(target))
            .map(|l| (l.r as u64, inp as u64, l.dropout > 0.0, l.use_dora))
    };

    // Per-forward tables: RoPE cos/sin [B, 1, T, Dh] and, for the eager attention, the
    // additive mask [1 or B, 1, T, T].
    let cos = r.produce("rope.cos", Size::rows(n, dh), false);
    let sin = r.produce("rope.sin", Size::rows(n, dh), false);
    if attention == AttentionKind::Eager {
        let masks = if packed { b } else { 1 };
        r.produce("attention_mask", Size::rows(masks * t, t), false);
    }

    let embedding_lora = trainable.lora.filter(|l| l.embedding);
    let mut x = r.scoped("embed_tokens", |r| {
        let looked_up = r.binary(
            "output",
            Replay::param(trainable.embedding_and_norms),
            Replay::param(false),
            Size::rows(n, d),
        );
        let Some(lora) = embedding_lora else {
            return looked_up;
        };
        // peft's embedding adapter (`model/embedding_lora.rs`): the rows of Aᵀ (a view of a
        // trained parameter), scaled, through B; added to the frozen lookup.
        let rank = lora.r as u64;
        let rows = r.produce("lora_A.rows", Size::rows(n, rank), true);
        let rows = r.view(rows, 1);
        let scaled = r.stateless("lora_scaled", &[rows], Size::rows(n, rank));
        let trains = Weight::Dense {
            trainable: true,
            stored_half: false,
        };
        let up = r.product("lora_B.output", scaled, trains, n, [d, rank]);
        r.stateless("output_with_lora", &[looked_up, up], Size::rows(n, d))
    });
    for layer in 0..c.num_hidden_layers {
        r.layer = Some(layer);
        x = r.scoped(&format!("layers.{layer}"), |r| {
            let h1 = r.scoped("input_layernorm", |r| r.rms_norm(x, n, d, norms_trainable));
            let attn = r.scoped("self_attn", |r| {
                let linear = |r: &mut Replay, name: &str, target, x, out, inp| {
                    let lora = lora_of(target, inp);
                    r.scoped(name, |r| r.linear(x, n, [out, inp as u64], base, lora))
                };
                let q = linear(r, "q_proj", LoraTarget::QProj, h1, h * dh, c.hidden_size);
                let k = linear(r, "k_proj", LoraTarget::KProj, h1, hkv * dh, c.hidden_size);
                let v = linear(r, "v_proj", LoraTarget::VProj, h1, hkv * dh, c.hidden_size);
                // Qwen3's head norms: RMSNorm over each (token, head) row of Dh, on a view of
                // the projection, before RoPE.
                let (q, k) = match c.qk_norm {
                    true => (
                        r.scoped("q_norm", |r| r.rms_norm(q, n * h, dh, norms_trainable)),
                        r.scoped("k_norm", |r| r.rms_norm(k, n * hkv, dh, norms_trainable)),
                    ),
                    false => (q, k),
                };
                // rope(x) = x·cos + cat(−x₂, x₁)·sin. Fused: one op on the projection that
                // keeps nothing (its backward is the inverse rotation, from the shared
                // tables). burn's ops: the products keep the tables (once per forward).
                // The rotation runs on the heads: [B, n, T, Dh], in place (burn's element-wise
                // ops write into an operand nothing else holds): in the projection's own
                // buffer when the split into heads is a view of it (`heads_in_padded_rows`).
                let rope = |r: &mut Replay, name: &str, x: Value, heads: u64| {
                    let size = match r.heads_in_padded_rows(b, heads * dh) {
                        true => Size::rows(n, heads * dh),
                        false => Size::rows(b * heads * t, dh),
                    };
                    r.scoped(name, |r| {
                        if r.kernels.fuses_rope() {
                            // The projection's bytes: `[B, T, n·Dh]` on the CPU, the heads'
                            // `[B, n, T, Dh]` on a GPU (its kernel splits them). There the
                            // kernel's backward reads the batch's device tables, so the graph
                            // keeps them (once for every layer); the CPU's reads host copies.
                            if r.kernels == Kernels::FusedGpu && x.tracked {
                                r.keep(cos);
                                r.keep(sin);
                            }
                            // Under autocast the heads come out 16-bit for the attention.
                            let size = Size::rows(n, heads * dh);
                            let tracked = x.tracked;
                            return match half_attention {
                                true => r.produce_as("output_16", size, tracked, 2),
                                false => r.stateless("output", &[x, cos, sin], size),
                            };
                        }
                        let x_cos = r.binary("x_cos", x, cos, size);
                        r.record(x.tracked, 3); // two halves and a negation
                        let rotated = r.stateless("rotated", &[x], size);
                        let rotated_sin = r.binary("rotated_sin", rotated, sin, size);
                        r.stateless("output", &[x_cos, rotated_sin], size)
                    })
                };
                let q = rope(r, "q_rope", q, h);
                let k = rope(r, "k_rope", k, hkv);
                // Split into heads: reshape + transpose (for V a copy where the reshape is one).
                let (q, k) = (r.view(q, 2), r.view(k, 2));
                let v = match r.heads_split_copies(b, hkv * dh) {
                    true => {
                        let heads = r.stateless("v_heads", &[v], Size::rows(b * hkv * t, dh));
                        r.view(heads, 1)
                    }
                    false => r.view(v, 2),
                };
                if attention == AttentionKind::Efficient {
                    // On burn's ops the causal tile masks are made in the first block's forward
                    // and held by the batch's context for every layer and pass.
                    let masks = causal_tile_mask_values(t);
                    let on_burns_ops = !r.kernels.fuses_efficient_attention();
                    if layer == 0 && on_burns_ops && !packed && masks > 0 {
                        let masks = r.produce("attention_tile_masks", Size::flat(masks), false);
                        r.keep(masks);
                    }
                    // One op: keeps its three inputs, its output and the row log-sum-exps.
                    let tracked = q.tracked || k.tracked || v.tracked;
                    let out = r.produce("attention_output", Size::rows(n * h, dh), tracked);
                    let lse = r.produce("attention_lse", Size::rows(b * h * t, 1), false);
                    if tracked {
                        for kept in [q, k, v, out, lse] {
                            r.keep(kept);
                        }
                    }
                    let out = r.view(out, 1); // [B, T, H, Dh]
                    let merged = r.stateless("heads_merged", &[out], Size::rows(n, h * dh));
                    return linear(r, "o_proj", LoraTarget::OProj, merged, d, c.q_dim());
                }
                let scores = Size::rows(b * h * t, t); // [B, H, T, T]
                let out = if half_attention {
                    // RoPE's fresh buffers of contiguous heads (CUDA's padded projection rows
                    // are not modelled here, no run recorded).
                    let v_heads = Size::rows(b * hkv * t, dh);
                    r.half_attention([q, k, v], v_heads, scores, Size::rows(n * h, dh))
                } else {
                    // Groups folded into the rows: a copy of the transposed heads, the same
                    // bytes as the rotation's output unless that lies in a padded projection
                    // buffer; a group of one is no reshape at all. Kᵀ: a view.
                    let q = match h > hkv && r.heads_in_padded_rows(b, h * dh) {
                        true => r.stateless("q_grouped", &[q], Size::rows(b * h * t, dh)),
                        false => r.view(q, 1),
                    };
                    let k = r.view(k, 1);
                    r.f32_attention([q, k, v], scores, Size::rows(n * h, dh))
                };
                let out = r.view(out, 2);
                let merged = r.stateless("heads_merged", &[out], Size::rows(n, h * dh));
                linear(r, "o_proj", LoraTarget::OProj, merged, d, c.q_dim())
            });
            let x2 = r.stateless("attention_residual", &[x, attn], Size::rows(n, d));
            let h2 = r.scoped("post_attention_layernorm", |r| {
                r.rms_norm(x2, n, d, norms_trainable)
            });
            let mlp = r.scoped("mlp", |r| {
                let linear = |r: &mut Replay, name: &str, target, x, out, inp| {
                    let lora = lora_of(target, inp);
                    r.scoped(name, |r| r.linear(x, n, [out, inp as u64], base, lora))
                };
                let gate = linear(r, "gate_proj", LoraTarget::GateProj, h2, f, c.hidden_size);
                let up = linear(r, "up_proj", LoraTarget::UpProj, h2, f, c.hidden_size);
                let prod = r.swiglu(gate, up, Size::rows(n, f));
                linear(
                    r,
                    "down_proj",
                    LoraTarget::DownProj,
                    prod,
                    d,
                    c.intermediate_size,
                )
            });
            r.stateless("output", &[x2, mlp], Size::rows(n, d))
        });
    }
    r.layer = None;
    let normed = r.scoped("norm", |r| r.rms_norm(x, n, d, norms_trainable));
    let head_trainable = trainable.embedding_and_norms;
    let head_lora = trainable
        .lora
        .filter(|l| l.head)
        .map(|l| (l.r as u64, d, l.dropout > 0.0, l.use_dora));
    if chunked_loss && !head_trainable && head_lora.is_none() {
        // The chunked loss (`model/chunked_loss.rs`): the head's products and the loss run
        // outside the step's graph; the graph holds `Σ normed ⊙ G`, whose product keeps the
        // constant `G` ([B·T, D] f32), then its sum.
        r.scoped("loss", |r| {
            let g = r.produce("head_input_gradient", Size::rows(n, d), false);
            let product = r.binary("surrogate", normed, g, Size::rows(n, d));
            r.stateless("sum", &[product], Size::flat(1));
        });
        return r.finish();
    }
    let logits = r.scoped("lm_head", |r| {
        let head = Weight::Dense {
            trainable: head_trainable,
            stored_half: false,
        };
        if head_lora.is_some() {
            // An adapter on the head: the linear's own replay (its input kept for A).
            return r.linear(normed, n, [v, d], head, head_lora);
        }
        let normed = r.merge_rows(normed, n, d);
        let logits = r.product("output", normed, head, n, [v, d]);
        r.view(logits, 1)
    });
    // Loss. Fused: one op that keeps the logits themselves (counted once, as the step's
    // logits, not here), one log-sum-exp per position and the shifted labels (a class index
    // and a weight per counted position, 4 bytes each). burn's log-softmax over the first
    // T − 1 positions keeps the shifted logits instead (the step's `logits` entry stands for
    // them: B·(T−1)·V of its B·T·V) and the row sums of their exps; its gather keeps i64
    // classes and the product the label weights.
    let rows = b * (t.saturating_sub(1));
    let (row_statistic, per_row, label_values, more_ops) = match r.kernels.fuses_loss() {
        true => ("log_sum_exp", n, 2 * rows, 0),
        // narrow, subtract, exp, row sum, log, subtract, gather, weight, sum, negate
        false => ("exp_row_sums", rows, 3 * rows, 9),
    };
    r.scoped("loss", |r| {
        let statistic = r.produce(row_statistic, Size::rows(per_row, 1), false);
        let labels = r.produce("shifted_labels", Size::rows(label_values, 1), false);
        if logits.tracked {
            r.keep(statistic);
            r.keep(labels);
        }
        r.record(logits.tracked, more_ops);
        r.stateless("sum", &[logits], Size::flat(1));
    });

    r.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2-135M with LoRA r 16 on every linear, one row of 64 tokens, eager attention.
    fn smollm2_lora_keeps(kernels: Kernels) -> ForwardKeeps {
        let lora = LoraConfig::default();
        let trainable = Trainable {
            embedding_and_norms: false,
            block_linears: false,
            lora: Some(&lora),
        };
        let c = LlamaConfig::smollm2_135m();
        kept_activations(
            &c,
            trainable,
            1,
            64,
            false,
            AttentionKind::Eager,
            kernels,
            LinearCompute::default(),
            RowLayout::Contiguous,
            false,
        )
    }

    fn total(kept: &[Kept], layer: Option<usize>) -> u64 {
        kept.iter()
            .filter(|k| k.layer == layer)
            .map(|k| k.size.values)
            .sum()
    }

    /// Under LoRA the first block's input path is frozen: it keeps less than the others, and
    /// a block in the middle keeps per token 3 copies of the scores per head plus the listed
    /// per-token tensors.
    #[test]
    fn a_lora_block_keeps_what_the_rules_say() {
        let kept = &smollm2_lora_keeps(Kernels::FusedCpu).tensors;
        let (d, f, h, kv, r) = (576u64, 1536u64, 9u64, 192u64, 16u64);
        let t = 64u64;
        let per_token = d // residual after attention (kept by the second norm)
            + d // block output (kept by the next block's norm)
            + 2 // each norm's 1/rms
            + 2 * d // the two norm outputs (kept by the LoRA A products)
            + 7 * r // the LoRA A outputs
            + d + kv + kv // q and k after RoPE, v
            + h // the softmax sums
            + d // merged heads (o_proj input)
            + 2 * f // gate and up outputs (kept by the fused SwiGLU)
            + f; // silu(gate)·up (down_proj input)
        let middle = total(kept, Some(5));
        assert_eq!(middle, t * per_token + 3 * h * t * t);
        assert!(total(kept, Some(0)) < middle);
    }

    /// burn's ops (the GPU backends) keep, per token of a LoRA block, `σ(g)` and `silu(g)`
    /// besides the fused SwiGLU's inputs and two more per-row statistics in each RMSNorm
    /// (`mean(x²) + ε` and `√·`, besides `1/rms`); outside the blocks the RoPE products keep
    /// the cos and sin tables, and the loss its exps' row sums instead of one log-sum-exp per
    /// position.
    #[test]
    fn burns_ops_keep_the_intermediates_the_fused_kernels_recompute() {
        let fused = smollm2_lora_keeps(Kernels::FusedCpu);
        let ops = smollm2_lora_keeps(Kernels::BurnOps);
        let (f, dh, t) = (1536u64, 64u64, 64u64);
        assert_eq!(
            total(&ops.tensors, Some(5)) - total(&fused.tensors, Some(5)),
            t * (2 * f + 2 * 2)
        );
        let rows = t - 1;
        let outside = |k: &ForwardKeeps| total(&k.tensors, None);
        assert_eq!(
            outside(&ops) + t, // one log-sum-exp per position (fused)
            // tables; the final norm's statistics; row sums; i64 classes
            outside(&fused) + 2 * t * dh + 2 * t + rows + rows
        );
        assert!(ops.recorded_ops[&Some(5)] > fused.recorded_ops[&Some(5)]);
    }
}

#[cfg(test)]
mod efficient_attention_tests {
    use super::*;

    /// The efficient attention keeps no `T × T` tensor: the difference from eager is exactly
    /// the three score-sized copies and the softmax sums per block, less the efficient op's
    /// output and log-sum-exps.
    #[test]
    fn the_t_squared_term_vanishes_with_the_efficient_attention() {
        let c = LlamaConfig::smollm2_135m();
        let lora = LoraConfig::default();
        let trainable = Trainable {
            embedding_and_norms: false,
            block_linears: false,
            lora: Some(&lora),
        };
        let t = 1024u64;
        let values = |attention| -> u64 {
            kept_activations(
                &c,
                trainable,
                1,
                t as usize,
                false,
                attention,
                Kernels::FusedCpu,
                LinearCompute::default(),
                RowLayout::Contiguous,
                false,
            )
            .tensors
            .iter()
            .map(|k| k.size.values)
            .sum()
        };
        let (h, dh, layers) = (9u64, 64u64, 30u64);
        let eager = values(AttentionKind::Eager);
        let efficient = values(AttentionKind::Efficient);
        // Block 0 is frozen up to its LoRA adapters, but its attention still carries gradients
        // (q, k and v have adapters), so every block keeps the same attention tensors.
        let eager_attention = layers * (3 * h * t * t + h * t);
        let efficient_attention = layers * (t * h * dh + h * t);
        assert_eq!(eager - efficient, eager_attention - efficient_attention);
        assert!(
            !kept_activations(
                &c,
                trainable,
                1,
                64,
                false,
                AttentionKind::Efficient,
                Kernels::FusedCpu,
                LinearCompute::default(),
                RowLayout::Contiguous,
                false,
            )
            .tensors
            .iter()
            .any(|k| k.name.contains("scores") || k.name == "attention_mask")
        );
    }
}
