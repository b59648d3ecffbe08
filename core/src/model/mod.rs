//! The Llama model, one concept a file, in the order data flows through it.

pub mod apply_tricks;
pub mod attention;
pub mod autocast;
pub mod batch;
pub mod block;
pub mod chunked_loss;
pub mod dropout_draw;
pub mod embedding_lora;
pub mod generate;
pub mod kv_cache;
pub mod linear;
pub mod llama;
pub mod lora;
pub mod loss;
pub mod matmul_wt;
pub mod mlp;
pub mod named;
pub mod nf4_matmul;
pub mod nf4_weight;
pub mod quantized_from_llama;
pub mod quantized_llama;
pub mod rms_norm;
pub mod rope;

pub use batch::TokenBatch;
pub use llama::{ForwardContext, Llama};
pub use loss::{IGNORE_INDEX, LossSum, causal_lm_loss, label_log_probs, weighted_lm_loss};
