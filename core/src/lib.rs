//! napkin-core: a small Llama in burn with the memory tricks of GPU-poor fine-tuning, and the
//! napkin math that predicts what each trick costs.
//!
//! The modules are floors: each uses only those below it. From the ground up: `error`, `config`,
//! `rng`, `quant` (the quantization codecs), `predict` (the napkin math, no tensors), `device`,
//! `memory` (measuring it), `kernels` (the performance code), `model` (the Llama as the math
//! reads), `io`, `tokenizer`, `chat`, `data`, `export`, `train`, `measure` (the predictor
//! against real steps), `report`, `exercises`. ARCHITECTURE.md draws them; a test holds the order.

// The fused kernels hand their input tensors back when they do not run on the tensors' backend
// (a burn tensor is 256 bytes by value); boxing them would cost an allocation per op.
#![allow(clippy::result_large_err)]

pub mod chat;
pub mod config;
pub mod data;
pub mod device;
pub mod distributed;
pub mod error;
pub mod exercises;
pub mod export;
pub mod io;
pub mod kernels;
pub mod measure;
pub mod memory;
pub mod model;
pub mod predict;
pub mod quant;
pub mod report;
pub mod rng;
pub mod tokenizer;
pub mod train;

pub use error::{Error, Result};
