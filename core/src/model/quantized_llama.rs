//! A Llama for generation whose linear weights stay in their GGUF blocks (Q4_0, Q4_1, Q8_0, the
//! K-quants) or as a QLoRA base's NF4 codes:
//! the same math as [`Llama`](super::Llama) in inference, run on host vectors with the block
//! products of `kernels::cpu::quantized` (16- or 8-bit activations, integer SIMD dot products), a
//! key/value cache, and no f32 copy of the model. Decoding streams the quantized bytes once per token
//! (SmolLM2-135M Q4_1: 96 MB instead of 538 MB).
//!
//! The order of the math is [`Block`](super::block)'s: `x + attn(norm₁(x))`, then
//! `x + mlp(norm₂(x))`; HF's rotate-half RoPE (the loader undoes llama.cpp's Q/K row order);
//! grouped-query attention (head h reads K/V head `h / (H / Hkv)`); SwiGLU. LoRA adapters
//! (peft's A and B) can sit on any projection, in f32 on the side of the quantized product.

use super::rope::{inverse_frequencies, tables};
use crate::config::{LlamaConfig, LoraTarget};
use crate::error::{Error, Result};
use crate::kernels::cpu::cached_attention::{CachedAttention, HostKv};
use crate::kernels::cpu::quantized::{
    ActivationBits, BlockFormat, QuantizedActivations, QuantizedMatrix,
};
use crate::kernels::cpu::team::{self, Lead};

/// One decoder block's weights, as read from a checkpoint.
#[derive(Debug, Clone)]
pub struct QuantizedBlockWeights {
    /// `[D]`.
    pub attn_norm: Vec<f32>,
    /// `[H·Dh, D]`, rows in HF's order.
    pub q: QuantizedMatrix,
    /// `[Hkv·Dh, D]`, rows in HF's order.
    pub k: QuantizedMatrix,
    /// `[Hkv·Dh, D]`.
    pub v: QuantizedMatrix,
    /// Qwen2's q, k and v biases, `[H·Dh]`, `[Hkv·Dh]`, `[Hkv·Dh]` (q's and k's in HF's row
    /// order); `None` for a Llama.
    pub qkv_bias: Option<[Vec<f32>; 3]>,
    /// Qwen3's q and k head norms, `[Dh]` each; `None` for a Llama.
    pub qk_norm: Option<[Vec<f32>; 2]>,
    /// `[D, H·Dh]`.
    pub o: QuantizedMatrix,
    /// `[D]`.
    pub ffn_norm: Vec<f32>,
    /// `[F, D]`.
    pub gate: QuantizedMatrix,
    /// `[F, D]`.
    pub up: QuantizedMatrix,
    /// `[D, F]`.
    pub down: QuantizedMatrix,
}

/// A LoRA adapter on one projection, on the host in f32: `y += s·(x·Aᵀ)·Bᵀ`; with DoRA each
/// output then scaled by its row's `m / ‖W + s·BA‖` (fixed at inference, so computed once).
#[derive(Debug, Clone)]
struct HostLora {
    /// `[r, in]`.
    a: QuantizedMatrix,
    /// `[out, r]`.
    b: QuantizedMatrix,
    scale: f32,
    /// DoRA's factor per output row, `[out]`.
    dora: Option<Vec<f32>>,
}

impl HostLora {
    /// Adds `s·low·Bᵀ` to `y` (`[T, out]`), given `low = x·Aᵀ` (`[T, r]`), then applies DoRA's
    /// factors.
    fn add_from_low_rank(&self, low: &[f32], y: &mut [f32]) {
        let t = low.len() / self.a.rows();
        let mut delta = vec![0.0; t * self.b.rows()]; // [T, out]
        self.b
            .matmul(&QuantizedActivations::new(low, self.a.rows()), &mut delta);
        y.iter_mut()
            .zip(&delta)
            .for_each(|(y, d)| *y += self.scale * d);
        if let Some(factor) = &self.dora {
            for row in y.chunks_mut(factor.len()) {
                row.iter_mut().zip(factor).for_each(|(y, f)| *y *= f);
            }
        }
    }
}

/// One projection's adapter as peft stores it (row-major f32): `A` `[r, in]`, `B` `[out, r]`,
/// its scale (α/r, or α/√r) and DoRA's magnitude `[out]`.
#[derive(Debug, Clone, Copy)]
pub struct AdapterValues<'a> {
    /// `[r, in]`.
    pub a: &'a [f32],
    /// `[out, r]`.
    pub b: &'a [f32],
    /// r.
    pub rank: usize,
    /// α/r or α/√r.
    pub scale: f32,
    /// DoRA's `m`, `[out]`.
    pub magnitude: Option<&'a [f32]>,
}

/// DoRA's factors `m / ‖W + s·BA‖` of one projection: `weight` `[out, in]` (its rows
/// dequantized one at a time), `a` `[r, in]`, `b` `[out, r]`, `magnitude` `[out]`.
fn dora_factors(
    weight: &QuantizedMatrix,
    a: &[f32],
    b: &[f32],
    r: usize,
    scale: f32,
    magnitude: &[f32],
) -> Vec<f32> {
    let inp = weight.cols();
    let mut row = vec![0.0f32; inp];
    (0..weight.rows())
        .map(|o| {
            weight.dequantize_row(o, &mut row);
            let norm: f64 = row
                .iter()
                .enumerate()
                .map(|(i, &w)| {
                    let low: f32 = (0..r).map(|k| b[o * r + k] * a[k * inp + i]).sum();
                    f64::from(w + scale * low).powi(2)
                })
                .sum::<f64>()
                .sqrt();
            (f64::from(magnitude[o]) / norm) as f32
        })
        .collect()
}

#[derive(Debug, Clone)]
struct QuantizedBlock {
    attn_norm: Vec<f32>,
    /// Q, K, V: they read the same input.
    qkv: [QuantizedMatrix; 3],
    /// Their biases (Qwen2).
    qkv_bias: Option<[Vec<f32>; 3]>,
    /// The q and k head norms' gains (Qwen3), `[Dh]` each.
    qk_norm: Option<[Vec<f32>; 2]>,
    o: QuantizedMatrix,
    ffn_norm: Vec<f32>,
    /// Gate, up: they read the same input.
    gate_up: [QuantizedMatrix; 2],
    down: QuantizedMatrix,
    /// Adapters by [`LoraTarget::ALL`]'s order (q, k, v, o, gate, up, down).
    lora: [Option<HostLora>; 7],
}

impl QuantizedBlock {
    /// `x · Wᵀ` for projections that read the same `x`, the first of them target `first` in
    /// [`LoraTarget::ALL`]'s order, each with its adapter's output (if any) added. The
    /// projections and their adapters' `A` products run as one pass over the threads; each
    /// `B` product then reads its own `[T, r]`.
    ///
    /// # Shapes
    /// - `x`: `[T, in]` → each projection's `[T, rows_i]`
    fn project(
        &self,
        weights: &[QuantizedMatrix],
        first: usize,
        x: &QuantizedActivations,
    ) -> Vec<Vec<f32>> {
        let adapters = &self.lora[first..first + weights.len()];
        let parts: Vec<&QuantizedMatrix> = weights
            .iter()
            .chain(adapters.iter().flatten().map(|lora| &lora.a))
            .collect();
        let mut outs = QuantizedMatrix::matmul_each(&parts, x);
        // One `[T, r]` for each projection that has an adapter, in order: a projection without
        // one takes none (peft's default q,v adapter leaves k between them).
        let lows = outs.split_off(weights.len()); // [T, r] each
        let adapted = outs
            .iter_mut()
            .zip(adapters)
            .filter_map(|(y, lora)| lora.as_ref().map(|lora| (y, lora)));
        for ((y, lora), low) in adapted.zip(lows) {
            lora.add_from_low_rank(&low, y);
        }
        outs
    }

    /// Bytes of the projections' weights.
    fn resident_bytes(&self) -> usize {
        self.qkv
            .iter()
            .chain(&self.gate_up)
            .chain([&self.o, &self.down])
            .map(QuantizedMatrix::resident_bytes)
            .sum()
    }
}

/// The keys and values of every block.
#[derive(Debug, Clone, Default)]
pub struct QuantizedKvCache {
    layers: Vec<HostKv>,
    len: usize,
}

impl QuantizedKvCache {
    /// Positions cached so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A Llama whose linear weights stay quantized (see the module docs).
#[derive(Debug, Clone)]
pub struct QuantizedLlama {
    /// The architecture.
    pub config: LlamaConfig,
    /// `[V, D]`; also the output head when the embeddings are tied.
    embed: QuantizedMatrix,
    layers: Vec<QuantizedBlock>,
    /// `[D]`.
    norm: Vec<f32>,
    /// `[V, D]`, `None` when tied to `embed`.
    head: Option<QuantizedMatrix>,
    inv_freq: Vec<f32>,
    /// The precision the products' inputs are quantized to.
    activation_bits: ActivationBits,
    /// An adapter on the token embedding: A `[r, V]`, B `[D, r]`, its scale.
    embed_lora: Option<(Vec<f32>, Vec<f32>, f32)>,
    /// An adapter on the (untied) head.
    head_lora: Option<HostLora>,
}

/// Which new tokens' logits a pass computes.
#[derive(Debug, Clone, Copy)]
enum Rows {
    /// The last one's (generation).
    Last,
    /// Every one's (scoring).
    Every,
}

impl QuantizedLlama {
    /// The model from its weights; `source` names the checkpoint in messages.
    pub fn new(
        config: LlamaConfig,
        embed: QuantizedMatrix,
        blocks: Vec<QuantizedBlockWeights>,
        norm: Vec<f32>,
        head: Option<QuantizedMatrix>,
        source: &str,
    ) -> Result<Self> {
        let c = &config;
        let (d, f) = (c.hidden_size, c.intermediate_size);
        let (q_rows, kv_rows) = (
            c.num_attention_heads * c.head_dim,
            c.num_key_value_heads * c.head_dim,
        );
        let check = |name: &str, w: &QuantizedMatrix, rows: usize, cols: usize| {
            if (w.rows(), w.cols()) == (rows, cols) {
                Ok(())
            } else {
                Err(Error::Input(format!(
                    "{source}: `{name}` is [{}, {}], the config needs [{rows}, {cols}]",
                    w.rows(),
                    w.cols()
                )))
            }
        };
        let check_norm = |name: &str, w: &[f32]| {
            if w.len() == d {
                Ok(())
            } else {
                Err(Error::Input(format!(
                    "{source}: `{name}` has {} values, not {d}",
                    w.len()
                )))
            }
        };
        check("embedding", &embed, c.vocab_size, d)?;
        if let Some(head) = &head {
            check("output head", head, c.vocab_size, d)?;
        }
        check_norm("final norm", &norm)?;
        if blocks.len() != c.num_hidden_layers {
            return Err(Error::Input(format!(
                "{source}: {} blocks, the config has {}",
                blocks.len(),
                c.num_hidden_layers
            )));
        }
        let mut layers = Vec::with_capacity(blocks.len());
        for (i, b) in blocks.into_iter().enumerate() {
            let name = |part: &str| format!("layers.{i}.{part}");
            check(&name("q"), &b.q, q_rows, d)?;
            check(&name("k"), &b.k, kv_rows, d)?;
            check(&name("v"), &b.v, kv_rows, d)?;
            check(&name("o"), &b.o, d, q_rows)?;
            check(&name("gate"), &b.gate, f, d)?;
            check(&name("up"), &b.up, f, d)?;
            check(&name("down"), &b.down, d, f)?;
            check_norm(&name("attn_norm"), &b.attn_norm)?;
            check_norm(&name("ffn_norm"), &b.ffn_norm)?;
            let biases = [("q", q_rows), ("k", kv_rows), ("v", kv_rows)]
                .map(|(part, rows)| (name(&format!("{part}.bias")), rows));
            check_family_vectors(
                source,
                &name("self_attn"),
                "q, k and v biases",
                b.qkv_bias.as_ref().map(|v| &v[..]),
                c.qkv_bias.then_some(&biases[..]),
            )?;
            let norms =
                ["q_norm", "k_norm"].map(|part| (name(&format!("self_attn.{part}")), c.head_dim));
            check_family_vectors(
                source,
                &name("self_attn"),
                "q and k head norms",
                b.qk_norm.as_ref().map(|v| &v[..]),
                c.qk_norm.then_some(&norms[..]),
            )?;
            layers.push(QuantizedBlock {
                attn_norm: b.attn_norm,
                qkv: [b.q, b.k, b.v],
                qkv_bias: b.qkv_bias,
                qk_norm: b.qk_norm,
                o: b.o,
                ffn_norm: b.ffn_norm,
                gate_up: [b.gate, b.up],
                down: b.down,
                lora: Default::default(),
            });
        }
        Ok(QuantizedLlama {
            inv_freq: inverse_frequencies(&config),
            config,
            embed,
            layers,
            norm,
            head,
            activation_bits: ActivationBits::default(),
            embed_lora: None,
            head_lora: None,
        })
    }

    /// Puts peft's adapter on the token embedding (`lora_embedding_A` `[r, V]`,
    /// `lora_embedding_B` `[D, r]`, row-major f32): each looked-up row gains `s·Aᵀ[id]Bᵀ`.
    pub fn attach_embedding_lora(
        &mut self,
        a: &[f32],
        b: &[f32],
        r: usize,
        scale: f32,
    ) -> Result<()> {
        let (v, d) = (self.config.vocab_size, self.config.hidden_size);
        if r == 0 || a.len() != r * v || b.len() != d * r {
            return Err(Error::Input(format!(
                "embed_tokens: a LoRA of rank {r} needs A [{r}, {v}] and B [{d}, {r}], got {} and {} values",
                a.len(),
                b.len()
            )));
        }
        self.embed_lora = Some((a.to_vec(), b.to_vec(), scale));
        Ok(())
    }

    /// Puts an adapter on the untied LM head (see [`AdapterValues`]).
    pub fn attach_head_lora(&mut self, adapter: &AdapterValues<'_>) -> Result<()> {
        let &AdapterValues {
            a,
            b,
            rank: r,
            scale,
            magnitude,
        } = adapter;
        let (v, d) = (self.config.vocab_size, self.config.hidden_size);
        let Some(head) = &self.head else {
            return Err(Error::Input(
                "lm_head: the head is tied to the embedding; an adapter on it is not supported"
                    .into(),
            ));
        };
        if r == 0 || a.len() != r * d || b.len() != v * r {
            return Err(Error::Input(format!(
                "lm_head: a LoRA of rank {r} needs A [{r}, {d}] and B [{v}, {r}], got {} and {} values",
                a.len(),
                b.len()
            )));
        }
        let dora = magnitude.map(|m| dora_factors(head, a, b, r, scale, m));
        self.head_lora = Some(HostLora {
            a: QuantizedMatrix::from_f32(r, d, a.to_vec()),
            b: QuantizedMatrix::from_f32(v, r, b.to_vec()),
            scale,
            dora,
        });
        Ok(())
    }

    /// Replaces the embedding (or the untied head) with peft's copy of its base layer,
    /// `[V, D]` row-major f32, as peft's loading does.
    pub fn replace_outer_weight(&mut self, head: bool, values: Vec<f32>) -> Result<()> {
        let (v, d) = (self.config.vocab_size, self.config.hidden_size);
        if values.len() != v * d {
            return Err(Error::Input(format!(
                "a base layer of {} values for [{v}, {d}]",
                values.len()
            )));
        }
        let matrix = QuantizedMatrix::from_f32(v, d, values);
        match head {
            true => self.head = Some(matrix),
            false => self.embed = matrix,
        }
        Ok(())
    }

    /// The same model with its products' inputs quantized to `bits`: 16 (the default: logits
    /// within ~1e-4 of the float model's) or 8 (llama.cpp's choice: faster, but a block's
    /// outlier coarsens its other values; SmolLM2's greedy answers change).
    pub fn with_activation_bits(mut self, bits: ActivationBits) -> Self {
        self.activation_bits = bits;
        self
    }

    /// `x` (`[T, cols]`) quantized for the products.
    fn quantized(&self, x: &[f32], cols: usize) -> QuantizedActivations {
        QuantizedActivations::with_bits(x, cols, self.activation_bits)
    }

    /// Bytes of every weight as held (quantized blocks, f32 norms).
    pub fn resident_bytes(&self) -> usize {
        let norms = 4 * (self.norm.len() + self.layers.len() * 2 * self.config.hidden_size);
        let layers: usize = self.layers.iter().map(QuantizedBlock::resident_bytes).sum();
        self.embed.resident_bytes()
            + self
                .head
                .as_ref()
                .map_or(0, QuantizedMatrix::resident_bytes)
            + layers
            + norms
    }

    /// Puts a LoRA adapter on one projection of block `layer` (see [`AdapterValues`]).
    pub fn attach_lora(
        &mut self,
        layer: usize,
        target: LoraTarget,
        adapter: &AdapterValues<'_>,
    ) -> Result<()> {
        let &AdapterValues {
            a,
            b,
            rank: r,
            scale,
            magnitude,
        } = adapter;
        let c = &self.config;
        let (q_rows, kv_rows) = (
            c.num_attention_heads * c.head_dim,
            c.num_key_value_heads * c.head_dim,
        );
        let (d, f) = (c.hidden_size, c.intermediate_size);
        let (out, inp) = match target {
            LoraTarget::QProj => (q_rows, d),
            LoraTarget::KProj | LoraTarget::VProj => (kv_rows, d),
            LoraTarget::OProj => (d, q_rows),
            LoraTarget::GateProj | LoraTarget::UpProj => (f, d),
            LoraTarget::DownProj => (d, f),
        };
        let name = format!("layers.{layer}.{}", target.block_path());
        if r == 0 || a.len() != r * inp || b.len() != out * r {
            return Err(Error::Input(format!(
                "{name}: a LoRA of rank {r} needs A [{r}, {inp}] and B [{out}, {r}], got {} and {} values",
                a.len(),
                b.len()
            )));
        }
        let block = self.layers.get_mut(layer).ok_or_else(|| {
            Error::Input(format!(
                "{name}: the model has {} blocks",
                c.num_hidden_layers
            ))
        })?;
        let i = LoraTarget::ALL
            .iter()
            .position(|&t| t == target)
            .unwrap_or(0);
        let dora = match magnitude {
            Some(m) if m.len() != out => {
                return Err(Error::Input(format!(
                    "{name}: a DoRA magnitude of {} values for {out} rows",
                    m.len()
                )));
            }
            Some(m) => {
                let weight = match target {
                    LoraTarget::QProj => &block.qkv[0],
                    LoraTarget::KProj => &block.qkv[1],
                    LoraTarget::VProj => &block.qkv[2],
                    LoraTarget::OProj => &block.o,
                    LoraTarget::GateProj => &block.gate_up[0],
                    LoraTarget::UpProj => &block.gate_up[1],
                    LoraTarget::DownProj => &block.down,
                };
                Some(dora_factors(weight, a, b, r, scale, m))
            }
            None => None,
        };
        block.lora[i] = Some(HostLora {
            a: QuantizedMatrix::from_f32(r, inp, a.to_vec()),
            b: QuantizedMatrix::from_f32(out, r, b.to_vec()),
            scale,
            dora,
        });
        Ok(())
    }

    /// How many weight matrices are held in each format.
    pub fn format_counts(&self) -> Vec<(BlockFormat, usize)> {
        let mut all: Vec<&QuantizedMatrix> = vec![&self.embed];
        all.extend(&self.head);
        for l in &self.layers {
            all.extend(l.qkv.iter().chain(&l.gate_up).chain([&l.o, &l.down]));
        }
        let mut counts: Vec<(BlockFormat, usize)> = Vec::new();
        for m in all {
            match counts.iter_mut().find(|(f, _)| *f == m.format()) {
                Some((_, n)) => *n += 1,
                None => counts.push((m.format(), 1)),
            }
        }
        counts
    }

    /// Logits of the last new token, running only the new tokens through the model.
    ///
    /// # Shapes
    /// - `new_ids`: T new tokens of one sequence → `[V]`
    pub fn next_token_logits(
        &self,
        new_ids: &[u32],
        cache: &mut QuantizedKvCache,
    ) -> Result<Vec<f32>> {
        self.logits_of(new_ids, cache, Rows::Last)
    }

    /// Logits of every new token (what scoring a text needs), from the same pass as
    /// [`Self::next_token_logits`]: row `t` holds the bits that decoding token `t` alone gives.
    ///
    /// # Shapes
    /// - `new_ids`: T new tokens of one sequence → `[T, V]` (row-major)
    pub fn every_token_logits(
        &self,
        new_ids: &[u32],
        cache: &mut QuantizedKvCache,
    ) -> Result<Vec<f32>> {
        self.logits_of(new_ids, cache, Rows::Every)
    }

    /// The new tokens' pass, then the head on the `rows` asked for.
    fn logits_of(
        &self,
        new_ids: &[u32],
        cache: &mut QuantizedKvCache,
        rows: Rows,
    ) -> Result<Vec<f32>> {
        let c = &self.config;
        if new_ids.is_empty() {
            return Err(Error::Input("no tokens to feed the model".into()));
        }
        if let Some(id) = new_ids.iter().find(|&&id| id as usize >= c.vocab_size) {
            return Err(Error::Input(format!(
                "token id {id} is out of range for a vocabulary of {}",
                c.vocab_size
            )));
        }
        // The whole forward pass as one team: the other threads spin between its parallel
        // passes (four products and the attention a block) instead of sleeping and being woken
        // for each (`kernels/cpu/team.rs`).
        Ok(team::with_team(|lead| {
            self.forward_new_tokens(new_ids, cache, rows, lead)
        }))
    }

    /// [`Self::next_token_logits`] on checked ids; before each product's input is made, the
    /// team's idle threads start reading that product's weights ahead.
    fn forward_new_tokens<'w>(
        &'w self,
        new_ids: &[u32],
        cache: &mut QuantizedKvCache,
        rows: Rows,
        lead: &Lead<'_, 'w>,
    ) -> Vec<f32> {
        let c = &self.config;
        let (t, d) = (new_ids.len(), c.hidden_size);
        let past = cache.len;
        let positions: Vec<u32> = (past as u32..(past + t) as u32).collect();
        let (cos, sin) = tables(&self.inv_freq, &positions); // [T, Dh] each
        cache.layers.resize_with(self.layers.len(), || {
            HostKv::new(c.num_key_value_heads, c.head_dim)
        });

        let mut x = vec![0.0f32; t * d]; // [T, D]
        for (row, &id) in x.chunks_exact_mut(d).zip(new_ids) {
            self.embed.dequantize_row(id as usize, row);
            if let Some((a, b, scale)) = &self.embed_lora {
                let (v, r) = (c.vocab_size, a.len() / c.vocab_size);
                let id = id as usize;
                for (j, value) in row.iter_mut().enumerate() {
                    let low: f32 = (0..r).map(|k| b[j * r + k] * a[k * v + id]).sum();
                    *value += scale * low;
                }
            }
        }
        for (layer, layer_cache) in self.layers.iter().zip(cache.layers.iter_mut()) {
            self.block(layer, &mut x, &cos, &sin, layer_cache, past, lead);
        }
        cache.len = past + t;
        let head = self.head.as_ref().unwrap_or(&self.embed);
        lead.warm(head.stored_bytes());
        let mut normed = match rows {
            Rows::Last => x[(t - 1) * d..].to_vec(), // [1, D]
            Rows::Every => x,                        // [T, D]
        };
        for row in normed.chunks_exact_mut(d) {
            rms_norm(row, &self.norm, c.rms_norm_eps as f32);
        }
        let mut logits = vec![0.0; normed.len() / d * c.vocab_size];
        let input = self.quantized(&normed, d);
        head.matmul(&input, &mut logits);
        if let Some(lora) = &self.head_lora {
            let mut low = vec![0.0; normed.len() / d * lora.a.rows()]; // [rows, r]
            lora.a.matmul(&input, &mut low);
            lora.add_from_low_rank(&low, &mut logits);
        }
        logits
    }

    /// One decoder block over the T new tokens, in place on `x` (`[T, D]`).
    #[allow(clippy::too_many_arguments)]
    fn block<'w>(
        &self,
        layer: &'w QuantizedBlock,
        x: &mut [f32],
        cos: &[f32],
        sin: &[f32],
        cache: &mut HostKv,
        past: usize,
        lead: &Lead<'_, 'w>,
    ) {
        let c = &self.config;
        let (d, dh, eps) = (c.hidden_size, c.head_dim, c.rms_norm_eps as f32);
        let q_rows = c.num_attention_heads * dh;

        // x + attn(norm₁(x))
        lead.warm(layer.qkv[0].stored_bytes());
        let h = self.quantized(&normed(x, &layer.attn_norm, d, eps), d);
        let mut qkv = layer.project(&layer.qkv, 0, &h);
        if let Some(biases) = &layer.qkv_bias {
            for (y, bias) in qkv.iter_mut().zip(biases) {
                y.chunks_exact_mut(bias.len())
                    .for_each(|row| row.iter_mut().zip(bias).for_each(|(y, b)| *y += b));
            }
        }
        let v = qkv.pop().unwrap_or_default(); // [T, Hkv·Dh]
        let mut k = qkv.pop().unwrap_or_default(); // [T, Hkv·Dh]
        let mut q = qkv.pop().unwrap_or_default(); // [T, H·Dh]
        lead.warm(layer.o.stored_bytes());
        if let Some([q_norm, k_norm]) = &layer.qk_norm {
            // Qwen3: each head's Dh values normed on their own, before RoPE.
            q = normed(&q, q_norm, dh, eps);
            k = normed(&k, k_norm, dh, eps);
        }
        rotate(&mut q, cos, sin, dh);
        rotate(&mut k, cos, sin, dh);
        cache.append(&k, &v);
        let attended = CachedAttention {
            heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: dh,
            past,
            window: c.sliding_window,
        }
        .run(&q, cache); // [T, H·Dh]
        lead.warm(layer.o.stored_bytes()); // the attention's pass ended the first request
        let attended = self.quantized(&attended, q_rows);
        let o = layer.project(std::slice::from_ref(&layer.o), 3, &attended); // [T, D]
        x.iter_mut().zip(&o[0]).for_each(|(a, b)| *a += b);

        // x + mlp(norm₂(x)), mlp(h) = down(silu(gate(h)) ⊙ up(h))
        let f = c.intermediate_size;
        lead.warm(layer.gate_up[0].stored_bytes());
        let h = self.quantized(&normed(x, &layer.ffn_norm, d, eps), d);
        let mut gate_up = layer.project(&layer.gate_up, 4, &h); // [T, F] each
        let up = gate_up.pop().unwrap_or_default();
        let mut act = gate_up.pop().unwrap_or_default(); // [T, F]
        lead.warm(layer.down.stored_bytes());
        act.iter_mut()
            .zip(&up)
            .for_each(|(g, u)| *g = *g / (1.0 + (-*g).exp()) * u);
        let act = self.quantized(&act, f);
        let down = layer.project(std::slice::from_ref(&layer.down), 6, &act); // [T, D]
        x.iter_mut().zip(&down[0]).for_each(|(a, b)| *a += b);
    }
}

/// Checks a block's vectors of a family switch (Qwen2's biases, Qwen3's head norms): given
/// exactly when the config has them (`wanted`), each as long as its `(name, length)` says.
fn check_family_vectors(
    source: &str,
    block: &str,
    what: &str,
    given: Option<&[Vec<f32>]>,
    wanted: Option<&[(String, usize)]>,
) -> Result<()> {
    match (given, wanted) {
        (Some(values), Some(parts)) => {
            for (values, (part, len)) in values.iter().zip(parts) {
                if values.len() != *len {
                    return Err(Error::Input(format!(
                        "{source}: `{part}` has {} values, not {len}",
                        values.len()
                    )));
                }
            }
            Ok(())
        }
        (None, None) => Ok(()),
        _ => Err(Error::Input(format!(
            "{source}: `{block}` {what} are {}, the config says {}",
            if given.is_some() { "given" } else { "missing" },
            if wanted.is_some() {
                "they exist"
            } else {
                "there are none"
            }
        ))),
    }
}

/// HF's RMSNorm of one row in place: `x / sqrt(mean(x²) + eps) · w`.
fn rms_norm(x: &mut [f32], weight: &[f32], eps: f32) {
    let mean_square = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let scale = 1.0 / (mean_square + eps).sqrt();
    x.iter_mut()
        .zip(weight)
        .for_each(|(v, w)| *v = *v * scale * w);
}

/// Every row of `x` (`[T, D]`) normed into a new buffer.
fn normed(x: &[f32], weight: &[f32], d: usize, eps: f32) -> Vec<f32> {
    let mut h = x.to_vec();
    h.chunks_exact_mut(d)
        .for_each(|row| rms_norm(row, weight, eps));
    h
}

/// Rotate-half RoPE in place on `[T, heads·Dh]` with `[T, Dh]` tables.
fn rotate(x: &mut [f32], cos: &[f32], sin: &[f32], dh: usize) {
    let half = dh / 2;
    let t = cos.len() / dh;
    let width = x.len() / t.max(1);
    for (token, row) in x.chunks_exact_mut(width).enumerate() {
        let (cos, sin) = (
            &cos[token * dh..(token + 1) * dh],
            &sin[token * dh..(token + 1) * dh],
        );
        for head in row.chunks_exact_mut(dh) {
            for i in 0..half {
                let (a, b) = (head[i], head[i + half]);
                head[i] = a * cos[i] - b * sin[i];
                head[i + half] = b * cos[i + half] + a * sin[i + half];
            }
        }
    }
}
