//! Training: one step's forward and backward (accumulation, checkpointing), gradients, and the
//! optimizers. The loop, data and checkpoints grow here.

pub mod adamw;
pub mod grads;
pub mod step;

pub use adamw::{AdamW, AdamWConfig};
pub use grads::ParamGrads;
pub use step::{Accumulation, MicroBatch, StepGradients, forward_backward};
