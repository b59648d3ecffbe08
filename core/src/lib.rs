//! napkin-core: a small Llama in burn with the memory tricks of GPU-poor fine-tuning, and the
//! napkin math that predicts what each trick costs.
//!
//! Floors, from the ground up (each uses only those below it):
//! - [`config`]: hyper-parameters as plain data (no tensors).
//! - [`model`]: the Llama itself.
//! - [`io`]: checkpoint formats.
//! - [`device`]: choosing a burn device at run time.

pub mod chat;
pub mod config;
pub mod data;
pub mod device;
pub mod error;
pub mod exercises;
pub mod io;
pub mod memory;
pub mod model;
pub mod predict;
pub mod tokenizer;
pub mod train;
pub mod tricks;
pub mod values;

pub use error::{Error, Result};
