//! Training: one step's forward and backward (accumulation, checkpointing), gradients, the
//! optimizers, the learning-rate schedule, held-out evaluation, checkpoints and the loop.

pub mod adamw;
pub mod adamw8bit;
pub mod captured;
mod captured_inputs;
pub mod checkpoint;
pub mod config;
mod data;
pub mod data_parallel;
pub mod eval;
mod fused_adamw;
pub mod grads;
pub mod offload;
pub mod optimizer;
pub mod preference;
pub mod samples;
pub mod schedule;
mod setup;
pub mod sgd;
pub mod step;
pub mod trainer;

pub use crate::config::ObjectiveKind;
pub use adamw::{AdamW, AdamWConfig};
pub use config::{ComputeDtype, TrainConfig};
pub use data::{DataReport, Stream, load_pairs, load_samples};
pub use eval::{EvalReport, EvalState, held_out_loss, held_out_preference};
pub use grads::ParamGrads;
pub use offload::{HostOffload, LinkTraffic};
pub use optimizer::{Optimizer, OptimizerConfig, OptimizerKind, UpdateRule, trainable_ids};
pub use preference::{
    Objective, PreferenceMetrics, PreferenceStep, preference_forward_backward, preference_metrics,
};
pub use samples::{SamplePrompts, SampleText};
pub use schedule::{LrSchedule, ScheduleKind};
pub use step::{
    Accumulation, StepGradients, StepOptions, UnreadStep, forward_backward, forward_backward_marked,
};
pub use trainer::{StepReport, Trainer};
