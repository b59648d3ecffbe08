//! Named model presets: the fixture sizes and the public checkpoints learners meet.
//!
//! Hyper-parameters are copied from each model's published `config.json`; the tests check the
//! exact parameter counts the model cards state.

use super::llama::{LlamaConfig, RopeScaling};
use crate::error::{Error, Result};

impl LlamaConfig {
    /// HuggingFaceTB/SmolLM2-135M(-Instruct): 134,515,008 parameters, tied embeddings.
    pub fn smollm2_135m() -> Self {
        LlamaConfig {
            vocab_size: 49_152,
            hidden_size: 576,
            intermediate_size: 1536,
            num_hidden_layers: 30,
            num_attention_heads: 9,
            num_key_value_heads: 3,
            head_dim: 64,
            rms_norm_eps: 1e-5,
            rope_theta: 100_000.0,
            rope_scaling: RopeScaling::Default,
            max_position_embeddings: 8192,
            tie_word_embeddings: true,
            bos_token_id: Some(1),
            eos_token_ids: vec![2],
            sliding_window: None,
            qkv_bias: false,
            qk_norm: false,
            fused_projections: false,
        }
    }

    /// TinyLlama/TinyLlama-1.1B-Chat-v1.0: 1,100,048,384 parameters.
    pub fn tiny_llama_1_1b() -> Self {
        LlamaConfig {
            vocab_size: 32_000,
            hidden_size: 2048,
            intermediate_size: 5632,
            num_hidden_layers: 22,
            num_attention_heads: 32,
            num_key_value_heads: 4,
            head_dim: 64,
            rms_norm_eps: 1e-5,
            rope_theta: 10_000.0,
            rope_scaling: RopeScaling::Default,
            max_position_embeddings: 2048,
            tie_word_embeddings: false,
            bos_token_id: Some(1),
            eos_token_ids: vec![2],
            sliding_window: None,
            qkv_bias: false,
            qk_norm: false,
            fused_projections: false,
        }
    }

    /// meta-llama/Llama-2-7b-hf: 6,738,415,616 parameters.
    pub fn llama2_7b() -> Self {
        LlamaConfig {
            vocab_size: 32_000,
            hidden_size: 4096,
            intermediate_size: 11_008,
            num_hidden_layers: 32,
            num_attention_heads: 32,
            num_key_value_heads: 32,
            head_dim: 128,
            rms_norm_eps: 1e-5,
            rope_theta: 10_000.0,
            rope_scaling: RopeScaling::Default,
            max_position_embeddings: 4096,
            tie_word_embeddings: false,
            bos_token_id: Some(1),
            eos_token_ids: vec![2],
            sliding_window: None,
            qkv_bias: false,
            qk_norm: false,
            fused_projections: false,
        }
    }

    /// meta-llama/Meta-Llama-3-8B: 8,030,261,248 parameters.
    pub fn llama3_8b() -> Self {
        LlamaConfig {
            vocab_size: 128_256,
            hidden_size: 4096,
            intermediate_size: 14_336,
            num_hidden_layers: 32,
            num_attention_heads: 32,
            num_key_value_heads: 8,
            head_dim: 128,
            rms_norm_eps: 1e-5,
            rope_theta: 500_000.0,
            rope_scaling: RopeScaling::Default,
            max_position_embeddings: 8192,
            tie_word_embeddings: false,
            bos_token_id: Some(128_000),
            eos_token_ids: vec![128_001],
            sliding_window: None,
            qkv_bias: false,
            qk_norm: false,
            fused_projections: false,
        }
    }

    /// meta-llama/Llama-3.2-1B: 1,235,814,400 parameters, tied, llama3 RoPE scaling.
    pub fn llama3_2_1b() -> Self {
        LlamaConfig {
            vocab_size: 128_256,
            hidden_size: 2048,
            intermediate_size: 8192,
            num_hidden_layers: 16,
            num_attention_heads: 32,
            num_key_value_heads: 8,
            head_dim: 64,
            rms_norm_eps: 1e-5,
            rope_theta: 500_000.0,
            rope_scaling: RopeScaling::Llama3 {
                factor: 32.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192.0,
            },
            max_position_embeddings: 131_072,
            tie_word_embeddings: true,
            bos_token_id: Some(128_000),
            eos_token_ids: vec![128_001, 128_008, 128_009],
            sliding_window: None,
            qkv_bias: false,
            qk_norm: false,
            fused_projections: false,
        }
    }

    /// Qwen/Qwen2.5-0.5B: 494,032,768 parameters (transformers' count of this config), tied,
    /// biases on q, k and v.
    pub fn qwen2_5_0_5b() -> Self {
        LlamaConfig {
            vocab_size: 151_936,
            hidden_size: 896,
            intermediate_size: 4864,
            num_hidden_layers: 24,
            num_attention_heads: 14,
            num_key_value_heads: 2,
            head_dim: 64,
            rms_norm_eps: 1e-6,
            rope_theta: 1_000_000.0,
            rope_scaling: RopeScaling::Default,
            max_position_embeddings: 32_768,
            tie_word_embeddings: true,
            bos_token_id: Some(151_643),
            eos_token_ids: vec![151_643],
            sliding_window: None,
            qkv_bias: true,
            qk_norm: false,
            fused_projections: false,
        }
    }

    /// Qwen/Qwen3-0.6B: 596,049,920 parameters (transformers' count of this config), tied, an
    /// RMSNorm on each query and key head, heads of 128 (wider than D / H).
    pub fn qwen3_0_6b() -> Self {
        LlamaConfig {
            vocab_size: 151_936,
            hidden_size: 1024,
            intermediate_size: 3072,
            num_hidden_layers: 28,
            num_attention_heads: 16,
            num_key_value_heads: 8,
            head_dim: 128,
            rms_norm_eps: 1e-6,
            rope_theta: 1_000_000.0,
            rope_scaling: RopeScaling::Default,
            max_position_embeddings: 40_960,
            tie_word_embeddings: true,
            bos_token_id: Some(151_643),
            eos_token_ids: vec![151_645],
            sliding_window: None,
            qkv_bias: false,
            qk_norm: true,
            fused_projections: false,
        }
    }

    /// A small Llama where weights dominate bookkeeping: 4 blocks, D=256, F=688, 8 heads / 4 KV
    /// heads, V=4096, untied (the memory tests' and the performance suite's small model).
    pub fn small() -> Self {
        LlamaConfig {
            vocab_size: 4096,
            hidden_size: 256,
            intermediate_size: 688,
            num_hidden_layers: 4,
            num_attention_heads: 8,
            num_key_value_heads: 4,
            head_dim: 32,
            rms_norm_eps: 1e-5,
            rope_theta: 10_000.0,
            rope_scaling: RopeScaling::Default,
            max_position_embeddings: 512,
            tie_word_embeddings: false,
            bos_token_id: None,
            eos_token_ids: vec![],
            sliding_window: None,
            qkv_bias: false,
            qk_norm: false,
            fused_projections: false,
        }
    }

    /// The fixture `tiny-mha`: 2 blocks, 4 heads / 4 kv heads, untied.
    pub fn tiny_mha() -> Self {
        Self::tiny(256, 64, 176, 2, 4, 4, 10_000.0, 1e-6, false, 256)
    }

    /// The fixture `tiny-gqa`: 3 blocks, 6 heads / 2 kv heads, tied.
    pub fn tiny_gqa() -> Self {
        Self::tiny(320, 96, 256, 3, 6, 2, 500_000.0, 1e-6, true, 256)
    }

    /// The fixture `tiny-smol`: SmolLM2's 3:1 grouped-query shape at toy size, tied.
    pub fn tiny_smol() -> Self {
        Self::tiny(512, 144, 384, 4, 9, 3, 100_000.0, 1e-5, true, 512)
    }

    #[allow(clippy::too_many_arguments)]
    fn tiny(
        vocab_size: usize,
        hidden_size: usize,
        intermediate_size: usize,
        num_hidden_layers: usize,
        num_attention_heads: usize,
        num_key_value_heads: usize,
        rope_theta: f64,
        rms_norm_eps: f64,
        tie_word_embeddings: bool,
        max_position_embeddings: usize,
    ) -> Self {
        LlamaConfig {
            vocab_size,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim: hidden_size / num_attention_heads,
            rms_norm_eps,
            rope_theta,
            rope_scaling: RopeScaling::Default,
            max_position_embeddings,
            tie_word_embeddings,
            bos_token_id: None,
            eos_token_ids: Vec::new(),
            sliding_window: None,
            qkv_bias: false,
            qk_norm: false,
            fused_projections: false,
        }
    }

    /// Every preset, by the name the CLI and the browser app use.
    pub fn presets() -> Vec<(&'static str, LlamaConfig)> {
        vec![
            ("tiny-mha", Self::tiny_mha()),
            ("tiny-gqa", Self::tiny_gqa()),
            ("tiny-smol", Self::tiny_smol()),
            ("smollm2-135m", Self::smollm2_135m()),
            ("tinyllama-1.1b", Self::tiny_llama_1_1b()),
            ("llama-3.2-1b", Self::llama3_2_1b()),
            ("qwen2.5-0.5b", Self::qwen2_5_0_5b()),
            ("qwen3-0.6b", Self::qwen3_0_6b()),
            ("llama-2-7b", Self::llama2_7b()),
            ("llama-3-8b", Self::llama3_8b()),
        ]
    }

    /// Looks a preset up by name (case-insensitive).
    pub fn preset(name: &str) -> Result<Self> {
        let wanted = name.to_ascii_lowercase();
        let presets = Self::presets();
        let known = presets
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(", ");
        presets
            .into_iter()
            .find(|(n, _)| *n == wanted)
            .map(|(_, c)| c)
            .ok_or(Error::UnknownPreset {
                name: name.to_string(),
                known,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Counts from the model cards / `sum(p.numel() for p in model.parameters())`.
    #[test]
    fn published_parameter_counts_are_exact() {
        assert_eq!(LlamaConfig::smollm2_135m().num_parameters(), 134_515_008);
        assert_eq!(
            LlamaConfig::tiny_llama_1_1b().num_parameters(),
            1_100_048_384
        );
        assert_eq!(LlamaConfig::llama2_7b().num_parameters(), 6_738_415_616);
        assert_eq!(LlamaConfig::llama3_8b().num_parameters(), 8_030_261_248);
        assert_eq!(LlamaConfig::llama3_2_1b().num_parameters(), 1_235_814_400);
        assert_eq!(LlamaConfig::qwen2_5_0_5b().num_parameters(), 494_032_768);
        assert_eq!(LlamaConfig::qwen3_0_6b().num_parameters(), 596_049_920);
    }

    #[test]
    fn every_preset_validates_and_is_found_by_name() {
        for (name, config) in LlamaConfig::presets() {
            config.validate(name).unwrap();
            assert_eq!(LlamaConfig::preset(&name.to_uppercase()).unwrap(), config);
        }
    }

    #[test]
    fn unknown_preset_lists_the_known_ones() {
        let msg = LlamaConfig::preset("gpt-5").unwrap_err().to_string();
        assert!(msg.contains("smollm2-135m"), "{msg}");
    }
}
