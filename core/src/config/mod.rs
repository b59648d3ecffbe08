//! Configuration as plain data: the model's hyper-parameters and its presets.
//!
//! Nothing here depends on a tensor backend, so the predictor and the browser app can use it.

mod llama;
mod presets;

pub use llama::{LlamaConfig, RopeScaling};
