//! BERT's parameter count from its `config.json`, for reproducing `accelerate estimate-memory`'s
//! documented example (bert-base-cased) and any other BERT-family config.
//!
//! `BertModel` (what `AutoModel` builds): embeddings (word, position, token type, LayerNorm),
//! L layers (Q, K, V, O with biases; LayerNorm; intermediate and output dense with biases;
//! LayerNorm), and the pooler (dense with bias). Buffers: `position_ids` and `token_type_ids`,
//! each `[1, max_position]` int64.

use serde_json::Value;

use crate::error::{Error, Result};

/// The dimensions that decide a BERT's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BertConfig {
    /// Vocabulary.
    pub vocab_size: u64,
    /// Hidden width.
    pub hidden_size: u64,
    /// Layers.
    pub num_hidden_layers: u64,
    /// Feed-forward width.
    pub intermediate_size: u64,
    /// Positions.
    pub max_position_embeddings: u64,
    /// Token types.
    pub type_vocab_size: u64,
}

impl BertConfig {
    /// Reads the keys from a HF `config.json` value.
    pub fn from_hf_json(json: &Value, source: &str) -> Result<Self> {
        let key = |name: &str| -> Result<u64> {
            json.get(name)
                .and_then(Value::as_u64)
                .ok_or_else(|| Error::config(source, format!("missing or non-integer `{name}`")))
        };
        Ok(BertConfig {
            vocab_size: key("vocab_size")?,
            hidden_size: key("hidden_size")?,
            num_hidden_layers: key("num_hidden_layers")?,
            intermediate_size: key("intermediate_size")?,
            max_position_embeddings: key("max_position_embeddings")?,
            type_vocab_size: json
                .get("type_vocab_size")
                .and_then(Value::as_u64)
                .unwrap_or(2),
        })
    }

    /// Parameters of `BertModel` with its pooler.
    pub fn num_parameters(&self) -> u64 {
        let h = self.hidden_size;
        let layer_norm = 2 * h;
        let embeddings = (self.vocab_size + self.max_position_embeddings + self.type_vocab_size)
            * h
            + layer_norm;
        let attention = 4 * (h * h + h) + layer_norm;
        let feed_forward = (h * self.intermediate_size + self.intermediate_size)
            + (self.intermediate_size * h + h)
            + layer_norm;
        let pooler = h * h + h;
        embeddings + self.num_hidden_layers * (attention + feed_forward) + pooler
    }

    /// Bytes of the int64 buffers (`position_ids`, `token_type_ids`).
    pub fn buffer_bytes(&self) -> u64 {
        2 * 8 * self.max_position_embeddings
    }

    /// Parameters of the largest leaf module: the word embedding, unless a dense layer is
    /// larger.
    pub fn largest_layer_parameters(&self) -> u64 {
        let h = self.hidden_size;
        (self.vocab_size * h).max(h * self.intermediate_size + self.intermediate_size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bert_base_cased_has_its_published_parameter_count() {
        let json = serde_json::json!({
            "model_type": "bert", "vocab_size": 28996, "hidden_size": 768,
            "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
            "max_position_embeddings": 512, "type_vocab_size": 2
        });
        let bert = BertConfig::from_hf_json(&json, "bert-base-cased").unwrap();
        assert_eq!(bert.num_parameters(), 108_310_272);
    }
}
