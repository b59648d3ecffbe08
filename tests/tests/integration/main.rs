//! napkin's cross-crate tests, one binary. Where new tests go:
//! - `llama_parity`: the model against HF transformers (logits, loss, intermediates, gradients).
//! - `checkpoints`: loading HF folders, typed errors on bad files.
//! - `lora_parity`: LoRA and QLoRA against peft; merge, unmerge, the peft format.
//! - `nf4_parity`: NF4 and double quantization against bitsandbytes, bit for bit.
//! - `quantized_checkpoint`: napkin NF4 checkpoints written and read back.
//! - `training_step`: gradient accumulation and checkpointing against the fixtures.

mod checkpoints;
mod llama_parity;
mod lora_parity;
mod nf4_parity;
mod quantized_checkpoint;
mod training_step;
