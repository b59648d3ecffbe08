//! Training: the optimizers (the loop, data and checkpoints grow here).

pub mod adamw;

pub use adamw::{AdamW, AdamWConfig};
