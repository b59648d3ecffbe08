//! Configuration as plain data: the model's hyper-parameters, its presets and the tricks.
//!
//! Nothing here depends on a tensor backend, so the predictor and the browser app can use it.

mod attention;
mod fused;
mod hf_json;
mod kernels;
mod llama;
mod lora;
mod loss_chunks;
mod nf4;
mod objective;
mod optimizer;
mod presets;
mod spelling;

pub use attention::{ATTENTION_TILE, AttentionKind, MASKED};
pub use fused::{FUSED_PROJECTIONS, StoredRows};
pub use kernels::Kernels;
pub use llama::{LlamaConfig, RopeScaling};
pub use lora::{LoraConfig, LoraTarget, TargetNames};
pub use loss_chunks::{CHUNK_LOGITS_BYTES, default_chunk_rows};
pub use nf4::{DOUBLE_QUANT_BLOCK, Nf4Config};
pub use objective::ObjectiveKind;
pub use optimizer::OptimizerKind;
pub(crate) use spelling::spellings;
