//! `Llama`: Hugging Face `LlamaForCausalLM` in burn — embedding, N decoder blocks, final norm,
//! LM head (tied to the embedding or not).

use burn::module::{Module, Param};
use burn::tensor::{Device, Distribution, Int, Tensor, module::embedding};

use super::attention::AttentionMask;
use super::autocast::linear_matmul;
use super::batch::TokenBatch;
use super::block::DecoderBlock;
use super::embedding_lora::EmbeddingLora;
use super::linear::Linear;
use super::rms_norm::RmsNorm;
use super::rope::{RopeTables, inverse_frequencies};
use crate::config::{AttentionKind, LlamaConfig};
use crate::kernels::efficient_attention::TiledMask;

/// A decoder-only Llama.
#[derive(Module, Debug)]
pub struct Llama {
    /// `[V, D]` token embedding (also the LM head when tied).
    pub embed_tokens: Param<Tensor<2>>,
    /// L decoder blocks.
    pub layers: Vec<DecoderBlock>,
    /// Final RMSNorm.
    pub norm: RmsNorm,
    /// `[V, D]` LM head; `None` when the embedding is tied. It may carry a LoRA adapter.
    pub lm_head: Option<Linear>,
    /// A LoRA adapter on the token embedding (peft's `embed_tokens`).
    pub embed_lora: Option<EmbeddingLora>,
    /// The hyper-parameters the model was built from.
    #[module(skip)]
    pub config: LlamaConfig,
    /// How the blocks compute attention (a run setting, not part of the checkpoint).
    #[module(skip)]
    pub attention: AttentionKind,
}

/// What a forward pass needs besides the residual stream: RoPE tables and the mask.
#[derive(Debug, Clone)]
pub struct ForwardContext {
    /// cos/sin tables for the batch's positions.
    pub rope: RopeTables,
    /// Causal (and segment) visibility: a dense additive `[1 or B, 1, T, T]` mask for the eager
    /// attention, segment ids for the tiled one.
    pub mask: AttentionMask,
}

impl Llama {
    /// A randomly initialised model (HF init: N(0, 0.02) for linears and the embedding, unit
    /// norms). Call `device.seed(..)` first for a reproducible draw.
    pub fn init(config: &LlamaConfig, device: &Device) -> Self {
        match Llama::init_blocks::<std::convert::Infallible>(config, device, |_, _| Ok(())) {
            Ok(model) => model,
            Err(never) => match never {},
        }
    }

    /// [`init`](Self::init), with `each(layer, block)` applied to every decoder block as soon
    /// as it is made (before the next block's random draws).
    pub(crate) fn init_blocks<E>(
        config: &LlamaConfig,
        device: &Device,
        mut each: impl FnMut(usize, &mut DecoderBlock) -> std::result::Result<(), E>,
    ) -> std::result::Result<Self, E> {
        let embed = Tensor::random(
            [config.vocab_size, config.hidden_size],
            Distribution::Normal(0.0, 0.02),
            device,
        );
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for layer in 0..config.num_hidden_layers {
            let mut block = DecoderBlock::init(config, device);
            each(layer, &mut block)?;
            layers.push(block);
        }
        Ok(Llama {
            embed_tokens: Param::from_tensor(embed),
            layers,
            norm: RmsNorm::init(config.hidden_size, config.rms_norm_eps, device),
            lm_head: (!config.tie_word_embeddings)
                .then(|| Linear::init(config.vocab_size, config.hidden_size, device)),
            embed_lora: None,
            config: config.clone(),
            attention: AttentionKind::default(),
        })
    }

    /// The device the weights live on.
    pub fn device(&self) -> Device {
        self.embed_tokens.val().device()
    }

    /// RoPE tables and mask for a batch.
    pub fn context(&self, batch: &TokenBatch) -> ForwardContext {
        let device = self.device();
        let inv_freq = inverse_frequencies(&self.config);
        ForwardContext {
            rope: RopeTables::new(&inv_freq, &batch.positions, batch.batch, batch.seq, &device),
            mask: match self.attention {
                AttentionKind::Eager => {
                    AttentionMask::Dense(batch.attention_mask(&device, self.config.sliding_window))
                }
                AttentionKind::Efficient => AttentionMask::Tiled(TiledMask::new(
                    batch.batch,
                    batch.seq,
                    batch.is_packed().then_some(batch.segments.as_slice()),
                    self.config.sliding_window,
                )),
            },
        }
    }

    /// # Shapes
    /// - returns the embedded tokens `[B, T, D]`
    pub fn embed(&self, batch: &TokenBatch) -> Tensor<3> {
        self.embed_ids(batch.ids_tensor(&self.device()))
    }

    /// [`Llama::embed`] of token ids already on the device.
    ///
    /// # Shapes
    /// - `ids`: `[B, T]` → `[B, T, D]`
    pub fn embed_ids(&self, ids: Tensor<2, Int>) -> Tensor<3> {
        let x = embedding(self.embed_tokens.val(), ids.clone());
        match &self.embed_lora {
            Some(lora) => x + lora.forward(ids),
            None => x,
        }
    }

    /// Final norm and LM head.
    ///
    /// # Shapes
    /// - `x`: `[B, T, D]` → logits `[B, T, V]`
    pub fn head(&self, x: Tensor<3>) -> Tensor<3> {
        self.head_product(self.norm.forward(x))
    }

    /// The LM head alone, on the final norm's output.
    ///
    /// # Shapes
    /// - `x`: `[B, T, D]` → logits `[B, T, V]`
    pub fn head_product(&self, x: Tensor<3>) -> Tensor<3> {
        match &self.lm_head {
            Some(lm_head) => lm_head.forward(x),
            None => {
                let [b, t, d] = x.dims();
                let v = self.config.vocab_size;
                let logits = linear_matmul(x.reshape([b * t, d]), self.embed_tokens.val()); // [B·T, V]
                logits.reshape([b, t, v])
            }
        }
    }

    /// The full forward pass.
    ///
    /// # Shapes
    /// - returns logits `[B, T, V]`
    pub fn forward(&self, batch: &TokenBatch) -> Tensor<3> {
        self.forward_embedded(self.embed(batch), batch)
    }

    /// The forward pass from already embedded tokens (the blocks and the head).
    ///
    /// # Shapes
    /// - `x`: `[B, T, D]` → logits `[B, T, V]`
    pub fn forward_embedded(&self, x: Tensor<3>, batch: &TokenBatch) -> Tensor<3> {
        self.forward_in(x, &self.context(batch))
    }

    /// [`Llama::forward_embedded`] with the batch's RoPE tables and mask already on the device.
    ///
    /// # Shapes
    /// - `x`: `[B, T, D]` → logits `[B, T, V]`
    pub fn forward_in(&self, x: Tensor<3>, ctx: &ForwardContext) -> Tensor<3> {
        self.head(self.blocks_in(x, ctx))
    }

    /// The decoder blocks alone: the last block's output, the final norm's input.
    ///
    /// # Shapes
    /// - `x`: `[B, T, D]` → `[B, T, D]`
    pub fn blocks_in(&self, mut x: Tensor<3>, ctx: &ForwardContext) -> Tensor<3> {
        for layer in &self.layers {
            x = layer.forward(x, &ctx.rope, &ctx.mask);
        }
        x
    }
}
