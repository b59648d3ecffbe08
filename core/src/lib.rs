//! napkin-core: a small Llama in burn with the memory tricks of GPU-poor fine-tuning, and the
//! napkin math that predicts what each trick costs.
//!
//! Floors, from the ground up (each uses only those below it):
//! - [`config`]: hyper-parameters as plain data (no tensors).
//! - [`model`]: the Llama itself.
//! - [`io`]: checkpoint formats.
//! - [`device`]: choosing a burn device at run time.

// The fused kernels hand their input tensors back when they do not run on the tensors' backend
// (a burn tensor is 256 bytes by value); boxing them would cost an allocation per op.
#![allow(clippy::result_large_err)]

pub mod chat;
pub mod config;
pub mod data;
pub mod device;
pub mod error;
pub mod exercises;
pub mod export;
pub mod io;
pub mod kernels;
pub mod memory;
pub mod model;
pub mod predict;
pub mod report;
pub mod tokenizer;
pub mod train;
pub mod tricks;
pub mod values;

pub use error::{Error, Result};
