//! The training run the page starts: a tiny Llama with the learner's tricks, measured against
//! the predictor (per block and per kind, through napkin-core's `measure`), then trained for a
//! few steps on a sequence it can learn, reporting each loss and the tokens per second.
//!
//! Plain Rust over napkin-core: the Web Worker (`worker.rs`) runs it in the browser and the
//! native tests below run the same code. Events are serialised to JSON for `postMessage`.

use burn::tensor::Device;
use napkin_core::config::LlamaConfig;
use napkin_core::memory::measure::{
    MachineProbe, MeasurementReport, measure, micro_batches_of, random_model,
};
use napkin_core::memory::meter::Meter;
use napkin_core::predict::inventory::Scenario;
use napkin_core::train::{Accumulation, MicroBatch, Optimizer, OptimizerConfig, forward_backward};
use serde::{Deserialize, Serialize};
use web_time::Instant;

use crate::state::SandboxState;

/// Presets small enough to train in a browser tab.
pub const TRAINABLE_PRESETS: [&str; 3] = ["tiny-smol", "tiny-gqa", "tiny-mha"];

/// Longest sequence the page trains (the tiny presets' own limit may be lower).
pub const MAX_TRAIN_SEQ_LEN: usize = 256;

/// What the page asks the worker to do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainRequest {
    /// The controls (preset, tricks, B, T, accumulation, optimizer).
    pub settings: SandboxState,
    /// Optimizer steps after the measurement.
    pub steps: usize,
    /// Learning rate.
    pub learning_rate: f64,
}

impl TrainRequest {
    /// The page's default run for `settings`: 20 steps at a learning rate that makes the
    /// cycle's loss fall visibly (measured on tiny-smol, T = 64: LoRA 3e-3, from 6.2 to 3.5 in
    /// 30 steps; 1e-2 stalls at 5.7; full fine-tuning 1e-3, to 1.6).
    pub fn new(settings: SandboxState) -> Self {
        let learning_rate = if settings.lora { 3e-3 } else { 1e-3 };
        TrainRequest {
            settings,
            steps: 20,
            learning_rate,
        }
    }
}

/// What the worker reports, in order: `started`, `measured`, one `step` per optimizer step,
/// then `finished` — or `failed` at any point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum TrainEvent {
    /// The model is about to be built.
    Started {
        /// The burn backend in words.
        backend: String,
        /// The preset.
        preset: String,
        /// Parameters the optimizer updates.
        trainable_parameters: u64,
    },
    /// Predicted beside measured (per kind, per block, the step peak, the time).
    Measured {
        /// napkin-core's measurement report.
        report: Box<MeasurementReport>,
    },
    /// One optimizer step.
    Step {
        /// 1-based.
        step: usize,
        /// Mean loss over the step's label tokens.
        loss: f32,
        /// Label tokens per second of this step.
        tokens_per_second: f64,
        /// Bytes allocated after the step.
        live_bytes: u64,
    },
    /// The run ended.
    Finished {
        /// Label tokens per second over all steps.
        tokens_per_second: f64,
    },
    /// The run stopped with an error.
    Failed {
        /// Why.
        message: String,
    },
}

/// Why a run cannot start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// Only the tiny presets train in the page.
    #[error(
        "the preset `{0}` is predict-only in the browser; pick one of {presets} to train",
        presets = TRAINABLE_PRESETS.join(", ")
    )]
    NotTrainable(String),
    /// The core refused.
    #[error(transparent)]
    Core(#[from] napkin_core::error::Error),
    /// The loss became NaN or infinite.
    #[error("step {step}: the loss is {loss}; lower the learning rate")]
    Diverged {
        /// 1-based step.
        step: usize,
        /// The loss.
        loss: f32,
    },
}

/// The scenario a request trains (T capped at [`MAX_TRAIN_SEQ_LEN`], f32).
pub fn training_scenario(request: &TrainRequest) -> Result<Scenario, TrainError> {
    let preset = request.settings.preset.as_str();
    if !TRAINABLE_PRESETS.contains(&preset) {
        return Err(TrainError::NotTrainable(preset.to_string()));
    }
    let config = LlamaConfig::preset(preset)?;
    let mut scenario = request.settings.scenario();
    // The page trains in f32: burn Flex's bf16 GEMM widens to f32 on the CPU (README), so a
    // bf16 run here would measure nothing the prediction says.
    scenario.half_base = false;
    scenario.seq_len = scenario
        .seq_len
        .min(MAX_TRAIN_SEQ_LEN)
        .min(config.max_position_embeddings);
    Ok(scenario)
}

/// Rows the model can learn: a fixed random-looking cycle of 24 tokens, shifted per row, so
/// the loss falls from ln(V) as attention learns to copy the cycle.
fn learnable_micro_batches(s: &Scenario) -> Result<Vec<MicroBatch>, TrainError> {
    const CYCLE: usize = 24;
    let v = s.config.vocab_size;
    let cycle: Vec<u32> = (0..CYCLE).map(|i| ((i * 37 + 11) % v) as u32).collect();
    Ok(micro_batches_of(s, |m, r, i| {
        cycle[(i + 5 * r + 3 * m) % CYCLE]
    })?)
}

/// Runs a request on `device` (the plain, non-autodiff device), calling `emit` with each
/// event. The program's global allocator must be napkin-core's counting allocator.
pub fn run_training(
    request: &TrainRequest,
    device: &Device,
    backend: &str,
    emit: &mut dyn FnMut(TrainEvent),
) -> Result<(), TrainError> {
    let scenario = training_scenario(request)?;
    emit(TrainEvent::Started {
        backend: backend.to_string(),
        preset: request.settings.preset.clone(),
        trainable_parameters: scenario.trainable_parameters(),
    });
    let train_device = device.clone().autodiff();
    let report = measure(&scenario, device, 2, MachineProbe::BROWSER, None, || {
        train_device.seed(7);
        random_model(&scenario, &train_device)
    })?;
    emit(TrainEvent::Measured {
        report: Box::new(report),
    });

    train_device.seed(7);
    let mut model = random_model(&scenario, &train_device)?;
    let micro = learnable_micro_batches(&scenario)?;
    let mut optimizer = Optimizer::new(&OptimizerConfig {
        kind: scenario.optimizer,
        ..OptimizerConfig::default()
    });
    let mut meter = Meter::for_device(device)?;
    let started = Instant::now();
    let mut tokens = 0usize;
    for step in 1..=request.steps.max(1) {
        let clock = Instant::now();
        let out = forward_backward(
            &model,
            &micro,
            scenario.checkpointing,
            Accumulation::TokenWeighted,
        )?;
        if !out.loss.is_finite() {
            return Err(TrainError::Diverged {
                step,
                loss: out.loss,
            });
        }
        model = optimizer.step(model, &out.grads, request.learning_rate);
        tokens += out.tokens;
        emit(TrainEvent::Step {
            step,
            loss: out.loss,
            tokens_per_second: out.tokens as f64 / clock.elapsed().as_secs_f64().max(1e-9),
            live_bytes: meter.live(),
        });
    }
    emit(TrainEvent::Finished {
        tokens_per_second: tokens as f64 / started.elapsed().as_secs_f64().max(1e-9),
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Action, reduce};

    #[test]
    fn predict_only_presets_are_refused_by_name() {
        let settings = reduce(
            &SandboxState::default(),
            Action::SelectPreset("llama-2-7b".into()),
        );
        let request = TrainRequest {
            settings,
            steps: 1,
            learning_rate: 1e-3,
        };
        let err = run_training(&request, &napkin_core::device::cpu(), "test", &mut |_| {})
            .expect_err("refused");
        assert!(err.to_string().contains("llama-2-7b"), "{err}");
        assert!(err.to_string().contains("tiny-smol"), "{err}");
    }
}
