//! One optimizer step's forward and backward, written out so a learner can see where each trick
//! acts: micro-batches with token-weighted gradient accumulation, and gradient checkpointing at
//! decoder-block granularity (as PyTorch/HF do it).

use burn::module::Module;
use burn::tensor::module::embedding;
use burn::tensor::{Int, Tensor};

use super::grads::ParamGrads;
use crate::data::MicroBatch;
use crate::error::{Error, Result};
use crate::kernels::values::scalar;
use crate::model::chunked_loss::chunked_lm_loss;
use crate::model::dropout_draw::{drawing, micro_batch_key};
use crate::model::{ForwardContext, Llama, TokenBatch, causal_lm_loss};

/// How micro-batch losses are combined into the step's gradient.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accumulation {
    /// Σᵢ ∇(loss_sumᵢ / N), N = label tokens of the whole step: equals the big-batch gradient
    /// whatever the token counts of the micro-batches.
    TokenWeighted,
    /// Σᵢ ∇(meanᵢ / K) over K micro-batches: the common mistake, wrong when micro-batches hold
    /// different numbers of label tokens. Kept to show (and test) that it is wrong.
    MeanOfMeans,
}

/// The result of a step's forward and backward.
#[derive(Debug, Clone)]
pub struct StepGradients {
    /// Accumulated gradients of the trainable parameters.
    pub grads: ParamGrads,
    /// Mean loss over every label token of the step.
    pub loss: f32,
    /// Label tokens in the step.
    pub tokens: usize,
}

/// A step's forward and backward with its loss not yet read: nothing has come back from the
/// device, so a caller that must not block on a read (the browser on WebGPU) can await it.
#[derive(Debug, Clone)]
pub struct UnreadStep {
    /// Accumulated gradients of the trainable parameters.
    pub grads: ParamGrads,
    /// `[1]`: Σ −log p(label) over every label token of the step, on the model's device,
    /// outside any graph.
    pub loss_sum: Tensor<1>,
    /// Label tokens in the step.
    pub tokens: usize,
}

impl UnreadStep {
    /// `[1]`: the mean loss over the step's label tokens, still on the device.
    pub fn mean_loss(&self) -> Tensor<1> {
        self.loss_sum.clone() / self.tokens.max(1) as f64
    }

    /// Reads the loss back (blocks until the device has computed it).
    pub fn read(self) -> StepGradients {
        let loss = scalar(self.mean_loss());
        StepGradients {
            grads: self.grads,
            loss,
            tokens: self.tokens,
        }
    }
}

/// How a step's forward and backward run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepOptions {
    /// Block-level gradient checkpointing (recompute each block in the backward).
    pub checkpointing: bool,
    /// How the micro-batches' losses combine into the step's gradient.
    pub accumulation: Accumulation,
    /// The loss is multiplied by this before each backward (f16 loss scaling: small gradients
    /// stay representable); the gradients come back scaled, the loss does not. 1 for none.
    pub loss_scale: f64,
    /// The step's LoRA dropout stream: micro-batch `i` draws its masks from
    /// `dropout_draw::micro_batch_key(dropout_key, i)`, with or without checkpointing.
    pub dropout_key: u64,
    /// The head and the loss this many logits rows at a time (`model::chunked_loss`; a frozen
    /// head only), or the whole `[B, T, V]` logits at once (None).
    pub loss_chunk_rows: Option<usize>,
}

impl Default for StepOptions {
    /// No checkpointing, token-weighted accumulation, no loss scaling.
    fn default() -> Self {
        StepOptions {
            checkpointing: false,
            accumulation: Accumulation::TokenWeighted,
            loss_scale: 1.0,
            dropout_key: 0,
            loss_chunk_rows: None,
        }
    }
}

impl StepOptions {
    /// These options with checkpointing on or off.
    pub fn with_checkpointing(self, checkpointing: bool) -> Self {
        StepOptions {
            checkpointing,
            ..self
        }
    }

    /// These options with the head and the loss run `rows` logits rows at a time (None: the
    /// whole logits).
    pub fn with_loss_chunk_rows(self, rows: Option<usize>) -> Self {
        StepOptions {
            loss_chunk_rows: rows,
            ..self
        }
    }

    /// These options with another accumulation rule.
    pub fn with_accumulation(self, accumulation: Accumulation) -> Self {
        StepOptions {
            accumulation,
            ..self
        }
    }

    /// These options with the loss scaled by `loss_scale` before each backward.
    pub fn with_loss_scale(self, loss_scale: f64) -> Self {
        StepOptions { loss_scale, ..self }
    }

    /// These options with LoRA dropout drawing from stream `dropout_key` (the trainer gives
    /// each step its own, from the run's seed and the step's number).
    pub fn with_dropout_key(self, dropout_key: u64) -> Self {
        StepOptions {
            dropout_key,
            ..self
        }
    }
}

/// Forward and backward over every micro-batch, accumulating gradients. Nothing is read back:
/// the loss stays on the device until the caller reads it ([`UnreadStep::read`]) or awaits
/// it, and every backward is queued before that read (one read per step).
pub fn forward_backward(
    model: &Llama,
    micro_batches: &[MicroBatch],
    options: &StepOptions,
) -> Result<UnreadStep> {
    forward_backward_marked(model, micro_batches, options, &mut || {})
}

/// [`forward_backward`] calling `mark` where the step holds the most: after each forward that
/// keeps a graph, before its backward (with checkpointing: after the graph-free forward, after
/// the head's forward and after each block's recomputation). A meter that can only read the
/// device between operations (a GPU memory pool) takes its marks there.
pub fn forward_backward_marked(
    model: &Llama,
    micro_batches: &[MicroBatch],
    options: &StepOptions,
    mark: &mut dyn FnMut(),
) -> Result<UnreadStep> {
    let StepOptions {
        checkpointing,
        accumulation,
        loss_scale,
        dropout_key,
        loss_chunk_rows,
    } = *options;
    let total: usize = micro_batches.iter().map(MicroBatch::label_tokens).sum();
    if total == 0 {
        return Err(Error::Input(
            "no label tokens in this step (every label is -100)".into(),
        ));
    }
    let mut grads = ParamGrads::new();
    let mut loss_sum: Option<Tensor<1>> = None;
    for (index, micro) in micro_batches.iter().enumerate() {
        let key = micro_batch_key(dropout_key, index);
        // The factor that turns this micro-batch's summed loss into its share of the step's.
        let scale = match accumulation {
            Accumulation::TokenWeighted => loss_scale / total as f64,
            Accumulation::MeanOfMeans => {
                loss_scale / (micro_batches.len() * micro.label_tokens().max(1)) as f64
            }
        };
        let mut head_loss = |top: Tensor<3>| -> Result<(Tensor<1>, Tensor<1>)> {
            if let Some(rows) = loss_chunk_rows {
                let (surrogate, sum) = chunked_lm_loss(model, top, &micro.labels, rows)?;
                return Ok((surrogate * scale, sum));
            }
            let loss = causal_lm_loss(model.head(top), &micro.labels)?;
            Ok((loss.sum.clone() * scale, loss.sum.inner()))
        };
        let (micro_grads, micro_loss_sum) =
            micro_backward(model, micro, checkpointing, key, mark, &mut head_loss)?;
        grads.add(micro_grads);
        loss_sum = Some(match loss_sum {
            Some(sum) => sum + micro_loss_sum,
            None => micro_loss_sum,
        });
    }
    let loss_sum = loss_sum.ok_or_else(|| Error::Input("a step needs a micro-batch".into()))?;
    Ok(UnreadStep {
        grads,
        loss_sum,
        tokens: total,
    })
}

/// What a micro-batch's last block output (`[B, T, D]`, in the graph: the final norm's input)
/// becomes through the head and the loss: the scaled loss whose backward gives the
/// micro-batch's share of the step's gradient, and the `[1]` value the step reports, outside
/// the graph.
pub(super) type HeadLoss<'a> = dyn FnMut(Tensor<3>) -> Result<(Tensor<1>, Tensor<1>)> + 'a;

/// One micro-batch's forward and backward, whole or checkpointed, with the loss `head_loss`
/// makes of its last block's output: its gradients and the value `head_loss` reported.
pub(super) fn micro_backward(
    model: &Llama,
    micro: &MicroBatch,
    checkpointing: bool,
    dropout_key: u64,
    mark: &mut dyn FnMut(),
    head_loss: &mut HeadLoss<'_>,
) -> Result<(ParamGrads, Tensor<1>)> {
    let recomputes = recomputes_blocks(model, checkpointing);
    let inputs = StepInputs::upload(model, &micro.batch, recomputes);
    micro_backward_on(
        model,
        micro,
        &inputs,
        recomputes,
        dropout_key,
        mark,
        head_loss,
    )
}

/// Whether a step recomputes blocks in its backward: with checkpointing, unless nothing below
/// the LM head trains (an adapter on the head alone: the plain forward then keeps no block
/// activation, so there is nothing to recompute).
pub fn recomputes_blocks(model: &Llama, checkpointing: bool) -> bool {
    checkpointing && below_head_trains(model)
}

/// What a micro-batch's forward reads on the device besides the weights: its token ids and
/// its RoPE tables and mask. A step captured as a device graph keeps one set and writes each
/// new batch's values into it (`train/captured.rs`).
#[derive(Debug, Clone)]
pub(super) struct StepInputs {
    /// `[B, T]`.
    pub ids: Tensor<2, Int>,
    /// The RoPE tables and the mask.
    pub ctx: ForwardContext,
}

impl StepInputs {
    /// `batch`'s inputs uploaded to `model`'s device: outside autodiff when the step
    /// `recomputes` blocks (its graph-free forward reads them), beside the tracked weights
    /// otherwise.
    pub(super) fn upload(model: &Llama, batch: &TokenBatch, recomputes: bool) -> Self {
        let on = |m: &Llama| StepInputs {
            ids: batch.ids_tensor(&m.device()),
            ctx: m.context(batch),
        };
        if recomputes {
            on(&model.valid())
        } else {
            on(model)
        }
    }
}

/// [`micro_backward`] on inputs already on the device; `recomputes` as
/// [`recomputes_blocks`] says, and `inputs` uploaded for it.
pub(super) fn micro_backward_on(
    model: &Llama,
    micro: &MicroBatch,
    inputs: &StepInputs,
    recomputes: bool,
    dropout_key: u64,
    mark: &mut dyn FnMut(),
    head_loss: &mut HeadLoss<'_>,
) -> Result<(ParamGrads, Tensor<1>)> {
    if recomputes {
        checkpointed_backward(model, micro, inputs, dropout_key, mark, head_loss)
    } else {
        plain_backward(model, micro, inputs, dropout_key, mark, head_loss)
    }
}

/// Whether anything below the LM head trains: a block parameter, the embedding or its adapter.
/// Otherwise the blocks run without a graph and a step needs no checkpointing
/// (`Scenario::checkpoints_blocks` predicts the same).
pub fn below_head_trains(model: &Llama) -> bool {
    model.embed_lora.is_some()
        || model.embed_tokens.val().is_require_grad()
        || !super::optimizer::trainable_ids(&model.layers).is_empty()
}

/// Backward through the whole graph: every activation is kept until the backward.
///
/// When the embedding trains, its lookup runs outside the graph and its gradient is added
/// row by row into the parameter's gradient after the backward, as the checkpointed path
/// does. burn's own embedding backward makes a fresh `[V, D]` of zeros per backward and, with
/// a tied head, adds it to the head's `[V, D]` gradient: two `[V, D]` alive at once
/// (measured: a SmolLM2-shaped 2-layer slice, tied, T = 64, step peak 243 MiB against 135
/// predicted; one `[V, D]` is 108 MiB).
fn plain_backward(
    model: &Llama,
    micro: &MicroBatch,
    inputs: &StepInputs,
    dropout_key: u64,
    mark: &mut dyn FnMut(),
    head_loss: &mut HeadLoss<'_>,
) -> Result<(ParamGrads, Tensor<1>)> {
    let batch = &micro.batch;
    // With a trained embedding: the ids and the looked-up `[B, T, D]`, a leaf of the graph.
    let looked_up = model.embed_tokens.val().is_require_grad().then(|| {
        let table = model.embed_tokens.val().inner(); // [V, D], outside autodiff
        let ids = batch.ids_tensor(&table.device()); // [B, T]
        let embedded = Tensor::from_inner(embedding(table, ids.clone())).require_grad();
        (ids, embedded)
    });
    // The blocks draw their dropout masks in order from the micro-batch's stream, as the
    // checkpointed path's graph-free forward does.
    let (top, _) = drawing(dropout_key, 0, || match &looked_up {
        Some((_, embedded)) => model.blocks_in(embedded.clone(), &inputs.ctx),
        None => model.blocks_in(model.embed_ids(inputs.ids.clone()), &inputs.ctx),
    });
    let (loss, loss_sum) = head_loss(top)?;
    mark();
    let mut backward = loss.backward();
    let upstream = match looked_up {
        Some((ids, embedded)) => Some((
            ids,
            embedded
                .grad_remove(&mut backward)
                .ok_or_else(|| Error::Internal("no gradient reached the embedding".into()))?,
        )),
        None => None,
    };
    let mut grads = ParamGrads::from_backward(model, &mut backward);
    drop(backward);
    if let Some((ids, upstream)) = upstream {
        let [b, t, d] = upstream.dims();
        grads.add_rows(
            model.embed_tokens.id,
            model.embed_tokens.val().dims(),
            ids.reshape([b * t]),
            upstream.reshape([b * t, d]),
        );
    }
    Ok((grads, loss_sum))
}

/// Block-level gradient checkpointing.
///
/// 1. Forward without a graph, keeping only each block's input `xᵢ` (`[B, T, D]` each) and
///    the dropout draw it started at.
/// 2. Head: rebuild the graph from `x_L` through the final norm, LM head and loss; backward gives
///    the head's gradients and `∂loss/∂x_L`.
/// 3. For each block from the top: recompute it with a graph from its saved input and
///    backward `Σ(output ⊙ upstream)`, which yields the block's parameter gradients and the
///    gradient for the block below. Only one block's working set exists at a time. The
///    recomputation draws its LoRA dropout masks from the draw its first forward started at,
///    so it drops what that forward dropped (`model::dropout_draw`), as PyTorch's checkpoint
///    does by restoring the RNG state.
/// 4. An adapter on the embedding backpropagates `upstream` through its part of the lookup.
/// 5. The embedding gets `∂E[idsᵢ] += upstreamᵢ` (nothing when it is frozen).
fn checkpointed_backward(
    model: &Llama,
    micro: &MicroBatch,
    inputs: &StepInputs,
    dropout_key: u64,
    mark: &mut dyn FnMut(),
    head_loss: &mut HeadLoss<'_>,
) -> Result<(ParamGrads, Tensor<1>)> {
    let batch = &micro.batch;
    // 1. Graph-free forward: the same weights, outside autodiff.
    let frozen = model.valid();
    let ctx = &inputs.ctx;
    let mut saved: Vec<(Tensor<3>, u64)> = Vec::with_capacity(model.layers.len() + 1);
    let mut x = frozen.embed_ids(inputs.ids.clone()); // [B, T, D]
    let mut draw = 0;
    for block in &frozen.layers {
        let (next, after) = drawing(dropout_key, draw, || {
            block.forward(x.clone(), &ctx.rope, &ctx.mask)
        });
        saved.push((x, draw));
        (x, draw) = (next, after);
    }
    drop(frozen);
    mark();

    // 2. Head with a graph.
    let mut grads = ParamGrads::new();
    let top = Tensor::from_inner(x).require_grad(); // [B, T, D]
    let (loss, loss_sum) = head_loss(top.clone())?;
    mark();
    let mut head_grads = loss.backward();
    let mut upstream = top
        .grad(&head_grads)
        .ok_or_else(|| Error::Internal("no gradient reached the last block".into()))?;
    // The last block's output is not needed again: held to the end of the function it was
    // one more `[B, T, D]` through every block's recomputation and backward.
    drop(top);
    grads.add(ParamGrads::from_backward(model, &mut head_grads));
    drop(head_grads);

    // 3. Blocks, top down, one recomputation at a time.
    for (block, (input, draw)) in model.layers.iter().zip(saved).rev() {
        let input = Tensor::from_inner(input).require_grad();
        let (output, _) = drawing(dropout_key, draw, || {
            block.forward(input.clone(), &ctx.rope, &ctx.mask)
        });
        mark();
        let mut block_grads = (output * Tensor::from_inner(upstream)).sum().backward();
        upstream = input
            .grad(&block_grads)
            .ok_or_else(|| Error::Internal("no gradient reached a block input".into()))?;
        grads.add(ParamGrads::from_backward(block, &mut block_grads));
    }

    // 4. The embedding's adapter (peft's `embed_tokens` LoRA): its part of the lookup again
    //    with a graph, backward `Σ(part ⊙ upstream)`.
    if let Some(lora) = &model.embed_lora {
        let ids = batch.ids_tensor(&model.device());
        let part = lora.forward(ids); // [B, T, D]
        let mut lora_grads = (part * Tensor::from_inner(upstream.clone()))
            .sum()
            .backward();
        grads.add(ParamGrads::from_backward(lora, &mut lora_grads));
    }

    // 5. Embedding, when it trains (full fine-tuning; with LoRA it is frozen).
    // Its gradient is `upstream`'s rows added into the rows of the looked-up ids, straight
    // into the gradient the tied LM head already left (no `[V, D]` zeros and no second
    // `[V, D]` sum, which burn's ops would run on one thread).
    if model.embed_tokens.val().is_require_grad() {
        let [b, t, d] = upstream.dims();
        let ids = batch.ids_tensor(&upstream.device()).reshape([b * t]);
        grads.add_rows(
            model.embed_tokens.id,
            model.embed_tokens.val().dims(),
            ids,
            upstream.reshape([b * t, d]),
        );
    }
    Ok((grads, loss_sum))
}
