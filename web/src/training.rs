//! The training run the page starts: a tiny Llama with the learner's tricks, measured against
//! the predictor (per block and per kind, through napkin-core's `measure`), then trained for a
//! few steps on a sequence it can learn, reporting each loss and the tokens per second.
//!
//! Plain Rust over napkin-core: the Web Worker (`worker.rs`) runs it in the browser and the
//! native tests below run the same code. Events are serialised to JSON for `postMessage`.

use burn::tensor::Device;
use napkin_core::config::LlamaConfig;
use napkin_core::data::MicroBatch;
use napkin_core::measure::{
    MachineProbe, MeasurementReport, measure, micro_batches_of, random_model,
};
use napkin_core::memory::meter::{Meter, MeterMethod};
use napkin_core::model::Llama;
use napkin_core::predict::inventory::{Kind, Scenario, inventory};
use napkin_core::train::{
    Optimizer, OptimizerConfig, OptimizerKind, StepOptions, UnreadStep, forward_backward,
};
use serde::{Deserialize, Serialize};
use web_time::Instant;

use crate::state::SandboxState;

/// Presets small enough to train in a browser tab.
pub const TRAINABLE_PRESETS: [&str; 3] = ["tiny-smol", "tiny-gqa", "tiny-mha"];

/// Longest sequence the page trains (the tiny presets' own limit may be lower).
pub const MAX_TRAIN_SEQ_LEN: usize = 256;

/// Where the page trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrainBackend {
    /// burn Flex on the CPU, in the module the page loads.
    #[default]
    Cpu,
    /// burn wgpu on the browser's WebGPU, in a second module loaded only for this.
    WebGpu,
}

/// What the page asks the worker to do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainRequest {
    /// The controls (preset, tricks, B, T, accumulation, optimizer).
    pub settings: SandboxState,
    /// Optimizer steps after the measurement.
    pub steps: usize,
    /// Learning rate.
    pub learning_rate: f64,
    /// Where to train.
    #[serde(default)]
    pub backend: TrainBackend,
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
            backend: TrainBackend::Cpu,
        }
    }
}

/// What the worker reports, in order: `started`, `measured` (on the CPU only), one `step` per
/// optimizer step, `resident`, then `finished` — or `failed` at any point.
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
        /// How the memory figures are read (the worker's heap, or the GPU's memory pool).
        memory_method: MeterMethod,
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
        /// Bytes in use after the step (see `memory_method`).
        live_bytes: u64,
    },
    /// What stays in memory between steps (weights, NF4 codes and scales, adapters,
    /// optimizer state), predicted beside measured after the last step.
    Resident {
        /// The predictor's bytes for the memory `memory_method` reads.
        predicted_bytes: u64,
        /// Bytes in use after the last step less those in use before the model was built.
        measured_bytes: u64,
        /// On a GPU backend, the host copy of the NF4 codes and scales (the products read the
        /// copy uploaded to the device; the host one is what a checkpoint or a merge reads);
        /// 0 on the CPU.
        host_side_bytes: u64,
    },
    /// A file is arriving: the WebGPU or real-model module, or the real model (sent by the
    /// worker's script while it fetches).
    Downloading {
        /// What, in words.
        #[serde(default)]
        what: String,
        /// Bytes received.
        loaded: u64,
        /// The file's size, when the server said it.
        total: Option<u64>,
    },
    /// The real model is loaded for training (NF4 base, adapters).
    Loaded {
        /// The checkpoint's parameters.
        parameters: u64,
        /// The GGUF file's size.
        file_bytes: u64,
        /// Seconds to parse, dequantize and quantize it to NF4.
        seconds: f64,
    },
    /// The real model's greedy answer to the learner's question.
    Answer {
        /// Before or after training.
        stage: AnswerStage,
        /// The question.
        question: String,
        /// The answer, decoded.
        answer: String,
        /// The model's mean loss (nats/token) on the taught answer to this question, when one
        /// of the pairs asks it.
        taught_answer_loss: Option<f64>,
        /// Seconds to answer.
        seconds: f64,
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

/// When the real model answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnswerStage {
    /// Before the first step.
    Before,
    /// After the last step.
    After,
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
    /// A field of the real-model request is unusable.
    #[error("{field}: {why}")]
    Lesson {
        /// The request's field.
        field: String,
        /// What is wrong and what is expected.
        why: String,
    },
    /// The core refused.
    #[error(transparent)]
    Core(#[from] napkin_core::error::Error),
    /// The optimizer reads its state back to the host every step, which the browser cannot
    /// wait for on WebGPU.
    #[error(
        "{optimizer} keeps its state on the host and reads it back every step, which WebGPU in a \
         browser cannot wait for; pick AdamW or SGD, or train on the CPU"
    )]
    ReadsBack {
        /// The optimizer, in words.
        optimizer: String,
    },
    /// A read from the device failed.
    #[error("reading the loss back from the device failed: {0}")]
    Read(String),
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
    scenario.half_compute = false;
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

/// Runs a request on `device` (the plain, non-autodiff device: the CPU, or an initialised
/// WebGPU device when `request.backend` says so), calling `emit` with each event. The
/// program's global allocator must be napkin-core's counting allocator.
///
/// Nothing here blocks on the device: each step's loss is awaited after the optimizer's update
/// is queued, which is what lets the same code run on WebGPU, where a browser cannot wait for
/// a read. On the CPU every read is ready at once.
pub async fn run_training(
    request: &TrainRequest,
    device: &Device,
    backend: &str,
    emit: &mut dyn FnMut(TrainEvent),
) -> Result<(), TrainError> {
    let scenario = training_scenario(request)?;
    let on_gpu = request.backend == TrainBackend::WebGpu;
    let mut meter = Meter::for_device(device)?;
    emit(TrainEvent::Started {
        backend: backend.to_string(),
        preset: request.settings.preset.clone(),
        trainable_parameters: scenario.trainable_parameters(),
        memory_method: meter.method(),
    });
    // The model is built on the CPU from the same seed on every backend, so a WebGPU run starts
    // from the very weights a CPU run does (NF4 quantization reads the weights on the host).
    let cpu = napkin_core::device::cpu();
    if !on_gpu {
        // The per-block measurement reads the counting allocator and blocks on its reads: CPU only.
        let build_device = cpu.clone().autodiff();
        let report = measure(&scenario, &cpu, 2, MachineProbe::BROWSER, None, || {
            build_device.seed(7);
            random_model(&scenario, &build_device)
        })?;
        emit(TrainEvent::Measured {
            report: Box::new(report),
        });
    }

    let mut optimizer = Optimizer::new(&OptimizerConfig {
        kind: scenario.optimizer,
        ..OptimizerConfig::default()
    });
    if on_gpu && optimizer.reads_back() {
        let optimizer = match scenario.optimizer {
            OptimizerKind::AdamW8bit => "8-bit AdamW".to_string(),
            other => format!("{other:?} with offload"),
        };
        return Err(TrainError::ReadsBack { optimizer });
    }
    let before_model = meter.live_without_sync();
    let build_device = cpu.autodiff();
    build_device.seed(7);
    let mut model = random_model(&scenario, &build_device)?;
    if on_gpu {
        model = model.on_device(&device.clone().autodiff());
    }
    let micro = learnable_micro_batches(&scenario)?;
    let started = Instant::now();
    let mut tokens = 0usize;
    for step in 1..=request.steps.max(1) {
        let (next, event, step_tokens) = train_step(
            model,
            &micro,
            scenario.checkpointing,
            &mut optimizer,
            request.learning_rate,
            step,
            &mut meter,
        )
        .await?;
        model = next;
        tokens += step_tokens;
        emit(event);
    }
    let (predicted_bytes, host_side_bytes) = resident_bytes(&scenario, on_gpu);
    emit(TrainEvent::Resident {
        predicted_bytes,
        measured_bytes: meter.live_without_sync().saturating_sub(before_model),
        host_side_bytes,
    });
    emit(TrainEvent::Finished {
        tokens_per_second: tokens as f64 / started.elapsed().as_secs_f64().max(1e-9),
    });
    Ok(())
}

/// One optimizer step of `model` on `micro`: the updated model, its `Step` event and its label
/// tokens. The loss
/// is awaited after the update is queued, so its arrival also means the step is done (what
/// lets the same code run on WebGPU, where a browser cannot wait for a read).
pub(crate) async fn train_step(
    model: Llama,
    micro: &[MicroBatch],
    checkpointing: bool,
    optimizer: &mut Optimizer,
    learning_rate: f64,
    step: usize,
    meter: &mut Meter,
) -> Result<(Llama, TrainEvent, usize), TrainError> {
    let clock = Instant::now();
    let unread = forward_backward(
        &model,
        micro,
        &StepOptions::default()
            .with_checkpointing(checkpointing)
            .with_dropout_key(step as u64),
    )?;
    let mean_loss = unread.mean_loss();
    let UnreadStep {
        grads,
        tokens: step_tokens,
        ..
    } = unread;
    let model = optimizer.step(model, &grads, learning_rate);
    drop(grads);
    let loss: f32 = mean_loss
        .into_scalar_async()
        .await
        .map_err(|e| TrainError::Read(format!("{e:?}")))?;
    if !loss.is_finite() {
        return Err(TrainError::Diverged { step, loss });
    }
    let event = TrainEvent::Step {
        step,
        loss,
        tokens_per_second: step_tokens as f64 / clock.elapsed().as_secs_f64().max(1e-9),
        live_bytes: meter.live_without_sync(),
    };
    Ok((model, event, step_tokens))
}

/// The predictor's bytes that stay between steps on the device that trains, and the host copy
/// of the NF4 codes and scales a GPU backend keeps beside the device's.
pub(crate) fn resident_bytes(scenario: &Scenario, on_gpu: bool) -> (u64, u64) {
    let (mut device, mut host) = (0, 0);
    for entry in inventory(scenario) {
        match entry.kind {
            Kind::Weights | Kind::Adapters | Kind::OptimizerState => device += entry.bytes,
            Kind::QuantCodes | Kind::QuantScales => {
                device += entry.bytes;
                if on_gpu {
                    host += entry.bytes;
                }
            }
            _ => {}
        }
    }
    (device, host)
}

/// Runs a future whose every read completes at once (napkin-core on a CPU backend) to its end
/// on this thread: the native tests' way to call [`run_training`].
#[cfg(not(target_arch = "wasm32"))]
pub fn ready_now<F: std::future::Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(out) = future.as_mut().poll(&mut context) {
            return out;
        }
        std::thread::yield_now();
    }
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
            steps: 1,
            ..TrainRequest::new(settings)
        };
        let err = ready_now(run_training(
            &request,
            &napkin_core::device::cpu(),
            "test",
            &mut |_| {},
        ))
        .expect_err("refused");
        assert!(err.to_string().contains("llama-2-7b"), "{err}");
        assert!(err.to_string().contains("tiny-smol"), "{err}");
    }
}
