//! Turning a plain [`Llama`] into a LoRA or QLoRA model, and back: freeze the base, quantize the
//! block linears to NF4, attach adapters, merge and unmerge them by value.
//!
//! As in bitsandbytes/peft, only the seven linears of each decoder block are quantized or
//! adapted; embeddings, norms and the LM head stay in float and frozen.

use std::sync::Arc;

use burn::module::{Module, Param};
use burn::tensor::{Device, FloatDType, Tensor};

use super::embedding_lora::EmbeddingLora;
use super::linear::{BaseWeight, Linear, Nf4Weight};
use super::llama::Llama;
use super::lora::LoraAdapter;
use crate::config::{FUSED_PROJECTIONS, LlamaConfig, LoraConfig, LoraTarget, Nf4Config};
use crate::error::{Error, Result};
use crate::kernels::values::to_f32_vec;
use crate::quant::nf4::Nf4Tensor;

/// Replaces a dense base weight by its NF4 quantization (the float weight is dropped).
fn quantize_linear(
    linear: &mut Linear,
    config: &Nf4Config,
    device: &Device,
    path: &str,
) -> Result<()> {
    if let BaseWeight::Dense(w) = &linear.base {
        let [out, inp] = w.shape().dims::<2>();
        let values = to_f32_vec(w.val());
        let q = Nf4Tensor::quantize(&values, &[out, inp], config)
            .map_err(|e| Error::Input(format!("{path}: {e}")))?;
        linear.base = BaseWeight::Nf4(Nf4Weight::new(Arc::new(q), device));
    }
    Ok(())
}

/// Quantizes one block's seven linears (in [`LoraTarget::ALL`]'s order). Phi-3's fused groups
/// (q, k, v; gate, up) are quantized as one tensor each, as bitsandbytes quantizes its
/// `qkv_proj` and `gate_up_proj` ([`Nf4Tensor::quantize_parts`]); every other linear alone.
fn quantize_block(
    linears: [&mut Linear; 7],
    model: &LlamaConfig,
    config: &Nf4Config,
    device: &Device,
    layer: usize,
) -> Result<()> {
    let mut linears = linears.map(Some);
    let fused_groups = if model.fused_projections {
        &FUSED_PROJECTIONS[..]
    } else {
        &[]
    };
    for (fused, parts) in fused_groups {
        let in_group: Vec<bool> = LoraTarget::ALL
            .iter()
            .map(|t| parts.contains(&t.block_path()))
            .collect();
        // A group with a part already quantized is left to the linears one by one below.
        let dense: Option<Vec<Vec<f32>>> = linears
            .iter()
            .zip(&in_group)
            .filter(|(_, member)| **member)
            .map(|(l, _)| match l.as_ref().map(|l| &l.base) {
                Some(BaseWeight::Dense(w)) => Some(to_f32_vec(w.val())),
                _ => None,
            })
            .collect();
        let Some(values) = dense else {
            continue;
        };
        let mut group: Vec<&mut Linear> = linears
            .iter_mut()
            .zip(&in_group)
            .filter(|(_, member)| **member)
            .filter_map(|(l, _)| l.take())
            .collect();
        let rows: Vec<usize> = group.iter().map(|l| l.dims()[0]).collect();
        let cols = group[0].dims()[1];
        let quantized = Nf4Tensor::quantize_parts(&values.concat(), &rows, cols, config)
            .map_err(|e| Error::Input(format!("model.layers.{layer}.{fused}: {e}")))?;
        for (linear, q) in group.iter_mut().zip(quantized) {
            linear.base = BaseWeight::Nf4(Nf4Weight::new(Arc::new(q), device));
        }
    }
    for (target, linear) in LoraTarget::ALL.into_iter().zip(linears) {
        if let Some(linear) = linear {
            let path = format!("model.layers.{layer}.{}", target.block_path());
            quantize_linear(linear, config, device, &path)?;
        }
    }
    Ok(())
}

/// Adapters taken out of a model by [`Llama::merge_lora`], keyed by HF module path.
pub type DetachedAdapters = Vec<(String, LoraAdapter)>;

/// A fresh adapter for `linear` (peft's defaults: A kaiming-uniform, B = 0; with DoRA the
/// magnitude at the base weight's row norms, NF4's dequantized).
fn fresh_adapter(linear: &Linear, config: &LoraConfig, device: &Device) -> LoraAdapter {
    let [out, inp] = linear.dims();
    let adapter = LoraAdapter::init(out, inp, config.r, config.scaling(), config.dropout, device);
    if !config.use_dora {
        return adapter;
    }
    let weight = linear.dense_weight(device).detach().cast(FloatDType::F32);
    let magnitude = adapter.direct_norm(weight.clone());
    adapter.with_dora(magnitude, weight)
}

/// Refuses adapters on the embedding or the head that napkin does not build: either on a model
/// whose head is its embedding (the two would no longer be one matrix), DoRA on the embedding.
pub(crate) fn model_takes_outer_adapters(model: &LlamaConfig, lora: &LoraConfig) -> Result<()> {
    if (lora.embedding || lora.head) && model.tie_word_embeddings {
        return Err(Error::config(
            "--lora-targets",
            "LoRA on embed_tokens or lm_head of a model whose head is tied to its embedding is not supported",
        ));
    }
    if lora.embedding && lora.use_dora {
        return Err(Error::config(
            "--dora",
            "DoRA on embed_tokens is not supported (lm_head and the block linears take it)",
        ));
    }
    Ok(())
}

impl Llama {
    /// Freezes every base parameter (no gradients, no optimizer state).
    pub fn freeze_base(self) -> Self {
        self.no_grad()
    }

    /// Stores the frozen dense weights of the block linears in `dtype` (bf16 / f16), as a
    /// model loaded in half precision for LoRA is: half the weight bytes, and under autocast
    /// no cast copy per forward. Trainable weights, NF4 weights, norms and the embedding stay
    /// as they are.
    pub fn cast_frozen_base(mut self, dtype: FloatDType) -> Self {
        for named in self.block_linears_mut() {
            if let BaseWeight::Dense(w) = &named.linear.base
                && !w.val().is_require_grad()
            {
                let cast = w.val().detach().cast(dtype);
                named.linear.base =
                    BaseWeight::Dense(Param::from_tensor(cast).set_require_grad(false));
            }
        }
        self
    }

    /// Replaces the dense weight of every block linear by its NF4 quantization (Phi-3's fused
    /// groups as one tensor each, `quantize_block`). The float weights are dropped: after
    /// this, the model holds codes and scales only.
    pub fn quantize_nf4(mut self, config: &Nf4Config) -> Result<Self> {
        config.validate()?;
        let device = self.device();
        let model = self.config.clone();
        for (layer, block) in self.layers.iter_mut().enumerate() {
            quantize_block(block.linears_mut(), &model, config, &device, layer)?;
        }
        Ok(self)
    }

    /// A randomly initialised model whose block linears are NF4 from the start: each block is
    /// quantized as soon as it is made, so the f32 weights of only one block exist at a time
    /// (a TinyLlama-sized model never holds its 4.4 GB of f32 block weights). The values are
    /// those of [`Llama::init`] followed by [`quantize_nf4`](Self::quantize_nf4): the same
    /// random draws in the same order.
    pub fn init_nf4(config: &LlamaConfig, device: &Device, nf4: &Nf4Config) -> Result<Self> {
        nf4.validate()?;
        Llama::init_blocks(config, device, |layer, block| {
            quantize_block(block.linears_mut(), config, nf4, device, layer)
        })
    }

    /// Freezes the base and attaches freshly initialised adapters (peft defaults: A
    /// kaiming-uniform, B = 0) to the targeted linears; with DoRA each magnitude starts at its
    /// base weight's row norms (NF4: the dequantized weight's), as peft's. Seed with
    /// `device.seed(..)` first.
    pub fn with_lora(self, config: &LoraConfig) -> Result<Self> {
        config.validate()?;
        if config.use_dora && self.config.fused_projections {
            return Err(Error::config(
                "--dora",
                "DoRA on a model with fused projections (Phi-3) is not supported",
            ));
        }
        model_takes_outer_adapters(&self.config, config)?;
        let mut model = self.freeze_base();
        let device = model.device();
        let (vocab, dim) = (model.config.vocab_size, model.config.hidden_size);
        if config.embedding {
            model.embed_lora = Some(EmbeddingLora::init(
                vocab,
                dim,
                config.r,
                config.scaling(),
                &device,
            ));
        }
        if let Some(head) = model.lm_head.as_mut().filter(|_| config.head) {
            head.lora = Some(fresh_adapter(head, config, &device));
        }
        for named in model.block_linears_mut() {
            if config.targets(named.target) {
                named.linear.lora = Some(fresh_adapter(named.linear, config, &device));
            }
        }
        Ok(model)
    }

    /// Folds every adapter into its base weight by value, `W ← W + s·B·A` (DoRA: each row
    /// rescaled to its magnitude), and returns the adapters. An NF4 base becomes dense (the
    /// merged weight is not re-quantized).
    pub fn merge_lora(mut self) -> (Self, DetachedAdapters) {
        let device = self.device();
        let mut detached = Vec::new();
        if let Some(lora) = self.embed_lora.take() {
            let merged = self.embed_tokens.val() + lora.delta_weight();
            self.embed_tokens = Param::from_tensor(merged.detach()).set_require_grad(false);
        }
        if let Some(head) = &mut self.lm_head
            && let Some(adapter) = head.lora.take()
        {
            let merged = adapter.merged_weight(head.dense_weight(&device));
            head.base =
                BaseWeight::Dense(Param::from_tensor(merged.detach()).set_require_grad(false));
            detached.push(("lm_head".to_string(), adapter));
        }
        for named in self.block_linears_mut() {
            if let Some(adapter) = named.linear.lora.take() {
                let merged = adapter.merged_weight(named.linear.dense_weight(&device));
                named.linear.base =
                    BaseWeight::Dense(Param::from_tensor(merged.detach()).set_require_grad(false));
                detached.push((named.path, adapter));
            }
        }
        (self, detached)
    }

    /// The same model with every adapter taken off: the base it trains on, sharing its weights
    /// (tensor handles are reference-counted, an NF4 base is behind an `Arc`), so it costs no
    /// memory. DPO's reference for an adapter the run starts fresh (peft's adapter disabled).
    pub fn without_adapters(&self) -> Self {
        let mut base = self.clone();
        for named in base.block_linears_mut() {
            named.linear.lora = None;
        }
        base.embed_lora = None;
        if let Some(head) = &mut base.lm_head {
            head.lora = None;
        }
        base
    }

    /// The inverse of [`merge_lora`](Self::merge_lora): `W ← W − s·B·A` and the adapters are
    /// attached again. Fails if an adapter names a module this model lacks or has another shape.
    pub fn unmerge_lora(mut self, adapters: DetachedAdapters) -> Result<Self> {
        let device = self.device();
        let mut by_path: std::collections::HashMap<String, LoraAdapter> =
            adapters.into_iter().collect();
        for named in self.block_linears_mut() {
            if let Some(adapter) = by_path.remove(&named.path) {
                if adapter.magnitude.is_some() {
                    // The row norms of the unmerged weight are not in the merged one.
                    return Err(Error::Input(format!(
                        "{}: a merged DoRA adapter cannot be taken out again",
                        named.path
                    )));
                }
                let delta = adapter.delta_weight();
                if delta.dims() != named.linear.dims() {
                    return Err(Error::Input(format!(
                        "{}: adapter shape {:?} does not match the weight {:?}",
                        named.path,
                        delta.dims(),
                        named.linear.dims()
                    )));
                }
                let base = named.linear.dense_weight(&device) - delta;
                named.linear.base =
                    BaseWeight::Dense(Param::from_tensor(base.detach()).set_require_grad(false));
                named.linear.lora = Some(adapter);
            }
        }
        if let Some(path) = by_path.keys().next() {
            return Err(Error::Input(format!(
                "adapter for `{path}`, which this model does not have"
            )));
        }
        Ok(self)
    }

    /// The adapters in module order, with their HF module paths.
    pub fn lora_adapters(&self) -> Vec<(String, LoraTarget, &LoraAdapter)> {
        self.block_linears()
            .into_iter()
            .filter_map(|n| n.linear.lora.as_ref().map(|a| (n.path, n.target, a)))
            .collect()
    }

    /// The adapters outside the blocks: the LM head's (`lm_head`), with its module path.
    pub fn head_adapter(&self) -> Option<(&'static str, &LoraAdapter)> {
        self.lm_head
            .as_ref()
            .and_then(|h| h.lora.as_ref())
            .map(|a| ("lm_head", a))
    }

    /// Number of trainable values: adapters when present, else every parameter.
    pub fn trainable_parameters(&self) -> u64 {
        let embedding = self.embed_lora.as_ref().map_or(0, |e| {
            (e.lora_a.shape().num_elements() + e.lora_b.shape().num_elements()) as u64
        });
        let adapters: u64 = self
            .lora_adapters()
            .into_iter()
            .map(|(_, _, a)| a)
            .chain(self.head_adapter().map(|(_, a)| a))
            .map(|a| {
                let magnitude = a.magnitude.as_ref().map_or(0, |m| m.shape().num_elements());
                (a.lora_a.shape().num_elements() + a.lora_b.shape().num_elements() + magnitude)
                    as u64
            })
            .sum::<u64>()
            + embedding;
        if adapters > 0 {
            adapters
        } else {
            self.config.num_parameters()
        }
    }

    /// A copy of the model on another device; NF4 codes are uploaded there once when it is a
    /// GPU (`fork` moves tensors, not the codes a module skips).
    pub fn on_device(self, device: &Device) -> Self {
        let mut model = self.fork(device);
        for named in model.block_linears_mut() {
            if let BaseWeight::Nf4(w) = &named.linear.base {
                named.linear.base = BaseWeight::Nf4(w.placed_on(device));
            }
        }
        model
    }
}

impl Linear {
    /// Whether the base weight is NF4.
    pub fn is_nf4(&self) -> bool {
        matches!(self.base, BaseWeight::Nf4(_))
    }
}

/// A `[rows, cols]` tensor from host values (for adapters read from files).
pub fn matrix(values: Vec<f32>, rows: usize, cols: usize, device: &Device) -> Tensor<2> {
    Tensor::from_data(burn::tensor::TensorData::new(values, [rows, cols]), device)
}
