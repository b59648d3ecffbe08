//! Hugging Face `LlamaForCausalLM`'s training forward written onto the autograd tape, op by op
//! in the order transformers runs them, with peft's LoRA and bitsandbytes' `Linear4bit`.
//!
//! Shapes: B batch, T positions, D hidden, H heads, Hkv key/value heads, d head dim, F the MLP
//! width, V the vocabulary, r the LoRA rank, N = B·T. `w` is the bytes of one value in the
//! model's dtype (4 after `prepare_model_for_kbit_training`), `cw` in the 4-bit compute dtype.

use super::tape::{CustomOp, FreshGrad, Param, Rerun, Tape, Val};
use super::{Attention, Checkpointing, Method, PyTorchSetup, TorchDevice};
use crate::config::{LlamaConfig, LoraTarget};

/// `torch.get_rng_state()`: the CPU generator's Mersenne Twister state as a byte tensor.
const CPU_RNG_STATE_BYTES: u64 = 5056;

/// The recorded forward.
pub struct Recorded {
    /// The tape.
    pub tape: Tape,
    /// The loss (the backward starts from it).
    pub loss: Val,
}

/// Records one training forward of `config` under `setup`.
pub fn record(config: &LlamaConfig, setup: &PyTorchSetup) -> Recorded {
    let mut b = Builder {
        tape: Tape::default(),
        config,
        setup,
        next_param: 0,
        no_grad: false,
    };
    let loss = b.forward();
    Recorded { tape: b.tape, loss }
}

pub(super) struct Builder<'a> {
    pub(super) tape: Tape,
    pub(super) config: &'a LlamaConfig,
    pub(super) setup: &'a PyTorchSetup,
    next_param: usize,
    /// Recording a forward under `torch.no_grad()` with the adapters disabled (DPO's
    /// reference): nothing is tracked, nothing checkpointed.
    pub(super) no_grad: bool,
}

impl Builder<'_> {
    /// N = B·T.
    pub(super) fn n(&self) -> u64 {
        (self.setup.batch * self.setup.seq) as u64
    }

    /// Bytes of one value of the hidden states.
    pub(super) fn w(&self) -> u64 {
        self.setup.dtype.bytes()
    }

    fn full(&self) -> bool {
        matches!(self.setup.method, Method::Full)
    }

    /// Checkpointing as this forward runs it (never under `no_grad`: TRL disables it for the
    /// reference forward).
    fn checkpointing(&self) -> Option<Checkpointing> {
        self.setup.active_checkpointing().filter(|_| !self.no_grad)
    }

    fn param(&mut self, bytes: u64, trainable: bool) -> Param {
        self.next_param += 1;
        Param {
            id: self.next_param,
            bytes,
            trainable,
        }
    }

    fn forward(&mut self) -> Val {
        let c = self.config;
        let (n, d, w) = (self.n(), c.hidden_size as u64, self.w());
        let vocab = c.vocab_size as u64;
        self.tape.enter(None);
        let ids = self.tape.external(n * 8, false);
        let table = self.param(vocab * d * w, self.full());
        let h = self.backbone(ids, table);
        let head = if c.tie_word_embeddings {
            table
        } else {
            self.param(vocab * d * w, self.full())
        };
        if let Some(dpo) = self.setup.dpo {
            return self.dpo_step(dpo, ids, table, h);
        }
        let logits = self.tape.linear(h, head, n * vocab * w); // [B, T, V]
        self.loss(logits)
    }

    /// `LlamaModel`: the embedding of `ids`, the decoder layers and the final norm, its
    /// output `[B, T, D]`.
    pub(super) fn backbone(&mut self, ids: Val, table: Param) -> Val {
        let c = self.config;
        let (n, d, w) = (self.n(), c.hidden_size as u64, self.w());
        // embed_tokens → [B, T, D]. Under LoRA its output needs no gradient unless
        // `enable_input_require_grads` hooks it (which has no effect under `no_grad`).
        let hooked = self.setup.input_require_grads && !self.no_grad;
        let mut x = self.tape.embedding(ids, table, n * d * w, hooked);

        // position_ids [1, T] (int64), and the rotary tables cos, sin: [1, T, d] each in the
        // hidden dtype, shared by every layer.
        let positions = self.tape.input(self.setup.seq as u64 * 8, false);
        let table_bytes = (self.setup.seq * c.head_dim) as u64 * w;
        let rope = (
            self.tape.input(table_bytes, false),
            self.tape.input(table_bytes, false),
        );

        for layer in 0..c.num_hidden_layers {
            self.tape.enter(Some(layer));
            x = match self.checkpointing() {
                Some(kind) => self.checkpointed_layer(x, rope, positions, kind),
                None => self.decoder_layer(x, rope),
            };
        }
        self.tape.enter(None);
        let norm = self.param(d * w, self.full());
        self.rms_norm(x, norm)
    }

    /// The causal-LM loss: logits to f32, mean cross-entropy over the next tokens =
    /// `log_softmax` (saves its result) then `nll_loss` (saves the targets and the total
    /// weight). `ForCausalLMLoss` pads the labels by one instead of shifting the logits; older
    /// releases copied the shifted logits.
    fn loss(&mut self, logits: Val) -> Val {
        let (n, vocab) = (self.n(), self.config.vocab_size as u64);
        let (batch, seq) = (self.setup.batch as u64, self.setup.seq as u64);
        let logits32 = self.cast(logits, n * vocab * 4);
        // The caller gets the logits back: the f32 copy in releases that cast in the model's
        // forward (with the shifted copy), the model's own otherwise.
        self.tape
            .retain(if self.setup.stack.loss_copies_shifted_logits {
                logits32
            } else {
                logits
            });
        let (scores, targets) = if self.setup.stack.loss_copies_shifted_logits {
            // logits[..., :-1, :].contiguous(), labels[..., 1:].contiguous()
            let shifted = batch * (seq - 1) * vocab * 4;
            let slice = self.tape.slice(logits32, shifted);
            let copy = self.tape.fresh(&[slice], shifted, FreshGrad::PassesThrough);
            let targets = self.tape.input(batch * (seq - 1) * 8, false);
            (copy, targets)
        } else {
            // pad(labels, (0, 1)) → [B, T+1]; `[..., 1:].contiguous()` copies unless B = 1.
            let padded = self.tape.input(batch * (seq + 1) * 8, false);
            let targets = if batch == 1 {
                padded
            } else {
                self.tape.input(n * 8, false)
            };
            (logits32, targets)
        };
        let log_probs = self.tape.saves_output(scores, scores.bytes);
        let out = self.tape.custom(CustomOp {
            inputs: &[log_probs],
            outputs: &[4, 4],
            saved_extra: &[targets],
            saved_outputs: &[1],
            ..Default::default()
        });
        self.tape.retain(out[0]);
        out[0]
    }

    /// `LlamaDecoderLayer`: `x = x + attn(norm(x))`, `x = x + mlp(norm(x))`.
    fn decoder_layer(&mut self, x: Val, rope: (Val, Val)) -> Val {
        let d = self.config.hidden_size as u64 * self.w();
        let norm = self.param(d, self.full());
        let h = self.rms_norm(x, norm);
        let attn = self.attention(h, rope);
        let x = self.tape.add(x, attn);
        let norm = self.param(d, self.full());
        let h = self.rms_norm(x, norm);
        let mlp = self.mlp(h);
        self.tape.add(x, mlp)
    }

    /// A layer under HF gradient checkpointing: the forward keeps the layer's input, and the
    /// closure keeps the rotary tables and positions it was called with; the backward reruns
    /// the layer (recorded on a tape of its own to size that moment).
    fn checkpointed_layer(
        &mut self,
        x: Val,
        rope: (Val, Val),
        positions: Val,
        kind: Checkpointing,
    ) -> Val {
        let mut inner = Builder {
            tape: Tape::default(),
            config: self.config,
            setup: self.setup,
            next_param: self.next_param,
            no_grad: false,
        };
        // The rerun sees an input that needs a gradient exactly when the original did; the
        // non-reentrant variant also runs it when only the layer's own parameters train.
        // The rerun's input and tables are views of what the checkpoint kept.
        let input = inner.tape.external(x.bytes, x.tracked);
        let inner_rope = (
            inner.tape.external(rope.0.bytes, false),
            inner.tape.external(rope.1.bytes, false),
        );
        let out = inner.decoder_layer(input, inner_rope);
        self.next_param = inner.next_param;
        // The rerun's peak, less what the outer walk already holds: the layer's input and the
        // gradient arriving at its output.
        let recompute_peak = if out.tracked {
            let held = out.bytes
                + if inner.tape.saves(input) {
                    input.bytes
                } else {
                    0
                };
            inner.tape.backward_peak(out).saturating_sub(held)
        } else {
            0
        };
        // `torch.utils.checkpoint` keeps the CPU generator's state (`torch.get_rng_state()`,
        // 5056 bytes) to replay dropout; on CUDA that is host memory, not the device's.
        let rng_state = match self.setup.device {
            TorchDevice::Cpu => vec![self.tape.input(CPU_RNG_STATE_BYTES, false)],
            TorchDevice::Cuda => vec![],
        };
        let kept: Vec<Val> = [rope.0, rope.1, positions]
            .into_iter()
            .chain(rng_state)
            .collect();
        let params = inner.tape.trainable_params();
        let tracked_input = match kind {
            Checkpointing::Reentrant => x,
            // Non-reentrant checkpointing records the layer's graph as usual (only its saved
            // tensors are dropped), so the output needs a gradient when the layer trains.
            Checkpointing::NonReentrant => Val {
                tracked: x.tracked || !params.is_empty(),
                ..x
            },
        };
        let rerun = Rerun {
            tape: inner.tape,
            input,
            output: out,
        };
        self.tape
            .checkpoint(tracked_input, &kept, x.bytes, params, recompute_peak, rerun)
    }

    /// `LlamaRMSNorm`: to f32, `x·rsqrt(mean(x²) + ε)`, back to the input dtype, times the
    /// weight.
    fn rms_norm(&mut self, x: Val, weight: Param) -> Val {
        let (n, d) = (self.n(), self.config.hidden_size as u64);
        let x32 = self.cast(x, n * d * 4);
        let squared = self.tape.saves_input(x32, n * d * 4); // pow(2)
        let mean = self.tape.fresh(&[squared], n * 4, FreshGrad::Allocates); // [B, T, 1]
        let plus_eps = self.tape.fresh(&[mean], n * 4, FreshGrad::PassesThrough);
        let inv_rms = self.tape.saves_output(plus_eps, n * 4); // rsqrt
        let normed = self.tape.mul(x32, inv_rms);
        let back = self.cast(normed, n * d * self.w());
        self.tape.mul_param(back, weight)
    }

    /// A cast to a tensor of `bytes` (none when the size, hence the dtype, is unchanged).
    pub(super) fn cast(&mut self, x: Val, bytes: u64) -> Val {
        if x.bytes == bytes {
            x
        } else {
            self.tape.fresh(&[x], bytes, FreshGrad::Allocates)
        }
    }

    /// `LlamaAttention`: projections, RoPE, the attention kernel, `o_proj`.
    fn attention(&mut self, h: Val, (cos, sin): (Val, Val)) -> Val {
        let c = self.config;
        let (n, w) = (self.n(), self.w());
        let (batch, seq) = (self.setup.batch as u64, self.setup.seq as u64);
        let heads = c.num_attention_heads as u64;
        let (d, q_dim, kv_dim) = (c.hidden_size, c.q_dim(), c.kv_dim());
        let q = self.projection(h, LoraTarget::QProj, d, q_dim);
        let k = self.projection(h, LoraTarget::KProj, d, kv_dim);
        let v = self.projection(h, LoraTarget::VProj, d, kv_dim);
        // [B, T, H·d] → [B, H, T, d] (views)
        let (q, k, v) = (self.tape.view(q), self.tape.view(k), self.tape.view(v));
        let q = self.rope(q, cos, sin);
        let k = self.rope(k, cos, sin);
        let groups = c.num_attention_heads / c.num_key_value_heads;
        let repeat = |b: &mut Self, x: Val| {
            if groups > 1 {
                // repeat_kv: expand + reshape copies [B, Hkv, T, d] to [B, H, T, d]
                b.tape
                    .fresh(&[x], x.bytes * groups as u64, FreshGrad::Allocates)
            } else {
                x
            }
        };
        let out = match self.setup.attention {
            Attention::Eager => {
                let (k, v) = (repeat(self, k), repeat(self, v));
                let scores_bytes = batch * heads * seq * seq;
                let scores = self.tape.matmul(q, k, scores_bytes * w); // q·kᵀ [B, H, T, T]
                let scaled = self
                    .tape
                    .fresh(&[scores], scores_bytes * w, FreshGrad::Allocates);
                let mask = self.tape.input(batch * seq * seq * w, false);
                let masked = self.tape.add(scaled, mask);
                let probs = self.tape.saves_output(masked, scores_bytes * 4); // softmax in f32
                let probs = self.cast(probs, scores_bytes * w);
                let out = self.tape.matmul(probs, v, n * q_dim as u64 * w); // [B, H, T, d]
                // transpose(1, 2).contiguous(): a copy whose backward passes the gradient on
                self.tape.fresh(&[out], out.bytes, FreshGrad::PassesThrough)
            }
            Attention::Sdpa if self.sdpa_falls_back_to_math(groups) => {
                // ATen's math kernel, written with tensor ops: q and k each times √scale (new
                // tensors), k and v repeated to every query head (`repeat_interleave`), the
                // scores, the causal mask added in place, the softmax's output kept, and its
                // product with v — laid out [B, H, T, d], so `.contiguous()` after the
                // transpose copies it.
                let q = self.tape.fresh(&[q], q.bytes, FreshGrad::Allocates);
                let (k, v) = (repeat(self, k), repeat(self, v));
                let k = self.tape.fresh(&[k], k.bytes, FreshGrad::Allocates);
                let scores_bytes = batch * heads * seq * seq * w;
                let scores = self.tape.matmul(q, k, scores_bytes);
                let probs = self.tape.saves_output(scores, scores_bytes);
                let out = self.tape.matmul(probs, v, n * q_dim as u64 * w);
                self.tape.fresh(&[out], out.bytes, FreshGrad::PassesThrough)
            }
            Attention::Sdpa => {
                let (k, v) = if self.setup.stack.sdpa_repeats_kv {
                    (repeat(self, k), repeat(self, v))
                } else {
                    (k, v)
                };
                // The fused kernel (flash on the CPU, flash or memory-efficient on CUDA) saves
                // q, k, v, its output and one log-sum-exp per row (f32; CUDA's
                // memory-efficient kernel pads the rows to a multiple of 32).
                let rows = match self.setup.device {
                    TorchDevice::Cpu => seq,
                    TorchDevice::Cuda => seq.div_ceil(32) * 32,
                };
                let outs = self.tape.custom(CustomOp {
                    inputs: &[q, k, v],
                    outputs: &[n * q_dim as u64 * w, batch * heads * rows * 4],
                    saved_inputs: &[q, k, v],
                    saved_outputs: &[0, 1],
                    ..Default::default()
                });
                // Its output is laid out [B, T, H, d]: transpose and reshape are views.
                self.tape.view(outs[0])
            }
        };
        self.projection(out, LoraTarget::OProj, q_dim, d)
    }

    /// Whether sdpa runs ATen's math kernel: on CUDA, transformers passes grouped K/V heads
    /// with `enable_gqa=True` (torch ≥ 2.5, no padding mask), which neither the flash nor the
    /// memory-efficient kernel takes for f32 inputs (flash is 16-bit only); measured on an
    /// H200 with torch 2.11: f32 + GQA is refused by every fused backend but math.
    fn sdpa_falls_back_to_math(&self, groups: usize) -> bool {
        self.setup.device == TorchDevice::Cuda
            && self.w() == 4
            && groups > 1
            && !self.setup.stack.sdpa_repeats_kv
    }

    /// `apply_rotary_pos_emb` on one of q, k ([B, heads, T, d]):
    /// `x·cos + cat(-x₂, x₁)·sin`.
    fn rope(&mut self, x: Val, cos: Val, sin: Val) -> Val {
        let a = self.tape.mul(x, cos);
        let x1 = self.tape.slice(x, x.bytes / 2);
        let x2 = self.tape.slice(x, x.bytes / 2);
        let neg = self.tape.fresh(&[x2], x2.bytes, FreshGrad::Allocates);
        let rotated = self
            .tape
            .fresh(&[neg, x1], x.bytes, FreshGrad::PassesThrough);
        let b = self.tape.mul(rotated, sin);
        self.tape.add(a, b)
    }

    /// `LlamaMLP`: `down(silu(gate(h)) · up(h))`.
    fn mlp(&mut self, h: Val) -> Val {
        let c = self.config;
        let (d, f) = (c.hidden_size, c.intermediate_size);
        let gate = self.projection(h, LoraTarget::GateProj, d, f);
        let up = self.projection(h, LoraTarget::UpProj, d, f);
        let act = self.tape.saves_input(gate, gate.bytes); // silu
        let product = self.tape.mul(act, up);
        self.projection(product, LoraTarget::DownProj, f, d)
    }

    /// One block linear `x → [N, out]`: dense (`F.linear`) or bitsandbytes 4-bit, plus peft's
    /// LoRA when `target` is adapted.
    fn projection(&mut self, x: Val, target: LoraTarget, fan_in: usize, fan_out: usize) -> Val {
        let (n, w) = (self.n(), self.w());
        let (fan_in, fan_out) = (fan_in as u64, fan_out as u64);
        let base = match self.setup.method {
            Method::Full | Method::Lora => {
                let weight = self.param(fan_in * fan_out * w, self.full());
                self.tape.linear(x, weight, n * fan_out * w)
            }
            Method::QLora { .. } => {
                // Linear4bit: x.to(compute_dtype), MatMul4Bit, .to(x.dtype). bitsandbytes
                // before 0.43.2 kept the cast input on `ctx` for its backward.
                let cw = self.setup.compute_dtype.bytes();
                let input = self.cast(x, n * fan_in * cw);
                let keeps = if self.setup.stack.bnb_keeps_input {
                    vec![input]
                } else {
                    vec![]
                };
                let out = self.tape.custom(CustomOp {
                    inputs: &[input],
                    outputs: &[n * fan_out * cw],
                    saved_inputs: &keeps,
                    // Its forward and its backward each dequantize the weight to the
                    // compute dtype for the product.
                    scratch: fan_in * fan_out * cw,
                    forward_scratch: fan_in * fan_out * cw,
                    ..Default::default()
                })[0];
                self.cast(out, n * fan_out * w)
            }
        };
        let Some(lora) = self.setup.lora.as_ref() else {
            return base;
        };
        // Under `disable_adapter()` peft's layer runs its base layer alone.
        if !lora.targets.contains(&target) || self.no_grad {
            return base;
        }
        let r = lora.r as u64;
        // peft casts the input to the adapters' dtype (f32, or bf16 where TRL cast them).
        let ab = self.setup.adapter_bytes();
        let x = self.cast(x, n * fan_in * ab);
        let x = self.dropout(x, lora.dropout);
        let a = self.param(r * fan_in * ab, true);
        let b = self.param(fan_out * r * ab, true);
        let down = self.tape.linear(x, a, n * r * ab);
        let up = self.tape.linear(down, b, n * fan_out * ab);
        let scaled = self.tape.fresh(&[up], up.bytes, FreshGrad::Allocates);
        // bitsandbytes' LoRA layer casts the adapters' output to the result's dtype before
        // the sum.
        let scaled = match self.setup.method {
            Method::QLora { .. } => self.cast(scaled, n * fan_out * w),
            _ => scaled,
        };
        let sum = self.tape.add(base, scaled);
        self.cast(sum, n * fan_out * w)
    }

    /// peft's `lora_dropout`: nothing in eval mode or for p = 0 (peft uses `nn.Identity`). In
    /// training mode, the CPU multiplies by a scaled mask of the input's dtype (which the product
    /// saves), CUDA's fused kernel saves a one-byte mask.
    fn dropout(&mut self, x: Val, p: f64) -> Val {
        if !self.setup.adapter_dropout_runs() || p == 0.0 {
            return x;
        }
        match self.setup.device {
            TorchDevice::Cpu => {
                let mask = self.tape.input(x.bytes, false);
                self.tape.mul(x, mask)
            }
            TorchDevice::Cuda => {
                let values = x.bytes / 4;
                self.tape.custom(CustomOp {
                    inputs: &[x],
                    outputs: &[x.bytes, values],
                    saved_outputs: &[1],
                    ..Default::default()
                })[0]
            }
        }
    }
}
