//! `LlamaConfig`: the hyper-parameters of a Llama (read from and written as a Hugging Face
//! `config.json` in `hf_json.rs`).
//!
//! Pure data and arithmetic (no burn types), so the predictor, the exercises and the browser
//! app can use it without a tensor backend. Shape letters are those of ARCHITECTURE.md.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// How RoPE frequencies are scaled for long context.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rope_type", rename_all = "snake_case")]
pub enum RopeScaling {
    /// Plain RoPE: `inv_freq[j] = theta^(-2j/d)`.
    Default,
    /// Llama 3.x: low frequencies divided by `factor`, high ones kept, a smooth ramp between.
    Llama3 {
        /// Divisor of the low frequencies (8 for Llama 3.1, 32 for Llama 3.2).
        factor: f64,
        /// Wavelengths longer than `original_max_position_embeddings / low_freq_factor` are scaled.
        low_freq_factor: f64,
        /// Wavelengths shorter than `original_max_position_embeddings / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// The context length the model was pre-trained with.
        original_max_position_embeddings: f64,
    },
}

/// The hyper-parameters of a `LlamaForCausalLM`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlamaConfig {
    /// V: number of token ids.
    pub vocab_size: usize,
    /// D: width of the residual stream.
    pub hidden_size: usize,
    /// F: width of the SwiGLU MLP.
    pub intermediate_size: usize,
    /// L: number of decoder blocks.
    pub num_hidden_layers: usize,
    /// H: number of query heads.
    pub num_attention_heads: usize,
    /// Hkv: number of key/value heads (H for multi-head attention, fewer for grouped-query).
    pub num_key_value_heads: usize,
    /// Dh: width of one head (usually D / H).
    pub head_dim: usize,
    /// Epsilon inside RMSNorm's square root.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// RoPE frequency scaling.
    pub rope_scaling: RopeScaling,
    /// Longest sequence the positional tables are meant for.
    pub max_position_embeddings: usize,
    /// Whether the LM head reuses the token embedding matrix.
    pub tie_word_embeddings: bool,
    /// Beginning-of-sequence token id, if the checkpoint names one.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence token id(s), if the checkpoint names them.
    pub eos_token_ids: Vec<u32>,
    /// Mistral's `sliding_window`: each token attends to this many positions at most (itself
    /// included), in the eager attention's mask, the efficient attention's tiles (those wholly
    /// past the window skipped) and generation (the cache keeps every key, the old ones masked).
    #[serde(default)]
    pub sliding_window: Option<usize>,
    /// Qwen2's bias on the query, key and value projections (`[H·Dh]`, `[Hkv·Dh]`, `[Hkv·Dh]`),
    /// added after `x·Wᵀ` and after LoRA's term. It stays f32 under NF4 and is frozen under
    /// LoRA, as peft's `bias="none"` and bitsandbytes' `Linear4bit` keep it.
    #[serde(default)]
    pub qkv_bias: bool,
    /// Qwen3's RMSNorm on each query and key head: a `[Dh]` gain each (`q_norm`, `k_norm`),
    /// applied to every head of the projection's output before RoPE, with the model's ε.
    #[serde(default)]
    pub qk_norm: bool,
    /// Phi-3's checkpoint layout: q, k and v stored as one `qkv_proj` and gate and up as one
    /// `gate_up_proj` (`config/fused.rs`). The model keeps the seven linears apart.
    #[serde(default)]
    pub fused_projections: bool,
}

impl LlamaConfig {
    /// The Hugging Face class and `model_type` these switches make: a model with q/k norms is
    /// a Qwen3, a biased one a Qwen2 (both windowed on every layer or none), a windowed one a
    /// Mistral (transformers' Llama has no window), else a Llama; fused projections make a
    /// Phi-3. No family has two of the norms, the biases and the fused projections
    /// ([`LlamaConfig::validate`] refuses them together).
    pub fn hf_family(&self) -> (&'static str, &'static str) {
        if self.fused_projections {
            return ("Phi3ForCausalLM", "phi3");
        }
        match (self.qk_norm, self.qkv_bias, self.sliding_window) {
            (true, _, _) => ("Qwen3ForCausalLM", "qwen3"),
            (false, true, _) => ("Qwen2ForCausalLM", "qwen2"),
            (false, false, Some(_)) => ("MistralForCausalLM", "mistral"),
            (false, false, None) => ("LlamaForCausalLM", "llama"),
        }
    }

    /// Checks that the numbers describe a model that can be built.
    pub fn validate(&self, source_name: &str) -> Result<()> {
        let err = |message: String| Err(Error::config(source_name, message));
        for (name, value) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
        ] {
            if value == 0 {
                return err(format!("`{name}` must be at least 1, found 0"));
            }
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return err(format!(
                "num_attention_heads {} must be a multiple of num_key_value_heads {} (grouped-query attention)",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if [self.qk_norm, self.qkv_bias, self.fused_projections]
            .iter()
            .filter(|&&on| on)
            .count()
            > 1
        {
            return err(
                "two of q/k norms (Qwen3), q, k, v biases (Qwen2) and fused projections (Phi-3): \
                 no model family napkin implements has more than one"
                    .into(),
            );
        }
        if !self.head_dim.is_multiple_of(2) {
            return err(format!("head_dim {} must be even for RoPE", self.head_dim));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 1.0) {
            return err(format!(
                "rope_theta {} must be a finite number above 1",
                self.rope_theta
            ));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return err(format!(
                "rms_norm_eps {} must be a small positive number",
                self.rms_norm_eps
            ));
        }
        // Bound sizes so that a hostile file cannot make us allocate absurd tensors.
        const LIMIT: usize = 1 << 20;
        for (name, value) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_attention_heads", self.num_attention_heads),
            ("head_dim", self.head_dim),
        ] {
            if value > LIMIT {
                return err(format!(
                    "`{name}` = {value} is larger than napkin supports ({LIMIT})"
                ));
            }
        }
        if self.num_hidden_layers > 4096 {
            return err(format!(
                "num_hidden_layers {} is larger than napkin supports (4096)",
                self.num_hidden_layers
            ));
        }
        Ok(())
    }

    // ---- sizes -----------------------------------------------------------------------------

    /// H·Dh: width of the concatenated query heads.
    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    /// Hkv·Dh: width of the concatenated key (or value) heads.
    pub fn kv_dim(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }

    /// The seven linear layers of one decoder block: (HF module path, out features, in features).
    pub fn block_linears(&self) -> [(&'static str, usize, usize); 7] {
        let (d, f) = (self.hidden_size, self.intermediate_size);
        [
            ("self_attn.q_proj", self.q_dim(), d),
            ("self_attn.k_proj", self.kv_dim(), d),
            ("self_attn.v_proj", self.kv_dim(), d),
            ("self_attn.o_proj", d, self.q_dim()),
            ("mlp.gate_proj", f, d),
            ("mlp.up_proj", f, d),
            ("mlp.down_proj", d, f),
        ]
    }

    /// Whether the block linear at this HF module path (`self_attn.q_proj`, ...) has a bias.
    pub fn linear_has_bias(&self, module: &str) -> bool {
        self.qkv_bias
            && matches!(
                module,
                "self_attn.q_proj" | "self_attn.k_proj" | "self_attn.v_proj"
            )
    }

    /// Bias values of one decoder block (q, k and v's for Qwen2; 0 for Llama).
    pub fn block_bias_parameters(&self) -> u64 {
        self.block_linears()
            .iter()
            .filter(|(name, _, _)| self.linear_has_bias(name))
            .map(|&(_, out, _)| out as u64)
            .sum()
    }

    /// Gains of one decoder block's q/k norms (Qwen3's two `[Dh]`; 0 for Llama).
    pub fn block_head_norm_parameters(&self) -> u64 {
        match self.qk_norm {
            true => 2 * self.head_dim as u64,
            false => 0,
        }
    }

    /// Parameters of one decoder block: the seven linears (with their biases, if any), two
    /// RMSNorm weights and the q/k norms' gains, if any.
    pub fn block_parameters(&self) -> u64 {
        let linears: u64 = self
            .block_linears()
            .iter()
            .map(|&(_, out, inp)| (out * inp) as u64)
            .sum();
        linears
            + self.block_bias_parameters()
            + 2 * self.hidden_size as u64
            + self.block_head_norm_parameters()
    }

    /// Parameters of the token embedding (V·D).
    pub fn embedding_parameters(&self) -> u64 {
        (self.vocab_size * self.hidden_size) as u64
    }

    /// Parameters of the LM head that are not shared with the embedding (0 when tied).
    pub fn lm_head_parameters(&self) -> u64 {
        if self.tie_word_embeddings {
            0
        } else {
            self.embedding_parameters()
        }
    }

    /// Every parameter tensor of the HF checkpoint layout, in module order, with its shape.
    /// The LM head is listed only when untied.
    pub fn hf_parameter_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let (v, d) = (self.vocab_size, self.hidden_size);
        let mut out = vec![("model.embed_tokens.weight".to_string(), vec![v, d])];
        for i in 0..self.num_hidden_layers {
            let prefix = format!("model.layers.{i}");
            out.push((format!("{prefix}.input_layernorm.weight"), vec![d]));
            for (name, rows, cols) in self.block_linears() {
                out.push((format!("{prefix}.{name}.weight"), vec![rows, cols]));
                if self.linear_has_bias(name) {
                    out.push((format!("{prefix}.{name}.bias"), vec![rows]));
                }
                // Qwen3Attention declares its norms after o_proj.
                if name == "self_attn.o_proj" && self.qk_norm {
                    for norm in ["q_norm", "k_norm"] {
                        out.push((
                            format!("{prefix}.self_attn.{norm}.weight"),
                            vec![self.head_dim],
                        ));
                    }
                }
            }
            out.push((format!("{prefix}.post_attention_layernorm.weight"), vec![d]));
        }
        out.push(("model.norm.weight".to_string(), vec![d]));
        if !self.tie_word_embeddings {
            out.push(("lm_head.weight".to_string(), vec![v, d]));
        }
        out
    }

    /// Total number of distinct parameters, as `sum(p.numel() for p in model.parameters())`.
    pub fn num_parameters(&self) -> u64 {
        self.embedding_parameters()
            + self.num_hidden_layers as u64 * self.block_parameters()
            + self.hidden_size as u64 // final norm
            + self.lm_head_parameters()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every HF tensor's shape counted once gives the parameter count, tied (the GQA test
    /// config) and untied (TinyLlama's layout).
    #[test]
    fn hf_parameter_shapes_sum_to_the_parameter_count() {
        for base in [LlamaConfig::tiny_gqa(), LlamaConfig::tiny_llama_1_1b()] {
            for (tied, qkv_bias, qk_norm) in [
                (true, false, false),
                (false, false, false),
                (true, true, false),
                (false, false, true),
            ] {
                let config = LlamaConfig {
                    tie_word_embeddings: tied,
                    qkv_bias,
                    qk_norm,
                    ..base.clone()
                };
                let total: u64 = config
                    .hf_parameter_shapes()
                    .iter()
                    .map(|(_, s)| s.iter().product::<usize>() as u64)
                    .sum();
                assert_eq!(total, config.num_parameters());
            }
        }
    }
}
