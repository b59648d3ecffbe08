//! The training loop. One optimizer step, one line per trick:
//!
//! 1. take K micro-batches of B × T tokens from the loader (packed or padded);
//! 2. forward and backward each one, accumulating token-weighted gradients, with the decoder
//!    blocks recomputed in the backward when checkpointing is on (`step.rs`), and the linear
//!    layers computing in bf16 / f16 under mixed precision (`model/autocast.rs`);
//! 3. stop on a non-finite loss, before any weight changes; with f16, undo the loss scale and
//!    skip the update (halving the scale) when a gradient overflowed;
//! 4. clip the gradients to a global norm;
//! 5. read the learning rate off the schedule (warm-up, then constant, linear or cosine);
//! 6. let the optimizer (AdamW, 8-bit AdamW or SGD) update the trainable weights — with LoRA
//!    only the adapters, whose base stays frozen (and NF4-quantized with QLoRA).
//!
//! Between steps the caller may evaluate on held-out data (`evaluate`, `record_eval`): the
//! best step's weights go to `best/`, and early stopping ends the run (`is_done`).

use std::path::{Path, PathBuf};
use web_time::Instant;

use burn::module::Module;
use burn::tensor::{Device, FloatDType};
use serde::Serialize;

use super::captured::{Capturing, RunFacts, Update};
use super::checkpoint::{
    BEST_DIR, OPTIMIZER_FILE, TrainerState, newest_intact, optimizer_bytes, prune, read_optimizer,
    write_checkpoint, write_folder,
};
use super::config::TrainConfig;
use super::data::{DataReport, HeldOut, Stream, TrainingData};
use super::data_parallel::{REPLICA_HASH, StepFigures, all_reduce_step, replica_hash};
use super::eval::{EvalReport, EvalState, held_out_loss, held_out_preference};
use super::grads::{ParamGrads, clip_factor};
use super::optimizer::{Optimizer, trainable_ids};
use super::preference::{Objective, PreferenceMetrics, preference_forward_backward};
use super::samples::{SamplePrompts, SampleText};
use super::schedule::LrSchedule;
use super::setup::{
    Progress, check_device, check_ids_fit, check_same_run, check_vocabulary, model_with_tricks,
    optimizer_for, schedule_for,
};
use super::step::{StepOptions, forward_backward, recomputes_blocks};
use crate::config::{AttentionKind, OptimizerKind};
use crate::config::{LoraConfig, ObjectiveKind};
use crate::data::MicroBatch;
use crate::data::PairBatch;
use crate::device::{guard_device_memory, is_gpu};
use std::cell::RefCell;
use std::rc::Rc;

use crate::distributed::Counted;
use crate::error::{Error, Result};
use crate::export::write_hf_folder;
use crate::io::hf::hf_files;
use crate::io::hf_writer::{WeightDtype, WeightLayout, base_weight_dtype};
use crate::model::Llama;
use crate::model::autocast::autocast;
use crate::tokenizer::TextTokenizer;

/// What one optimizer step did.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StepReport {
    /// Optimizer steps completed (this one included).
    pub step: u64,
    /// Mean loss over the step's label tokens.
    pub loss: f32,
    /// The learning rate used.
    pub lr: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Label tokens in the step.
    pub label_tokens: usize,
    /// Tokens processed (B × T × K, padding included).
    pub tokens: usize,
    /// Wall-clock seconds of the step.
    pub seconds: f64,
    /// The f16 loss scale used (1 without f16).
    pub loss_scale: f64,
    /// Whether the update was skipped (an f16 gradient overflowed).
    pub skipped: bool,
    /// With a preference objective, TRL's metrics of the step (`loss` is their loss).
    pub preference: Option<PreferenceMetrics>,
}

/// A step's forward and backward, whatever the objective.
struct Forward {
    grads: ParamGrads,
    loss: f32,
    label_tokens: usize,
    tokens: usize,
    preference: Option<PreferenceMetrics>,
    /// The gradients' global norm, when the step already read it (a replayed step).
    grad_norm: Option<f64>,
    /// The optimizer's update already ran (inside a replayed step's graph, skipped there when
    /// the loss was not finite).
    updated: bool,
}

/// f16 dynamic loss scaling as torch's `GradScaler`: start at 2^16, halve on overflow (and
/// skip that update), double after this many steps without one.
const SCALE_GROWTH_INTERVAL: u64 = 2000;

/// A run in progress.
#[derive(Debug)]
pub struct Trainer {
    /// The settings.
    pub config: TrainConfig,
    /// The model being trained.
    pub model: Llama,
    /// The optimizer and its state.
    pub optimizer: Optimizer,
    /// The data stream.
    pub loader: Stream,
    /// The learning-rate schedule.
    pub schedule: LrSchedule,
    /// Optimizer steps completed.
    pub step: u64,
    /// The best held-out loss so far (early stopping).
    pub eval: EvalState,
    /// The data, summarised.
    pub data: DataReport,
    eval_batches: HeldOut,
    sample_prompts: Option<SamplePrompts>,
    objective: Objective,
    /// DPO's reference, graph-free: the base with the adapters off, or (with `--adapter`) the
    /// adapter the run started from, as TRL takes it. It shares the base's weights.
    reference: Option<Llama>,
    tokenizer: std::sync::Arc<TextTokenizer>,
    lora: Option<LoraConfig>,
    device: Device,
    compute: Option<FloatDType>,
    loss_scale: f64,
    good_steps: u64,
    /// With several ranks (DDP): the engine every step's all-reduce goes through.
    collective: Option<Rc<RefCell<Counted>>>,
    /// The step captured as a device graph (GPU backends), or why not.
    capturing: Capturing,
}

impl Trainer {
    /// Loads the model, applies the tricks, reads the data and, when `out` already holds a
    /// checkpoint and `resume` is set, continues from the newest intact one. Returns the
    /// trainer and the damaged checkpoints that were skipped.
    pub fn new(config: TrainConfig, resume: bool) -> Result<(Self, Vec<Error>)> {
        config.validate()?;
        let compute = config.compute_dtype()?;
        check_device(&config, compute)?;
        let device = config.device.open()?.autodiff();
        let (found, skipped) = if resume {
            newest_intact(&config.out)
        } else {
            (None, Vec::new())
        };
        let TrainingData {
            tokenizer,
            mut loader,
            eval_batches,
            sample_prompts,
            report: data,
            largest_id,
        } = TrainingData::read(&config)?;
        check_vocabulary(&config, &tokenizer)?;
        let (model, lora) = model_with_tricks(&config, &device, compute, found.as_ref())?;
        check_ids_fit(&config, largest_id, model.config.vocab_size)?;
        let reference = match (config.objective, &config.adapter) {
            (ObjectiveKind::Dpo, None) => Some(model.without_adapters().valid()),
            (ObjectiveKind::Dpo, Some(dir)) => {
                Some(model.without_adapters().load_lora(dir)?.0.valid())
            }
            _ => None,
        };
        let objective = Objective::of(config.objective, config.beta);
        let mut optimizer = optimizer_for(&config);
        let mut progress = Progress::start(compute);
        if let Some((dir, state)) = &found {
            check_same_run(&config, &state.config)?;
            let tensors = read_optimizer(&dir.join(OPTIMIZER_FILE))?;
            let ids = trainable_ids(&model);
            optimizer.import_state(&ids, &device.clone().inner(), &tensors, state.step)?;
            loader.resume(state.loader);
            progress = Progress {
                step: state.step,
                eval: state.eval,
                loss_scale: state.loss_scale,
                good_steps: state.good_steps,
            };
        }
        let schedule = schedule_for(&config, &loader, 1);
        let capturing = Capturing::plan(&RunFacts {
            model: &model,
            on_gpu: is_gpu(&device),
            wanted: config.capture,
            supervised: config.objective == ObjectiveKind::Sft,
            lora_dropout: config.lora_dropout,
            efficient_attention: config.attention == AttentionKind::Efficient,
            loss_chunk_rows: config.loss_chunk_rows(model.config.vocab_size),
            loss_scaling: progress.loss_scale != 1.0,
            adamw_on_device: config.optimizer == OptimizerKind::AdamW && !config.offload_optimizer,
        });
        Ok((
            Trainer {
                config,
                model,
                optimizer,
                loader,
                schedule,
                step: progress.step,
                eval: progress.eval,
                data,
                eval_batches,
                sample_prompts,
                objective,
                reference,
                tokenizer,
                lora,
                device,
                compute,
                loss_scale: progress.loss_scale,
                good_steps: progress.good_steps,
                collective: None,
                capturing,
            },
            skipped,
        ))
    }

    /// Trains data-parallel with the ranks of `collective` (DDP, see `data_parallel.rs`): this
    /// rank takes its share of each step's micro-batches, and the steps per epoch count every
    /// rank's. Supervised objectives only.
    /// The caller keeps its own handle on the engine, to finish or abort the ranks.
    pub fn join(&mut self, collective: Rc<RefCell<Counted>>) -> Result<()> {
        let world = collective.borrow().world();
        if world > 1 && self.config.objective.is_preference() {
            return Err(Error::Input(format!(
                "--shard ddp: {} on several ranks is not implemented yet (its loss is pair-weighted); train it on one process",
                self.config.objective
            )));
        }
        self.schedule = schedule_for(&self.config, &self.loader, world);
        self.collective = Some(collective);
        Ok(())
    }

    /// This process's rank and the ranks in all (0 of 1 alone).
    pub fn rank_and_world(&self) -> (usize, usize) {
        self.collective.as_ref().map_or((0, 1), |c| {
            let c = c.borrow();
            (c.rank(), c.world())
        })
    }

    /// Checks that every rank holds the same trainable values (by hash); every rank calls it
    /// at the same steps. An error names the step.
    pub fn check_replicas(&mut self) -> Result<()> {
        let Some(c) = self.collective.as_ref() else {
            return Ok(());
        };
        let hash = replica_hash(&self.model)?;
        let (low, high) = c.borrow_mut().min_max_u64(REPLICA_HASH, hash)?;
        if low != high {
            return Err(Error::Internal(format!(
                "after step {} the ranks' trainable values differ (hashes {low:016x} … {high:016x})",
                self.step
            )));
        }
        Ok(())
    }

    /// Optimizer steps in the whole run.
    pub fn total_steps(&self) -> u64 {
        self.schedule.total_steps
    }

    /// Whether the run is complete: every step taken, or stopped early.
    pub fn is_done(&self) -> bool {
        self.step >= self.schedule.total_steps || self.stopped_early()
    }

    /// Whether the run has held-out data to evaluate on.
    pub fn has_eval(&self) -> bool {
        !self.eval_batches.is_empty()
    }

    /// Whether early stopping ended the run.
    pub fn stopped_early(&self) -> bool {
        self.eval.should_stop(self.config.early_stopping)
    }

    /// Whether the run evaluates (or answers its sample prompts) after the step just taken:
    /// every `eval_every` steps and after the last.
    pub fn eval_due(&self) -> bool {
        let every = self.config.eval_every;
        (!self.eval_batches.is_empty() || self.sample_prompts.is_some())
            && self.step > 0
            && ((every > 0 && self.step.is_multiple_of(every))
                || self.step >= self.schedule.total_steps)
    }

    /// The held-out loss of the current weights, in the run's compute precision (None
    /// without held-out data).
    pub fn evaluate(&self) -> Result<Option<EvalReport>> {
        if self.eval_batches.is_empty() {
            return Ok(None);
        }
        let _precision = autocast(self.compute);
        match &self.eval_batches {
            HeldOut::Tokens(batches) => held_out_loss(
                &self.model,
                batches,
                self.config.loss_chunk_rows(self.model.config.vocab_size),
            )
            .map(Some),
            HeldOut::Pairs(batches) => held_out_preference(
                &self.model,
                self.reference.as_ref(),
                batches,
                self.objective,
                self.config.loss_chunk_rows(self.model.config.vocab_size),
            )
            .map(Some),
        }
    }

    /// Greedy answers to the sample prompts with the current weights (empty without any).
    pub fn sample(&self) -> Result<Vec<SampleText>> {
        let _precision = autocast(self.compute);
        match &self.sample_prompts {
            Some(p) => p.generate(&self.model),
            None => Ok(Vec::new()),
        }
    }

    /// Records an evaluation of the current step for early stopping; a new best writes the
    /// weights to `best/` (crash-safely). Returns whether it was a new best.
    pub fn record_eval(&mut self, report: &EvalReport) -> Result<bool> {
        let improved = self.eval.record(self.step, report.loss);
        // With several ranks only rank 0 writes (every rank keeps the same record).
        if improved && self.rank_and_world().0 == 0 {
            write_folder(
                &self.config.out,
                BEST_DIR,
                self.state(),
                &self.weight_files()?,
            )?;
        }
        Ok(improved)
    }

    fn state(&self) -> TrainerState {
        TrainerState {
            step: self.step,
            loader: self.loader.state(),
            config: self.config.clone(),
            loss_scale: self.loss_scale,
            good_steps: self.good_steps,
            eval: self.eval,
            checksums: Default::default(),
        }
    }

    /// Why the step runs op by op on a GPU, or that it is captured: once, when it is known.
    pub fn take_capture_note(&mut self) -> Option<String> {
        self.capturing.take_note()
    }

    /// Whether the steps are replayed from a recorded device graph.
    pub fn is_replaying(&self) -> bool {
        self.capturing.is_replaying()
    }

    /// What the last replayed step submitted from the host: its writes into the recorded
    /// input buffers, the replay and one read.
    pub fn replay_submissions(&self) -> Option<usize> {
        self.capturing.submissions()
    }

    /// One optimizer step (see the module documentation for the order of things). On a GPU an
    /// allocation that does not fit ends the step with [`Error::OutOfDeviceMemory`]; the model
    /// is left as it was before the step and the checkpoints on disk are untouched.
    pub fn train_step(&mut self) -> Result<StepReport> {
        if !is_gpu(&self.device) {
            return self.unguarded_step();
        }
        let device = self.config.device.to_string();
        let during = format!("training step {}", self.step + 1);
        guard_device_memory(&device, &during, || self.unguarded_step())
    }

    fn unguarded_step(&mut self) -> Result<StepReport> {
        let start = Instant::now();
        // LoRA dropout draws from a stream keyed by the seed and the step: a resumed run draws
        // the same masks as an uninterrupted one, and a checkpointed block's recomputation
        // the masks of its first forward.
        let dropout_key = self
            .config
            .seed
            .wrapping_add(self.step.wrapping_mul(1_000_003));
        // 1–2. K micro-batches, forward and backward: token-weighted accumulation (pair-weighted
        //      for a preference objective), optional checkpointing, linear layers in the
        //      autocast precision.
        let loss_scale = self.loss_scale;
        let options = StepOptions::default()
            .with_checkpointing(self.config.checkpointing)
            .with_loss_chunk_rows(self.config.loss_chunk_rows(self.model.config.vocab_size))
            .with_loss_scale(loss_scale)
            .with_dropout_key(dropout_key);
        let mut step = self.forward_backward(&options)?;
        if let Some(c) = self.collective.as_ref()
            && c.borrow().world() > 1
        {
            let mut figures = StepFigures {
                loss: step.loss,
                label_tokens: step.label_tokens,
                tokens: step.tokens,
            };
            let device = self.device.clone().inner();
            all_reduce_step(
                &mut c.borrow_mut(),
                &self.model,
                &mut step.grads,
                &mut figures,
                &device,
            )?;
            step.loss = figures.loss;
            step.label_tokens = figures.label_tokens;
            step.tokens = figures.tokens;
        }
        // 3. A non-finite loss stops the run before the weights change.
        if !step.loss.is_finite() {
            return Err(Error::Input(format!(
                "the loss is {} at step {}: stopping; the last checkpoint is intact (lower --lr?)",
                step.loss,
                self.step + 1
            )));
        }
        if loss_scale != 1.0 {
            step.grads.scale(1.0 / loss_scale);
        }
        // One global norm serves the overflow check and the clipping.
        let grad_norm = match step.grad_norm {
            Some(norm) => norm,
            None => step.grads.global_norm(),
        };
        if loss_scale != 1.0 {
            if !grad_norm.is_finite() {
                // An f16 overflow: no update, a smaller scale next time.
                self.loss_scale = loss_scale / 2.0;
                self.good_steps = 0;
                self.step += 1;
                return Ok(StepReport {
                    step: self.step,
                    loss: step.loss,
                    lr: self.schedule.lr_at(self.step - 1),
                    grad_norm: f64::INFINITY,
                    label_tokens: step.label_tokens,
                    tokens: step.tokens,
                    seconds: start.elapsed().as_secs_f64(),
                    loss_scale,
                    skipped: true,
                    preference: step.preference,
                });
            }
            self.good_steps += 1;
            if self.good_steps >= SCALE_GROWTH_INTERVAL {
                self.loss_scale = loss_scale * 2.0;
                self.good_steps = 0;
            }
        }
        // 4. Clipping by global norm: the factor every gradient is multiplied by, which the
        //    update applies as it reads each value.
        let clip = if self.config.max_grad_norm > 0.0 {
            clip_factor(self.config.max_grad_norm, grad_norm)
        } else {
            1.0
        };
        // 5. The learning rate of this step.
        let lr = self.schedule.lr_at(self.step);
        // 6. The update.
        // (Cloning a module shares its tensors; nothing is copied.)
        if !step.updated {
            self.model = self
                .optimizer
                .step_scaled(self.model.clone(), &step.grads, lr, clip);
        }
        self.step += 1;
        Ok(StepReport {
            step: self.step,
            loss: step.loss,
            lr,
            grad_norm,
            label_tokens: step.label_tokens,
            tokens: step.tokens,
            seconds: start.elapsed().as_secs_f64(),
            loss_scale,
            skipped: false,
            preference: step.preference,
        })
    }

    /// The step's micro-batches from the stream, forward and backward.
    fn forward_backward(&mut self, options: &StepOptions) -> Result<Forward> {
        let k = self.config.accumulation;
        // With N ranks, this rank's K of the step's N·K micro-batches (round-robin).
        let (rank, world) = self.rank_and_world();
        let _precision = autocast(self.compute);
        match &mut self.loader {
            Stream::Tokens(loader) => {
                let micro: Vec<_> = (0..k * world)
                    .map(|_| loader.next_batch())
                    .enumerate()
                    .filter(|(i, _)| i % world == rank)
                    .map(|(_, m)| m)
                    .collect();
                let tokens = micro.iter().map(|m| m.batch.batch * m.batch.seq).sum();
                let recomputes = recomputes_blocks(&self.model, options.checkpointing);
                let mut update = Update {
                    optimizer: &mut self.optimizer,
                    lr: self.schedule.lr_at(self.step),
                    max_grad_norm: self.config.max_grad_norm,
                };
                let replayed =
                    self.capturing
                        .step(&self.model, &mut update, &micro, recomputes, world)?;
                if let Some(replayed) = replayed {
                    return Ok(Forward {
                        grads: replayed.grads,
                        loss: replayed.loss,
                        label_tokens: micro.iter().map(MicroBatch::label_tokens).sum(),
                        tokens,
                        preference: None,
                        grad_norm: Some(replayed.grad_norm),
                        updated: true,
                    });
                }
                let step = forward_backward(&self.model, &micro, options)?.read();
                Ok(Forward {
                    grads: step.grads,
                    loss: step.loss,
                    label_tokens: step.tokens,
                    tokens,
                    preference: None,
                    grad_norm: None,
                    updated: false,
                })
            }
            Stream::Pairs(loader) => {
                let batches: Vec<PairBatch> = (0..k).map(|_| loader.next_batch()).collect();
                let tokens = batches
                    .iter()
                    .map(|b| b.micro.batch.batch * b.micro.batch.seq)
                    .sum();
                let label_tokens = batches.iter().map(|b| b.micro.label_tokens()).sum();
                let step = preference_forward_backward(
                    &self.model,
                    self.reference.as_ref(),
                    &batches,
                    self.objective,
                    options,
                )?;
                Ok(Forward {
                    grads: step.grads,
                    loss: step.metrics.loss as f32,
                    label_tokens,
                    tokens,
                    preference: Some(step.metrics),
                    grad_norm: None,
                    updated: false,
                })
            }
        }
    }

    /// Saves a checkpoint of the current step and keeps only the newest ones.
    pub fn save_checkpoint(&self) -> Result<PathBuf> {
        let mut files = self.weight_files()?;
        let ids = trainable_ids(&self.model);
        files.push((
            OPTIMIZER_FILE.to_string(),
            optimizer_bytes(&self.optimizer.export_state(&ids))?,
        ));
        let dir = write_checkpoint(&self.config.out, self.state(), &files)?;
        prune(&self.config.out, self.config.keep_checkpoints)?;
        Ok(dir)
    }

    /// Writes the final result into `out`: the peft adapter (with LoRA) or the full model; with
    /// `merge`, also the merged model in HF format under `out/merged`, with the tokenizer.
    pub fn save_final(&self, merge: bool) -> Result<Vec<PathBuf>> {
        let out = &self.config.out;
        let mut written = Vec::new();
        for (name, bytes) in self.weight_files()? {
            let path = out.join(&name);
            crate::io::atomic::write_atomic(&path, &bytes)?;
            written.push(path);
        }
        if merge && self.lora.is_some() {
            written.extend(self.write_merged(&out.join("merged"))?);
        }
        Ok(written)
    }

    /// A complete model folder with every adapter folded in: the weights tensor by tensor in
    /// the base's dtype (or `merge_dtype`), sharded past `max_shard_bytes`; the config; the
    /// generation config; the tokenizer trained with and its chat template.
    fn write_merged(&self, dir: &Path) -> Result<Vec<PathBuf>> {
        let dtype = match self.config.merge_dtype {
            Some(dtype) => dtype,
            // A preset's random weights are f32.
            None if self.config.preset.is_some() => WeightDtype::F32,
            None => base_weight_dtype(&self.config.model)?,
        };
        let layout = WeightLayout {
            dtype,
            max_shard_bytes: self.config.max_shard_bytes,
            merge_lora: true,
        };
        write_hf_folder(&self.model, &self.tokenizer, dir, layout)
    }

    /// The trained weights as files: the adapter, or the whole model.
    fn weight_files(&self) -> Result<Vec<(String, Vec<u8>)>> {
        match &self.lora {
            Some(lora) => self
                .model
                .lora_files_on(lora, Some(&self.config.model_name())),
            None => hf_files(&self.model),
        }
    }
}
