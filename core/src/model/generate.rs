//! Text generation with a key/value cache: greedy, temperature, top-k and top-p sampling with a
//! seed, stopping at an end-of-sequence token. Tokens are handed to a callback as they come.

use burn::tensor::{Tensor, TensorData};

use super::attention::LayerKvCache;
use super::batch::TokenBatch;
use super::llama::Llama;
use super::rope::{RopeTables, inverse_frequencies};
use crate::config::MASKED;
use crate::device::link::{self, Traffic};
use crate::error::{Error, Result};
use crate::kernels::values::to_f32_vec;
use crate::rng::SplitMix64;

/// How the next token is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// 0 means greedy (always the most likely token).
    pub temperature: f32,
    /// Keep only the k most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches p (1.0: all).
    pub top_p: f32,
    /// Seed of the sampler.
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

/// The keys and values of every layer.
#[derive(Debug, Clone, Default)]
pub struct KvCache {
    /// One cache per decoder block.
    pub layers: Vec<LayerKvCache>,
}

impl Llama {
    /// Logits of the last new token, running only the new tokens through the model.
    ///
    /// # Shapes
    /// - `new_ids`: T new tokens of one sequence → `[V]`
    pub fn next_token_logits(&self, new_ids: &[u32], cache: &mut KvCache) -> Result<Vec<f32>> {
        Ok(to_f32_vec(
            self.next_token_logits_on_device(new_ids, cache)?,
        ))
    }

    /// [`Llama::next_token_logits`] left on the model's device, for a caller that reads it
    /// back asynchronously (WebGPU in a browser cannot block on a read) or only needs its
    /// argmax there.
    ///
    /// # Shapes
    /// - `new_ids`: T new tokens of one sequence → `[V]`
    pub fn next_token_logits_on_device(
        &self,
        new_ids: &[u32],
        cache: &mut KvCache,
    ) -> Result<Tensor<1>> {
        let past = cache.layers.first().map_or(0, LayerKvCache::len);
        let t = new_ids.len();
        if t == 0 {
            return Err(Error::Input("no tokens to feed the model".into()));
        }
        let mut batch = TokenBatch::single(new_ids)?;
        batch.check_vocab(self.config.vocab_size)?;
        batch.positions = (past as u32..(past + t) as u32).collect();
        let device = self.device();
        let rope = RopeTables::new(
            &inverse_frequencies(&self.config),
            &batch.positions,
            1,
            t,
            &device,
        );
        // New query i (absolute position past + i) sees keys 0..=past + i, those of a sliding
        // window only.
        let s = past + t;
        let window = self.config.sliding_window.unwrap_or(usize::MAX);
        let mask: Vec<f32> = (0..t)
            .flat_map(|i| {
                (0..s).map(move |j| {
                    let hidden = j > past + i || past + i - j >= window;
                    if hidden { MASKED } else { 0.0 }
                })
            })
            .collect();
        let mask = link::upload(TensorData::new(mask, [1, 1, t, s]), &device, Traffic::Data);
        cache
            .layers
            .resize_with(self.layers.len(), LayerKvCache::default);
        let mut x = self.embed(&batch); // [1, T, D]
        for (layer, layer_cache) in self.layers.iter().zip(cache.layers.iter_mut()) {
            x = layer.forward_cached(x, &rope, &mask, Some(layer_cache));
        }
        let d = self.config.hidden_size;
        let last = x.narrow(1, t - 1, 1).reshape([1, 1, d]); // [1, 1, D]
        let v = self.config.vocab_size;
        Ok(self.head(last).reshape([v]))
    }
}

/// A model that gives the logits of the next token from new tokens and a cache: the float
/// [`Llama`] and the [`QuantizedLlama`](super::quantized_llama::QuantizedLlama) share one
/// generation loop through it.
pub trait NextToken {
    /// What the model keeps between calls (keys and values).
    type Cache: Default;

    /// Logits (`[V]`) of the last of `new_ids`, after everything in `cache`.
    fn next_token_logits(&self, new_ids: &[u32], cache: &mut Self::Cache) -> Result<Vec<f32>>;

    /// Generates up to `max_new_tokens` after `prompt`, calling `on_token` with each new id;
    /// stops early at any id in `stop_ids`. Returns the new ids (the stop id included).
    fn generate(
        &self,
        prompt: &[u32],
        max_new_tokens: usize,
        sampling: &Sampling,
        stop_ids: &[u32],
        mut on_token: impl FnMut(u32),
    ) -> Result<Vec<u32>> {
        let mut cache = Self::Cache::default();
        let mut rng = SplitMix64(sampling.seed);
        let mut out = Vec::new();
        let mut logits = self.next_token_logits(prompt, &mut cache)?;
        for _ in 0..max_new_tokens {
            let next = choose(&logits, sampling, &mut rng);
            on_token(next);
            out.push(next);
            if stop_ids.contains(&next) {
                break;
            }
            logits = self.next_token_logits(&[next], &mut cache)?;
        }
        Ok(out)
    }
}

impl NextToken for Llama {
    type Cache = KvCache;

    fn next_token_logits(&self, new_ids: &[u32], cache: &mut KvCache) -> Result<Vec<f32>> {
        Llama::next_token_logits(self, new_ids, cache)
    }
}

impl NextToken for super::quantized_llama::QuantizedLlama {
    type Cache = super::quantized_llama::QuantizedKvCache;

    fn next_token_logits(&self, new_ids: &[u32], cache: &mut Self::Cache) -> Result<Vec<f32>> {
        super::quantized_llama::QuantizedLlama::next_token_logits(self, new_ids, cache)
    }
}

/// Picks the next token from logits.
pub fn choose(logits: &[f32], sampling: &Sampling, rng: &mut SplitMix64) -> u32 {
    let argmax = || {
        (0..logits.len())
            .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
            .unwrap_or(0) as u32
    };
    if sampling.temperature <= 0.0 {
        return argmax();
    }
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    if sampling.top_k > 0 {
        order.truncate(sampling.top_k);
    }
    let top = logits[order[0]];
    let mut probs: Vec<f64> = order
        .iter()
        .map(|&i| (((logits[i] - top) / sampling.temperature) as f64).exp())
        .collect();
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= total);
    // Nucleus: the smallest prefix (by probability) whose mass reaches top_p.
    let mut mass = 0.0;
    let keep = probs
        .iter()
        .position(|&p| {
            mass += p;
            mass >= sampling.top_p as f64
        })
        .map_or(probs.len(), |i| i + 1);
    let kept: f64 = probs[..keep].iter().sum();
    let mut draw = rng.next_f64() * kept;
    for (i, &p) in probs[..keep].iter().enumerate() {
        draw -= p;
        if draw <= 0.0 {
            return order[i] as u32;
        }
    }
    order[keep - 1] as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_argmax_and_top_k_1_is_greedy() {
        let logits = [0.1, 3.0, -1.0, 2.9];
        let mut rng = SplitMix64(1);
        assert_eq!(choose(&logits, &Sampling::default(), &mut rng), 1);
        let hot = Sampling {
            temperature: 5.0,
            top_k: 1,
            ..Default::default()
        };
        assert!((0..20).all(|_| choose(&logits, &hot, &mut rng) == 1));
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        let logits = [10.0, 9.0, -10.0, -10.0];
        let s = Sampling {
            temperature: 1.0,
            top_p: 0.9,
            ..Default::default()
        };
        let mut rng = SplitMix64(7);
        assert!((0..200).all(|_| choose(&logits, &s, &mut rng) < 2));
    }
}
