//! The table `accelerate estimate-memory` prints, from a configuration alone.
//!
//! accelerate builds the model on the meta device and sums every parameter and buffer at
//! 4 bytes a value (buffers at their own width) for "Total Size"; "Largest Layer" is the
//! largest leaf module (or unsplittable block); each dtype divides both by its width ratio
//! (float16 ÷2, int8 ÷4, int4 ÷8); "Training using Adam" is 4 × the dtype's total (weights,
//! gradients and Adam's two moments). Units are 1024-based, rounded to two decimals.

use serde::Serialize;

use super::units::accelerate_units;

/// A model's size as accelerate measures it, in float32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ModelSizes {
    /// Every parameter at 4 bytes plus the buffers.
    pub total_bytes: u64,
    /// The largest layer at 4 bytes a parameter.
    pub largest_layer_bytes: u64,
}

/// One printed row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AccelerateRow {
    /// float32, float16, int8 or int4.
    pub dtype: &'static str,
    /// "Largest Layer".
    pub largest_layer: String,
    /// "Total Size".
    pub total_size: String,
    /// "Training using Adam".
    pub training_using_adam: String,
}

/// The four rows accelerate prints by default.
pub fn accelerate_rows(sizes: ModelSizes) -> Vec<AccelerateRow> {
    [
        ("float32", 1.0),
        ("float16", 2.0),
        ("int8", 4.0),
        ("int4", 8.0),
    ]
    .into_iter()
    .map(|(dtype, ratio)| {
        let total = sizes.total_bytes as f64 / ratio;
        AccelerateRow {
            dtype,
            largest_layer: accelerate_units(sizes.largest_layer_bytes as f64 / ratio),
            total_size: accelerate_units(total),
            training_using_adam: accelerate_units(4.0 * total),
        }
    })
    .collect()
}

/// accelerate's sizes for a BERT config (`BertModel`, as `AutoModel` builds it).
pub fn bert_sizes(bert: &super::bert::BertConfig) -> ModelSizes {
    ModelSizes {
        total_bytes: 4 * bert.num_parameters() + bert.buffer_bytes(),
        largest_layer_bytes: 4 * bert.largest_layer_parameters(),
    }
}

/// accelerate's sizes for a Llama config (`LlamaModel`, as `AutoModel` builds it: no LM
/// head; one rotary `inv_freq` buffer of Dh/2 floats; a decoder layer is not split).
pub fn llama_sizes(config: &crate::config::LlamaConfig) -> ModelSizes {
    let embed = config.embedding_parameters();
    let params = embed
        + config.block_parameters() * config.num_hidden_layers as u64
        + config.hidden_size as u64;
    ModelSizes {
        total_bytes: 4 * params + 4 * (config.head_dim as u64 / 2),
        largest_layer_bytes: 4 * embed.max(config.block_parameters()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::predict::bert::BertConfig;

    /// accelerate's documentation, `accelerate estimate-memory bert-base-cased`.
    #[test]
    fn bert_base_cased_reproduces_the_documented_table() {
        let bert = BertConfig {
            vocab_size: 28996,
            hidden_size: 768,
            num_hidden_layers: 12,
            intermediate_size: 3072,
            max_position_embeddings: 512,
            type_vocab_size: 2,
        };
        let rows = accelerate_rows(bert_sizes(&bert));
        let table: Vec<[&str; 4]> = rows
            .iter()
            .map(|r| {
                [
                    r.dtype,
                    r.largest_layer.as_str(),
                    r.total_size.as_str(),
                    r.training_using_adam.as_str(),
                ]
            })
            .collect();
        assert_eq!(
            table,
            [
                ["float32", "84.95 MB", "413.18 MB", "1.61 GB"],
                ["float16", "42.47 MB", "206.59 MB", "826.36 MB"],
                ["int8", "21.24 MB", "103.29 MB", "413.18 MB"],
                ["int4", "10.62 MB", "51.65 MB", "206.59 MB"],
            ]
        );
    }
}
