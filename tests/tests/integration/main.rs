//! napkin's cross-crate tests, one binary. Where new tests go:
//! - `llama_parity`: the model against HF transformers (logits, loss, intermediates, gradients).
//! - `llama3_rope`: Llama 3's RoPE schedule from HF folders and llama.cpp's GGUF, and back.
//! - `caching_allocator`: the replay of PyTorch's CUDA caching allocator against its recorded
//!   traces (reserved bytes, `cudaMalloc`s).
//! - `chat_templates`: real chat templates rendered as transformers renders them.
//! - `checkpoints`: loading HF folders, typed errors on bad files.
//! - `floors`: napkin-core's modules use only the floors below them (ARCHITECTURE.md's order),
//!   and `kernels/cpu/` and `kernels/gpu/` do not use each other.
//! - `data`: packing, padding, reply-only labels, JSONL errors, the seeded loader.
//! - `dora`: DoRA against peft (float and NF4 bases; merge, format, the quantized engine).
//! - `docs`: README's length and first screen, the book's table of contents, every link.
//! - `families`: Qwen2 and Qwen3 (and any family in `tests/corpus`'s layout) against
//!   transformers, llama.cpp's converter and bitsandbytes + peft.
//! - `gguf_export`: models written as GGUF and read back (every weight type).
//! - `gguf_files`: GGUF from synthetic files: names, Q/K permutation, malformed input.
//! - `gguf_tokenizers`: tokenizers built from GGUF metadata against llama.cpp's tokenizer tests.
//! - `head_lora`: LoRA on the embedding and the LM head against peft.
//! - `hostile_input`: thousands of mutated model, config, tokenizer, adapter, data files and
//!   answers: typed errors, never a panic.
//! - `lora_parity`: LoRA and QLoRA against peft; merge, unmerge, the peft format.
//! - `merged_folder`: merged models written tensor by tensor: dtypes, shards, the index.
//! - `mixed_precision`: bf16 / f16 autocast on Flex against f32; loss scaling.
//! - `nf4_parity`: NF4 and double quantization against bitsandbytes, bit for bit.
//! - `optimizers`: SGD, 8-bit AdamW, clipping, optimizer state export/import.
//! - `preference`: DPO and ORPO against TRL (tokenization, losses, metrics, LoRA gradients).
//! - `quantized_adapters`: the quantized generation engine with adapters on any projections.
//! - `quantized_checkpoint`: napkin NF4 checkpoints written and read back.
//! - `smollm2`: the real SmolLM2-135M-Instruct GGUF (fetched by scripts/fetch/smollm2.sh).
//! - `smollm2_reference`: SmolLM2's logits against an independent f64 Llama in plain Rust.
//! - `tinyllama_layout`: TinyLlama's HF folder layout on a small random checkpoint.
//! - `tokenizers`: HF tokenizer.json and GGUF-built tokenizers.
//! - `training_step`: gradient accumulation and checkpointing against the fixtures.

mod caching_allocator;
mod chat_templates;
mod checkpoints;
mod data;
mod docs;
mod dora;
mod families;
mod floors;
mod gguf_export;
mod gguf_files;
mod gguf_tokenizers;
mod gguf_type_mix;
mod head_lora;
mod hostile_input;
mod llama3_rope;
mod llama_parity;
mod lora_parity;
mod malformed_corpus;
mod merged_folder;
mod mixed_precision;
mod nf4_parity;
mod optimizers;
mod preference;
mod pytorch_profile;
mod pytorch_profile_dpo;
mod quantized_adapters;
mod quantized_checkpoint;
mod seed_figures;
mod sliding_window;
mod smollm2;
mod smollm2_reference;
mod tinyllama_layout;
mod tokenizers;
mod training_step;
