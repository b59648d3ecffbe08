//! TRL's `DPOTrainer` step (TRL 1.16: `_compute_loss` and its backward) written onto the
//! autograd tape after the backbone `llama.rs` records.
//!
//! Shapes: R rows (the chosen sequence of each of the P pairs, then the rejected ones), T
//! positions, D hidden, V the vocabulary; S = R·(T − 1) shifted positions; n the positions the
//! fused head scores (S on the CPU; the completion's on CUDA). `w` is the bytes of one value of
//! the hidden states.
//!
//! The order is TRL's: the policy forward through the fused LM head (`add_fused_lm_head`:
//! `ChunkedLogProbFunction` folds `[min(n, 4096), 32768]` tiles of `hidden · headᵀ` into
//! per-position statistics and keeps only `hidden`, the targets, `log Z` and the entropy), each
//! row's log-probability sum, the reference forward under `no_grad` with the adapter disabled
//! and checkpointing off (unless `precompute_ref_log_probs`), the sigmoid loss, then the
//! metrics, read with `.item()`. Everything `_compute_loss` holds in locals (both forwards'
//! per-position outputs, the last hidden states) lives until it returns.
//!
//! On the CPU (no Triton) the tiles are folded with torch ops: the forward holds three
//! f32 tiles and a boolean one at its highest, the backward seven f32 tiles and a boolean one
//! (`_forward_tile`, `_backward_tile`); on CUDA a Triton kernel folds each tile in place.

use super::llama::Builder;
use super::tape::{CustomOp, FreshGrad, Param, Val};
use super::{TorchDevice, TrlDpo};

/// `TOKEN_CHUNK_SIZE`: positions per tile.
const TOKEN_CHUNK: u64 = 4096;
/// `_CHUNKED_LOGPROB_CHUNK_SIZE`: vocabulary entries per tile. The tile buffer is this wide
/// whatever the vocabulary.
const VOCAB_CHUNK: u64 = 32_768;
/// The f32 statistics per position the forward folds tiles into: running max, sum of
/// exponentials, its logit-weighted and squared sums, the logit sum, the max before the
/// target, the target's logit.
const FORWARD_STATS: u64 = 7;

/// What one fused-head forward hands back, as `FusedCausalLMOutput` holds it (`[R, T − 1]`).
struct HeadOutputs {
    /// Per-position log-probability of the label, zero off the completion (f32).
    log_probs: Val,
    /// The other per-position outputs (entropy, mean logit, is-top-1) and the label mask,
    /// read by the metrics.
    others: [Val; 4],
}

impl Builder<'_> {
    /// The DPO step after the policy's backbone `h` (`[R, T, D]`): returns the loss.
    pub(super) fn dpo_step(&mut self, dpo: TrlDpo, ids: Val, table: Param, h: Val) -> Val {
        let rows = self.setup.batch as u64;
        let pairs = rows / 2;
        let policy = self.fused_head(h, dpo);
        // per_token_logps.sum(dim=1) → [R]
        let sums = self
            .tape
            .fresh(&[policy.log_probs], rows * 4, FreshGrad::Allocates);
        let reference = (!dpo.precompute_ref).then(|| {
            self.no_grad = true;
            let h = self.backbone(ids, table);
            let outputs = self.fused_head(h, dpo);
            let sums = self
                .tape
                .fresh(&[outputs.log_probs], rows * 4, FreshGrad::Allocates);
            self.no_grad = false;
            (outputs, sums)
        });
        // The log-ratios of the chosen and the rejected rows ([P] each, from `chunk` views),
        // their difference, β times it, `-logsigmoid` (which saves its input and a buffer),
        // the mean.
        let reads = |extra: Option<Val>| -> Vec<Val> { [sums].into_iter().chain(extra).collect() };
        let ref_sums = reference.as_ref().map(|(_, s)| *s);
        let chosen = self
            .tape
            .fresh(&reads(ref_sums), pairs * 4, FreshGrad::Allocates);
        let rejected = self
            .tape
            .fresh(&reads(ref_sums), pairs * 4, FreshGrad::Allocates);
        let delta = self
            .tape
            .fresh(&[chosen, rejected], pairs * 4, FreshGrad::PassesThrough);
        let scaled = self.tape.fresh(&[delta], pairs * 4, FreshGrad::Allocates);
        let log_sigmoid = self.tape.custom(CustomOp {
            inputs: &[scaled],
            outputs: &[pairs * 4, pairs * 4],
            saved_inputs: &[scaled],
            saved_outputs: &[1],
            ..Default::default()
        });
        let loss = self.tape.fresh(&[log_sigmoid[0]], 4, FreshGrad::Allocates);
        self.tape.retain(loss);
        // The metrics read both forwards' outputs; then `_compute_loss` returns.
        self.tape.read(&policy.others);
        if let Some((outputs, _)) = reference {
            self.tape.read(&outputs.others);
        }
        loss
    }

    /// `_fused_forward` after the backbone: the shifted hidden states through
    /// `ChunkedLogProbFunction` (the head's weight is frozen under an adapter: read, never
    /// saved), its per-position outputs laid back on `[R, T − 1]`, and the head's own
    /// token-mean loss (which DPO does not use).
    fn fused_head(&mut self, h: Val, dpo: TrlDpo) -> HeadOutputs {
        let c = self.config;
        let (rows, seq) = (self.setup.batch as u64, self.setup.seq as u64);
        let (d, w, vocab) = (c.hidden_size as u64, self.w(), c.vocab_size as u64);
        let shifted = rows * (seq - 1);
        // last_hidden_state[:, :-1] and labels[:, 1:] != -100
        let sliced = self.tape.slice(h, shifted * d * w);
        let mask = self.tape.input(shifted, false);
        let (hidden, targets, n) = match self.setup.device {
            TorchDevice::Cpu => {
                // Every position: `reshape(-1, D)` copies the slice (contiguous only for
                // R = 1), `labels.clamp(min=0)` makes the targets.
                let hidden = if rows > 1 {
                    self.tape
                        .fresh(&[sliced], shifted * d * w, FreshGrad::PassesThrough)
                } else {
                    sliced
                };
                (hidden, self.tape.input(shifted * 8, false), shifted)
            }
            TorchDevice::Cuda => {
                // The completion's positions only: `hidden_states[mask]` gathers them
                // (saving the mask's indices, and scattering the gradient back into zeros
                // of the slice's size), `labels[mask]` the targets.
                let n = rows * (seq - (dpo.prompt_tokens as u64).clamp(1, seq));
                let indices = self.tape.input(n * 2 * 8, false);
                let hidden = self.tape.custom(CustomOp {
                    inputs: &[sliced],
                    outputs: &[n * d * w],
                    saved_extra: &[indices],
                    ..Default::default()
                })[0];
                (hidden, self.tape.input(n * 8, false), n)
            }
        };
        let rows_per_tile = n.min(TOKEN_CHUNK);
        let tile_buffer = rows_per_tile * VOCAB_CHUNK * w;
        let (forward_tiles, backward_tiles) = match self.setup.device {
            TorchDevice::Cpu => {
                let f32_tile = rows_per_tile * vocab.min(VOCAB_CHUNK) * 4;
                let bool_tile = f32_tile / 4;
                (3 * f32_tile + bool_tile, 7 * f32_tile + bool_tile)
            }
            TorchDevice::Cuda => (0, 0),
        };
        // The backward accumulates the hidden states' gradient in f32 and casts it.
        let f32_grad = if w == 4 { 0 } else { n * d * 4 };
        // Outputs: log-probabilities, entropy, mean logit, is-top-1, and log Z (kept).
        let out = self.tape.custom(CustomOp {
            inputs: &[hidden],
            outputs: &[n * 4, n * 4, n * 4, n, n * 4],
            saved_inputs: &[hidden],
            saved_outputs: &[4, 1],
            saved_extra: &[targets],
            forward_scratch: FORWARD_STATS * n * 4 + tile_buffer + forward_tiles,
            scratch: tile_buffer + backward_tiles + f32_grad,
        });
        // Back onto [R, T − 1]: `masked_fill(~mask, 0)` of each output on the CPU (the
        // differentiable two save their `~mask`), `new_zeros(…).masked_scatter(mask, x)` on
        // CUDA (saving the mask).
        let mut laid = Vec::with_capacity(4);
        for (i, &x) in out[..4].iter().enumerate() {
            let differentiable = i < 2;
            let value_bytes = if i == 3 { shifted } else { shifted * 4 };
            let v = match self.setup.device {
                TorchDevice::Cpu => {
                    let not_mask = self.tape.input(shifted, false);
                    if differentiable {
                        self.tape.custom(CustomOp {
                            inputs: &[x],
                            outputs: &[value_bytes],
                            saved_extra: &[not_mask],
                            ..Default::default()
                        })[0]
                    } else {
                        self.tape.read(&[x, not_mask]);
                        self.tape.input(value_bytes, false)
                    }
                }
                TorchDevice::Cuda => {
                    let zeros = self.tape.input(value_bytes, false);
                    if differentiable {
                        self.tape.custom(CustomOp {
                            inputs: &[x, zeros],
                            outputs: &[value_bytes],
                            saved_extra: &[mask],
                            ..Default::default()
                        })[0]
                    } else {
                        self.tape.read(&[x, zeros, mask]);
                        self.tape.input(value_bytes, false)
                    }
                }
            };
            laid.push(v);
        }
        // loss = -log_probs.sum() / mask.sum().clamp(min=1): the division keeps its divisor.
        let total = self.tape.fresh(&[laid[0]], 4, FreshGrad::Allocates);
        let negated = self.tape.fresh(&[total], 4, FreshGrad::Allocates);
        let divisor = self.tape.input(8, false);
        self.tape.custom(CustomOp {
            inputs: &[negated],
            outputs: &[4],
            saved_extra: &[divisor],
            ..Default::default()
        });
        // `backbone_outputs` holds the last hidden states until the head returns.
        self.tape.read(&[h]);
        HeadOutputs {
            log_probs: laid[0],
            others: [laid[1], laid[2], laid[3], mask],
        }
    }
}
