//! Training: one step's forward and backward (accumulation, checkpointing), gradients, and the
//! optimizers. The loop, data and checkpoints grow here.

pub mod adamw;
pub mod adamw8bit;
pub mod checkpoint;
pub mod config;
mod fused_adamw;
pub mod grads;
pub mod offload;
pub mod optimizer;
pub mod schedule;
pub mod sgd;
pub mod step;
pub mod trainer;

pub use adamw::{AdamW, AdamWConfig};
pub use config::TrainConfig;
pub use grads::ParamGrads;
pub use offload::{HostOffload, LinkTraffic};
pub use optimizer::{Optimizer, OptimizerConfig, OptimizerKind, UpdateRule, trainable_ids};
pub use schedule::LrSchedule;
pub use step::{
    Accumulation, MicroBatch, StepGradients, UnreadStep, forward_backward, forward_backward_marked,
    forward_backward_unread,
};
pub use trainer::{StepReport, Trainer};
