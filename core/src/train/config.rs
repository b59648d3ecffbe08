//! Every setting of a training run, as one plain struct: read from a TOML file or built from
//! command-line flags, saved next to the run's outputs, and compared on resume.

use std::path::PathBuf;

use burn::tensor::FloatDType;
use serde::{Deserialize, Serialize};

use super::optimizer::OptimizerKind;
use super::schedule::ScheduleKind;
use crate::chat::BuiltInChat;
use crate::config::default_chunk_rows;
use crate::config::spellings;
use crate::config::{
    AttentionKind, Kernels, LlamaConfig, LoraConfig, Nf4Config, ObjectiveKind, TargetNames,
};
use crate::data::DataFormat;
use crate::device::DeviceKind;
use crate::error::{Error, Result};
use crate::io::hf_writer::WeightDtype;
use crate::predict::inventory::Scenario;
use crate::predict::settings::StepSettings;
use crate::predict::sharding::Strategy;

/// The precision the linear layers compute in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ComputeDtype {
    /// Everything in f32.
    #[default]
    F32,
    /// bf16 autocast: f32 parameters and optimizer state, bf16 products.
    Bf16,
    /// f16 autocast, with dynamic loss scaling.
    F16,
}

spellings! {
    ComputeDtype, "precision", "dtype", serde;
    F32 => "f32" ["fp32", "float32"]: "everything in f32",
    Bf16 => "bf16" ["bfloat16"]: "bf16 autocast: f32 parameters and optimizer state, bf16 products",
    F16 => "f16" ["fp16", "float16"]: "f16 autocast, with dynamic loss scaling",
}

impl ComputeDtype {
    /// The autocast precision (None: f32).
    pub fn half(self) -> Option<FloatDType> {
        match self {
            ComputeDtype::F32 => None,
            ComputeDtype::Bf16 => Some(FloatDType::BF16),
            ComputeDtype::F16 => Some(FloatDType::F16),
        }
    }
}

/// A training run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// A `.gguf` file, a HF folder or a napkin NF4 folder.
    pub model: PathBuf,
    /// Instead of `model`: a named configuration (`tinyllama-1.1b`, …) with random weights,
    /// seeded: a run's memory and speed at that size without its weights. Needs `tokenizer`
    /// (a vocabulary no larger than the preset's).
    pub preset: Option<String>,
    /// Training data: `.jsonl` or `.json` records (alpaca, sharegpt, chat `messages`,
    /// prompt/completion or text), or plain `.txt` / `.md`.
    pub data: PathBuf,
    /// The records' format: `auto` (from the first record), `alpaca`, `sharegpt`, `messages`,
    /// `prompt-completion` or `text`.
    pub data_format: DataFormat,
    /// Learn the prompts too, not only the replies / completions.
    pub train_on_inputs: bool,
    /// `sft` (the labels' cross-entropy), or `dpo` / `orpo` on preference pairs
    /// (`prompt`, `chosen`, `rejected` records).
    pub objective: ObjectiveKind,
    /// DPO's β (how far the policy may move from the reference) or ORPO's λ (the odds-ratio
    /// term's weight); TRL's default.
    pub beta: f64,
    /// Held-out data to evaluate on (any format `data` takes).
    pub eval_data: Option<PathBuf>,
    /// Hold out this fraction of `data` (seeded) instead of `eval_data` (0: none).
    pub val_fraction: f64,
    /// Evaluate every N optimizer steps, and after the last (0: only after the last).
    pub eval_every: u64,
    /// Stop after N evaluations in a row without a lower held-out loss (0: never); the best
    /// step's weights are kept in `best/`.
    pub early_stopping: usize,
    /// Prompts answered greedily at each evaluation (through the chat template when the
    /// model has one), logged beside the held-out loss.
    pub sample_prompts: Vec<String>,
    /// Most tokens generated per sample prompt.
    pub sample_tokens: usize,
    /// Data-parallel training over the ranks a launcher started (`mpirun -np N`): `ddp` only
    /// (the other strategies are predicted by `napkin estimate --shard`, not trained).
    pub shard: Option<Strategy>,
    /// Output folder: checkpoints, metrics, the final adapter (or model).
    pub out: PathBuf,
    /// A `tokenizer.json` instead of the model's own.
    pub tokenizer: Option<PathBuf>,
    /// `chatml`, `llama2` or `zephyr` instead of the model's chat template.
    pub chat_format: Option<BuiltInChat>,
    /// A LoRA adapter folder (peft's files) to continue training; its rank, α and targets
    /// become the run's.
    pub adapter: Option<PathBuf>,
    /// LoRA rank; 0 trains every weight (full fine-tuning).
    pub lora_r: usize,
    /// LoRA α (the adapter output is scaled by α / r).
    pub lora_alpha: f64,
    /// Dropout on the adapters' input.
    pub lora_dropout: f64,
    /// rsLoRA: scale the adapter output by α / √r instead of α / r (peft's `use_rslora`), so
    /// the update's size stops shrinking as the rank grows.
    pub rslora: bool,
    /// DoRA (peft's `use_dora`): a trainable magnitude per output row of each adapted linear,
    /// over the direction of `W + s·BA`.
    pub dora: bool,
    /// Adapted linears: `all-linear` or a list such as `q,v`.
    #[serde(alias = "targets")]
    pub lora_targets: String,
    /// Quantize the frozen base to NF4 (QLoRA).
    pub nf4: bool,
    /// Quantize the NF4 scales too.
    pub double_quant: bool,
    /// Weights per NF4 absmax block.
    pub nf4_block_size: usize,
    /// Recompute each decoder block in the backward instead of keeping its activations.
    pub checkpointing: bool,
    /// Run the LM head and the loss a chunk of rows at a time, so that the `[B·T, V]` logits
    /// are never whole (a frozen head: LoRA without an adapter on lm_head, sft).
    pub chunked_loss: bool,
    /// With `chunked_loss`: logits rows a chunk (None: as many as 16 MiB of f32 logits hold,
    /// `model::chunked_loss::default_chunk_rows`).
    pub loss_chunk_rows: Option<usize>,
    /// `eager` (keeps the `[B, H, T, T]` probabilities) or `efficient` (tiled, keeps none).
    pub attention: AttentionKind,
    /// B: rows per micro-batch.
    pub micro_batch: usize,
    /// K: micro-batches per optimizer step.
    #[serde(alias = "accum")]
    pub accumulation: usize,
    /// T: tokens per row.
    pub seq_len: usize,
    /// Pack several samples into each row (positions and attention kept per sample).
    pub pack: bool,
    /// adamw, adamw8bit or sgd.
    pub optimizer: OptimizerKind,
    /// Peak learning rate.
    pub lr: f64,
    /// Weight decay (decoupled for AdamW, coupled for SGD).
    pub weight_decay: f64,
    /// SGD momentum.
    pub momentum: f64,
    /// Linear warm-up steps before the decay.
    pub warmup_steps: u64,
    /// The warm-up as a fraction of the run's steps (wins over `warmup_steps` when set).
    pub warmup_ratio: Option<f64>,
    /// The decay after the warm-up: `constant`, `linear` or `cosine`.
    pub lr_scheduler: ScheduleKind,
    /// Optimizer steps (wins over `epochs`).
    pub steps: Option<u64>,
    /// Passes over the data when `steps` is not given.
    pub epochs: Option<f64>,
    /// Clip the global gradient norm to this (0: no clipping).
    pub max_grad_norm: f64,
    /// Seeds the adapters' initialisation, the data order and dropout.
    pub seed: u64,
    /// Compute precision of the linear layers: f32, or bf16 / f16 mixed precision (f32
    /// parameters and optimizer state; f16 adds dynamic loss scaling).
    pub dtype: ComputeDtype,
    /// cpu, wgpu, cuda (or flex, ndarray).
    pub device: DeviceKind,
    /// On a GPU backend, capture a step as a device graph and replay it (one submission for
    /// the forward's and backward's launches) where the run allows it; false: op by op.
    pub capture: bool,
    /// Keep the optimizer state and an f32 master copy of the trainable weights in host
    /// memory, updating there (GPU devices only: on the CPU it is already host memory).
    pub offload_optimizer: bool,
    /// Save a checkpoint every N optimizer steps (0: only at the end).
    pub save_every: u64,
    /// How many checkpoints to keep (the newest).
    pub keep_checkpoints: usize,
    /// The merged model's weight dtype (`--merge`): f32, f16 or bf16; unset: the base's own
    /// float dtype (f16 for a quantized GGUF).
    pub merge_dtype: Option<WeightDtype>,
    /// The merged model is split into shards of at most this many bytes, with
    /// `model.safetensors.index.json` (`--max-shard-size` takes `5GB`, `500MB`, `2GiB`).
    pub max_shard_bytes: u64,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            model: PathBuf::new(),
            preset: None,
            data: PathBuf::new(),
            data_format: DataFormat::Auto,
            train_on_inputs: false,
            objective: ObjectiveKind::Sft,
            beta: 0.1,
            eval_data: None,
            val_fraction: 0.0,
            eval_every: 50,
            early_stopping: 0,
            sample_prompts: Vec::new(),
            sample_tokens: 48,
            shard: None,
            out: PathBuf::new(),
            tokenizer: None,
            chat_format: None,
            adapter: None,
            lora_r: 16,
            lora_alpha: 32.0,
            lora_dropout: 0.0,
            rslora: false,
            dora: false,
            lora_targets: "all-linear".into(),
            nf4: false,
            double_quant: false,
            nf4_block_size: 64,
            checkpointing: false,
            chunked_loss: false,
            loss_chunk_rows: None,
            attention: AttentionKind::Eager,
            micro_batch: 1,
            accumulation: 1,
            seq_len: 256,
            pack: true,
            optimizer: OptimizerKind::AdamW,
            lr: 2e-4,
            weight_decay: 0.0,
            momentum: 0.9,
            warmup_steps: 5,
            warmup_ratio: None,
            lr_scheduler: ScheduleKind::Cosine,
            steps: None,
            epochs: None,
            max_grad_norm: 1.0,
            seed: 42,
            dtype: ComputeDtype::F32,
            device: DeviceKind::Cpu,
            capture: true,
            offload_optimizer: false,
            save_every: 50,
            keep_checkpoints: 2,
            merge_dtype: None,
            max_shard_bytes: 5_000_000_000,
        }
    }
}

impl TrainConfig {
    /// The LoRA adapters this run trains (None: full fine-tuning).
    pub fn lora_config(&self) -> Result<Option<LoraConfig>> {
        Ok(self.step_settings()?.lora())
    }

    /// What the run trains, in words: the model's path or the preset's name.
    pub fn model_name(&self) -> String {
        match &self.preset {
            Some(name) => format!("{name} (random weights)"),
            None => self.model.display().to_string(),
        }
    }

    /// The NF4 quantization of the base, if asked for.
    pub fn nf4_config(&self) -> Option<Nf4Config> {
        self.nf4.then_some(Nf4Config {
            block_size: self.nf4_block_size,
            double_quant: self.double_quant,
        })
    }

    /// The predictor's scenario of this run for a model of `config`.
    pub fn scenario(&self, config: LlamaConfig) -> Result<Scenario> {
        self.step_settings()?.scenario(config)
    }

    /// The chunked loss's rows a chunk for a vocabulary of `vocab` words (None: the whole
    /// logits at once).
    pub fn loss_chunk_rows(&self, vocab: usize) -> Option<usize> {
        self.chunked_loss.then(|| {
            self.loss_chunk_rows
                .unwrap_or_else(|| default_chunk_rows(vocab))
        })
    }

    /// The step's settings, as the predictor takes them from every front end.
    pub fn step_settings(&self) -> Result<StepSettings> {
        let targets = TargetNames::parse(&self.lora_targets)?;
        Ok(StepSettings {
            micro_batch: self.micro_batch,
            seq_len: self.seq_len,
            objective: self.objective,
            lora_r: self.lora_r,
            lora_alpha: Some(self.lora_alpha),
            lora_dropout: self.lora_dropout,
            rslora: self.rslora,
            dora: self.dora,
            lora_targets: targets.blocks,
            lora_embedding: targets.embedding,
            lora_head: targets.head,
            nf4: self.nf4_config(),
            optimizer: self.optimizer,
            checkpointing: self.checkpointing,
            chunked_loss: self.chunked_loss,
            accumulation: self.accumulation,
            packed: self.pack,
            attention: self.attention,
            half_compute: self.dtype.half().is_some(),
            kernels: if self.device.is_cpu() {
                Kernels::FusedCpu
            } else {
                Kernels::FusedGpu
            },
            rows: self.device.row_layout(),
        })
    }

    /// The autocast precision `dtype` names (None: f32).
    pub fn compute_dtype(&self) -> Result<Option<FloatDType>> {
        Ok(self.dtype.half())
    }

    /// Checks the settings that do not need the model or the data.
    pub fn validate(&self) -> Result<()> {
        let bad = |flag: &str, message: String| Err(Error::config(flag, message));
        match (&self.preset, self.model.as_os_str().is_empty()) {
            (None, true) => {
                return bad(
                    "--model",
                    "a model path (or --preset NAME) is required".into(),
                );
            }
            (Some(_), false) => {
                return bad(
                    "--preset",
                    "give --model or --preset, not both (a preset is a model of random weights)"
                        .into(),
                );
            }
            (Some(name), true) => {
                LlamaConfig::preset(name)?;
                if self.tokenizer.is_none() {
                    return bad(
                        "--tokenizer",
                        format!(
                            "--preset {name} has random weights and no vocabulary: give --tokenizer FILE (a tokenizer.json or a .gguf)"
                        ),
                    );
                }
                if self.adapter.is_some() {
                    return bad(
                        "--adapter",
                        "an adapter trained on real weights means nothing on a random preset"
                            .into(),
                    );
                }
            }
            (None, false) => {}
        }
        if self.data.as_os_str().is_empty() {
            return bad("--data", "a data file is required".into());
        }
        if self.out.as_os_str().is_empty() {
            return bad("--out", "an output folder is required".into());
        }
        if self.micro_batch == 0 || self.accumulation == 0 {
            return bad(
                "--micro-batch/--accumulation",
                format!(
                    "both must be at least 1, found {} and {}",
                    self.micro_batch, self.accumulation
                ),
            );
        }
        if self.seq_len < 2 {
            return bad(
                "--seq-len",
                format!("must be at least 2, found {}", self.seq_len),
            );
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad("--lr", format!("must be positive, found {}", self.lr));
        }
        if self.adapter.is_some() && self.lora_r == 0 {
            return bad(
                "--adapter",
                "continues LoRA training: it cannot be combined with --lora-r 0 (full fine-tuning)"
                    .into(),
            );
        }
        if self.objective.is_preference() {
            if !(self.beta.is_finite() && self.beta > 0.0) {
                return bad("--beta", format!("must be positive, found {}", self.beta));
            }
            if self.objective == ObjectiveKind::Dpo && self.lora_r == 0 {
                return bad(
                    "--objective",
                    "dpo with full fine-tuning needs a frozen copy of every weight as its reference, which napkin does not keep: train LoRA adapters (--lora-r ≥ 1), whose reference is the base with them off"
                        .into(),
                );
            }
            if self.train_on_inputs {
                return bad(
                    "--train-on-inputs",
                    format!(
                        "has no meaning with --objective {}: a preference compares replies",
                        self.objective
                    ),
                );
            }
            if self.data_format != DataFormat::Auto {
                return bad(
                    "--data-format",
                    format!(
                        "--objective {} reads prompt / chosen / rejected records; leave the format to it",
                        self.objective
                    ),
                );
            }
        }
        if self.nf4 && self.lora_r == 0 {
            return bad(
                "--nf4",
                "an NF4 base is frozen: QLoRA needs LoRA adapters (--lora-r ≥ 1)".into(),
            );
        }
        if self.dora && self.lora_r == 0 {
            return bad(
                "--dora",
                "DoRA is a kind of LoRA adapter: give --lora-r ≥ 1".into(),
            );
        }
        self.compute_dtype()?;
        if self.steps == Some(0) {
            return bad("--steps", "must be at least 1".into());
        }
        if let Some(e) = self.epochs
            && !(e.is_finite() && e > 0.0)
        {
            return bad("--epochs", format!("must be positive, found {e}"));
        }
        if !(0.0..1.0).contains(&self.val_fraction) {
            return bad(
                "--val-fraction",
                format!(
                    "must be at least 0 and below 1, found {}",
                    self.val_fraction
                ),
            );
        }
        if self.eval_data.is_some() && self.val_fraction > 0.0 {
            return bad(
                "--eval-data/--val-fraction",
                "give one source of held-out data, not both".into(),
            );
        }
        if let Some(strategy) = self.shard
            && strategy != Strategy::Ddp
        {
            return bad(
                "--shard",
                format!(
                    "training runs ddp only; `napkin estimate --shard {}` predicts {strategy:?}'s memory and communication",
                    strategy.name()
                ),
            );
        }
        if self.early_stopping > 0 && !self.has_eval() {
            return bad(
                "--early-stopping",
                "watches the held-out loss: give --eval-data FILE or --val-fraction F".into(),
            );
        }
        if let Some(r) = self.warmup_ratio
            && !(0.0..1.0).contains(&r)
        {
            return bad(
                "--warmup-ratio",
                format!("must be at least 0 and below 1, found {r}"),
            );
        }
        Ok(())
    }

    /// With `adapter`, takes the adapter's rank, α, targets and scaling rule (rsLoRA or not)
    /// as the run's (the adapter's tensors have those shapes, and were trained under that
    /// scale). Returns what changed, in words, when anything did.
    pub fn adopt_adapter(&mut self) -> Result<Option<String>> {
        let Some(dir) = &self.adapter else {
            return Ok(None);
        };
        let lora = crate::io::peft::read_adapter_config(dir)?;
        let names = lora.target_names();
        let targets = names.peft_names().join(",");
        let before = (
            self.lora_r,
            self.lora_alpha,
            TargetNames::parse(&self.lora_targets).ok(),
            self.rslora,
            self.dora,
        );
        let changed = before
            != (
                lora.r,
                lora.alpha,
                Some(names),
                lora.use_rslora,
                lora.use_dora,
            );
        self.lora_r = lora.r;
        self.lora_alpha = lora.alpha;
        self.lora_targets = targets.clone();
        self.rslora = lora.use_rslora;
        self.dora = lora.use_dora;
        let rule = |rslora: bool, dora: bool| match (rslora, dora) {
            (false, false) => "α/r",
            (true, false) => "α/√r",
            (false, true) => "α/r with DoRA",
            (true, true) => "α/√r with DoRA",
        };
        Ok(changed.then(|| {
            format!(
                "continuing the adapter in {}: its r {}, α {}, targets {}, scale {} replace the run's r {}, α {}, scale {}",
                dir.display(),
                lora.r,
                lora.alpha,
                targets,
                rule(lora.use_rslora, lora.use_dora),
                before.0,
                before.1,
                rule(before.3, before.4)
            )
        }))
    }

    /// Whether the run evaluates on held-out data.
    pub fn has_eval(&self) -> bool {
        self.eval_data.is_some() || self.val_fraction > 0.0
    }

    /// Warm-up steps in a run of `total_steps` (`warmup_ratio` rounded up, as transformers).
    pub fn warmup_for(&self, total_steps: u64) -> u64 {
        match self.warmup_ratio {
            Some(r) => (r * total_steps as f64).ceil() as u64,
            None => self.warmup_steps,
        }
    }
}
