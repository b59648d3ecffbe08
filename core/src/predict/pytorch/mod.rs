//! The predictor's PyTorch profile: the memory of one Hugging Face training step as PyTorch
//! spends it, for learners who come from `transformers` + `peft` + `bitsandbytes` on a GPU.
//!
//! napkin's own inventory (`predict::inventory`) replays napkin's engine; this one replays
//! PyTorch's: what autograd saves for `LlamaForCausalLM` (eager or sdpa attention), peft's LoRA
//! (dropout included), bitsandbytes' `Linear4bit` (nf4 or fp4, its compute dtype, and what
//! `MatMul4Bit` keeps in the release you run), HF gradient checkpointing (reentrant or not; HF
//! skips it in eval mode), `prepare_model_for_kbit_training` (which casts the other parameters
//! to f32), and the order the backward allocates and frees in. The figures are checked
//! against PyTorch measured on the CPU (`tests/corpus/pytorch_profile`).
//!
//! - `tape`: autograd's saving and freeing rules, op by op, and the backward walk.
//! - `llama`: the HF forward written onto the tape.
//! - `trl_dpo`: TRL's `DPOTrainer` step on the same tape: its fused LM head, the reference
//!   forward with the adapter disabled, the DPO loss.
//! - `caching_allocator`: the CUDA caching allocator's segments and rounding (reserved bytes).

pub mod allocation_order;
pub mod caching_allocator;
pub mod device_process;
pub mod llama;
pub mod loading;
pub mod tape;
pub mod trl_dpo;

use serde::Serialize;

use crate::config::{LlamaConfig, LoraConfig, LoraTarget, spellings};

/// Where the step runs (the kernels differ in what they save).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum TorchDevice {
    /// The CPU (flash attention for the CPU; dropout keeps a mask of the input's dtype).
    Cpu,
    /// CUDA (flash or memory-efficient attention; dropout keeps a one-byte mask).
    Cuda,
}

spellings! {
    TorchDevice, "torch device", "torch_device";
    Cpu => "cpu" []: "the CPU (flash attention for the CPU; dropout keeps a mask of the input's dtype)",
    Cuda => "cuda" []: "CUDA (flash or memory-efficient attention; dropout keeps a one-byte mask)",
}

/// A torch dtype of the hidden states or of the 4-bit compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum TorchDtype {
    /// `torch.float32`.
    F32,
    /// `torch.bfloat16`.
    Bf16,
    /// `torch.float16`.
    F16,
}

impl TorchDtype {
    /// Bytes per value.
    pub fn bytes(self) -> u64 {
        match self {
            TorchDtype::F32 => 4,
            TorchDtype::Bf16 | TorchDtype::F16 => 2,
        }
    }
}

/// `attn_implementation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Attention {
    /// `eager`: the scores and probabilities are tensors; softmax keeps `[B, H, T, T]` in f32.
    Eager,
    /// `sdpa`: `scaled_dot_product_attention`, one fused kernel.
    Sdpa,
}

/// HF gradient checkpointing (`gradient_checkpointing_kwargs={"use_reentrant": …}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Checkpointing {
    /// `use_reentrant=True` (HF's default): the layer runs under `no_grad`; its output needs a
    /// gradient only if its input does.
    Reentrant,
    /// `use_reentrant=False`.
    NonReentrant,
}

/// The 4-bit data type of bitsandbytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Quant4bit {
    /// NormalFloat4.
    Nf4,
    /// bitsandbytes' 4-bit float, its default `bnb_4bit_quant_type`.
    Fp4,
}

spellings! {
    Quant4bit, "4-bit type", "quant_type";
    Nf4 => "nf4" []: "NormalFloat4",
    Fp4 => "fp4" []: "bitsandbytes' 4-bit float, its default bnb_4bit_quant_type",
}

/// What the step trains.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Method {
    /// Every parameter.
    Full,
    /// peft LoRA adapters over a frozen model.
    Lora,
    /// LoRA over bitsandbytes 4-bit block linears (`load_in_4bit`).
    QLora {
        /// nf4 or fp4.
        quant: Quant4bit,
        /// `bnb_4bit_use_double_quant`: 8-bit absmax with f32 scales per 256.
        double_quant: bool,
        /// bitsandbytes' block size (64).
        block_size: u64,
    },
}

/// Which modules are in training mode (`nn.Module.training`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ModuleMode {
    /// `model.train()`: dropout and checkpointing run.
    Train,
    /// `model.eval()`: neither runs.
    Eval,
    /// As `from_pretrained` and `get_peft_model` leave it without a `train()` call: the model
    /// in eval mode (HF skips checkpointing), the adapters peft added in train mode (their
    /// dropout runs).
    AsLoaded,
}

spellings! {
    ModuleMode, "module mode", "torch_mode";
    Train => "train" []: "model.train(): dropout and checkpointing run",
    Eval => "eval" []: "model.eval(): neither runs",
    AsLoaded => "as-loaded" ["as_loaded"]: "no train() call: the model in from_pretrained's eval mode (HF skips checkpointing), the new adapters in train mode",
}

/// Behaviours that changed between releases of the stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Stack {
    /// What the CLI calls these releases.
    pub name: &'static str,
    /// bitsandbytes before 0.43.2 kept each `Linear4bit`'s cast input on the autograd context
    /// (fixed by "fix QLoRA mem bug: delete useless buffered activation", July 2024).
    pub bnb_keeps_input: bool,
    /// transformers before the sdpa path passed `enable_gqa` copied k and v to every head
    /// (`repeat_kv`) before `scaled_dot_product_attention`.
    pub sdpa_repeats_kv: bool,
    /// transformers before `ForCausalLMLoss` (4.46) shifted the logits with
    /// `logits[..., :-1, :].contiguous()`: a copy, whose slice's backward writes a full-size
    /// gradient.
    pub loss_copies_shifted_logits: bool,
    /// transformers since 2025 takes and frees one block the size of a `device_map` load
    /// before it (`caching_allocator_warmup`), so the weights share one segment.
    pub allocator_warmup: bool,
    /// peft since 2025 ends `prepare_model_for_kbit_training` with `empty_cache()`.
    pub kbit_prepare_empties_cache: bool,
    /// transformers 4's bitsandbytes quantizer loaded a model in f16 when no dtype was given
    /// ("Overriding torch_dtype=None with torch_dtype=torch.float16"), and
    /// `prepare_model_for_kbit_training` then cast its other parameters to f32.
    pub bnb_loads_in_f16: bool,
}

impl Stack {
    /// Today's releases, as the fixtures were measured with them: the CPU cases with torch
    /// 2.15, transformers 5.23, peft 0.21.2 and bitsandbytes 0.50.2 (`measured.json`), the CUDA
    /// cases with torch 2.11, transformers 5.17, peft 0.21.0 and bitsandbytes 0.50.2
    /// (`measured-cuda.json`, an H200). The profile's tests hold both corpora with this one
    /// stack.
    pub const MEASURED: Stack = Stack {
        name: "current",
        bnb_keeps_input: false,
        sdpa_repeats_kv: false,
        loss_copies_shifted_logits: false,
        allocator_warmup: true,
        kbit_prepare_empties_cache: true,
        bnb_loads_in_f16: false,
    };
    /// Spring 2024 (transformers 4.40, bitsandbytes 0.43.1): the seeds' releases.
    pub const SPRING_2024: Stack = Stack {
        name: "spring-2024",
        bnb_keeps_input: true,
        sdpa_repeats_kv: true,
        loss_copies_shifted_logits: true,
        allocator_warmup: false,
        kbit_prepare_empties_cache: false,
        bnb_loads_in_f16: true,
    };
}

/// One training step as a PyTorch user sets it up.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PyTorchSetup {
    /// B.
    pub batch: usize,
    /// T.
    pub seq: usize,
    /// Full, LoRA or QLoRA.
    pub method: Method,
    /// The adapters (LoRA and QLoRA).
    pub lora: Option<LoraConfig>,
    /// The dtype of the hidden states and the non-quantized weights (f32 after
    /// `prepare_model_for_kbit_training`).
    pub dtype: TorchDtype,
    /// `bnb_4bit_compute_dtype`.
    pub compute_dtype: TorchDtype,
    /// Which modules are in training mode.
    pub mode: ModuleMode,
    /// Gradient checkpointing, when enabled.
    pub checkpointing: Option<Checkpointing>,
    /// `enable_input_require_grads`: the embedding output is made to need a gradient.
    pub input_require_grads: bool,
    /// The attention implementation.
    pub attention: Attention,
    /// CPU or CUDA.
    pub device: TorchDevice,
    /// The releases' behaviours.
    pub stack: Stack,
    /// TRL's `DPOTrainer` step instead of the causal-LM step (`batch` then counts rows: the
    /// chosen and the rejected sequence of each pair).
    pub dpo: Option<TrlDpo>,
}

/// One step of TRL's `DPOTrainer` (`_compute_loss` and its backward) over a peft adapter, as
/// TRL 1.16 runs it without autocast (`bf16=False`): the policy forward through TRL's fused LM
/// head (per-token log-probabilities in tiles, never the `[N, V]` logits), the reference
/// forward under `no_grad` with the adapter disabled, the sigmoid loss. TRL's defaults apply:
/// dropout disabled in the model (`disable_dropout`), a quantized model's adapters cast to
/// bf16.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TrlDpo {
    /// `precompute_ref_log_probs`: the batch brings the reference's log-probabilities, so the
    /// step runs no reference forward.
    pub precompute_ref: bool,
    /// Positions of each row that are prompt (`completion_mask` 0). On CUDA the fused head
    /// scores only the completion's positions; the CPU's scores every position.
    pub prompt_tokens: usize,
}

impl PyTorchSetup {
    /// peft's default LoRA targets for a Llama: `q_proj` and `v_proj`.
    pub fn peft_default_targets() -> Vec<LoraTarget> {
        vec![LoraTarget::QProj, LoraTarget::VProj]
    }

    /// Whether the embedding output is hooked to need a gradient (`enable_input_require_grads`)
    /// for adapters trained under `checkpointing`: for QLoRA, peft's
    /// `prepare_model_for_kbit_training` does for reentrant checkpointing only (the rerun would
    /// otherwise see no input that needs a gradient); for LoRA, HF does whenever a peft model
    /// checkpoints.
    pub fn input_hooked(adapters: bool, qlora: bool, checkpointing: Option<Checkpointing>) -> bool {
        adapters
            && match checkpointing {
                Some(Checkpointing::Reentrant) => true,
                Some(Checkpointing::NonReentrant) => !qlora,
                None => false,
            }
    }

    /// QLoRA as `prepare_model_for_kbit_training(model, use_gradient_checkpointing=…)` leaves
    /// it: the other parameters in f32, checkpointing enabled (HF's reentrant default) and the
    /// embedding output hooked to need a gradient when `checkpointing` is on.
    pub fn qlora_prepared(
        batch: usize,
        seq: usize,
        quant: Quant4bit,
        lora: LoraConfig,
        checkpointing: bool,
    ) -> Self {
        PyTorchSetup {
            batch,
            seq,
            method: Method::QLora {
                quant,
                double_quant: false,
                block_size: 64,
            },
            lora: Some(lora),
            dtype: TorchDtype::F32,
            compute_dtype: TorchDtype::Bf16,
            mode: ModuleMode::Train,
            checkpointing: checkpointing.then_some(Checkpointing::Reentrant),
            input_require_grads: Self::input_hooked(
                true,
                true,
                checkpointing.then_some(Checkpointing::Reentrant),
            ),
            attention: Attention::Sdpa,
            device: TorchDevice::Cuda,
            stack: Stack::MEASURED,
            dpo: None,
        }
    }

    /// Whether the model went through `prepare_model_for_kbit_training` (QLoRA whose other
    /// parameters it cast to f32).
    pub fn kbit_prepared(&self) -> bool {
        matches!(self.method, Method::QLora { .. }) && self.dtype == TorchDtype::F32
    }

    /// Checkpointing as it runs: HF only checkpoints a decoder in training mode.
    pub fn active_checkpointing(&self) -> Option<Checkpointing> {
        self.checkpointing
            .filter(|_| matches!(self.mode, ModuleMode::Train))
    }

    /// Whether the adapters' dropout runs (TRL's `DPOTrainer` disables it by default).
    pub fn adapter_dropout_runs(&self) -> bool {
        matches!(self.mode, ModuleMode::Train | ModuleMode::AsLoaded) && self.dpo.is_none()
    }

    /// Bytes of one adapter value: peft keeps adapters in f32; TRL's `DPOTrainer` casts a
    /// quantized model's to bf16 (QLoRA's recipe).
    pub fn adapter_bytes(&self) -> u64 {
        match (self.dpo, self.method) {
            (Some(_), Method::QLora { .. }) => 2,
            _ => 4,
        }
    }
}

/// The profile's figures for one step, in bytes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PyTorchStep {
    /// Parameters and buffers (4-bit codes, their absmax and second-level scales included).
    pub weights: u64,
    /// The trainable parameters (each gets a `.grad` of the same size).
    pub trainable: u64,
    /// Saved tensors per decoder layer (a tensor shared by layers counts in the first).
    pub saved_per_layer: Vec<u64>,
    /// Saved tensors outside the layers (embedding, final norm, head, loss).
    pub saved_outside: u64,
    /// What the forward leaves allocated above the weights: saved tensors, logits and loss.
    pub alive_after_forward: u64,
    /// The highest allocation of forward and backward above the weights.
    pub peak_above_weights: u64,
}

impl PyTorchStep {
    /// `torch.cuda.max_memory_allocated()` after the step, from an empty device: weights plus
    /// the peak above them.
    pub fn peak_allocated(&self) -> u64 {
        self.weights + self.peak_above_weights
    }
}

/// Replays one step of `config` under `setup`.
pub fn predict(config: &LlamaConfig, setup: &PyTorchSetup) -> PyTorchStep {
    let recorded = llama::record(config, setup);
    let per = recorded.tape.saved_per_layer();
    let saved_per_layer = (0..config.num_hidden_layers)
        .map(|l| per.get(&Some(l)).copied().unwrap_or(0))
        .collect();
    let (weights, trainable) = parameter_bytes(config, setup);
    PyTorchStep {
        weights,
        trainable,
        saved_per_layer,
        saved_outside: per.get(&None).copied().unwrap_or(0),
        alive_after_forward: recorded.tape.alive_after_forward(),
        peak_above_weights: recorded
            .tape
            .forward_peak()
            .max(recorded.tape.backward_peak(recorded.loss)),
    }
}

/// (weights, trainable) in bytes.
fn parameter_bytes(config: &LlamaConfig, setup: &PyTorchSetup) -> (u64, u64) {
    let w = setup.dtype.bytes();
    let d = config.hidden_size as u64;
    let layers = config.num_hidden_layers as u64;
    let embedding = config.embedding_parameters() + config.lm_head_parameters();
    let norms = (2 * layers + 1) * d;
    // The rotary `inv_freq` and its original copy: d/2 f32 values each.
    let buffers = config.head_dim as u64 * 4;
    let linear_shapes = config
        .block_linears()
        .map(|(_, out, inp)| (out * inp) as u64);
    let linears = layers * linear_shapes.iter().sum::<u64>();
    let adapters = setup.lora.as_ref().map_or(0, |lora| {
        layers * lora_parameters(config, lora) * setup.adapter_bytes()
    });
    let dense = (embedding + norms) * w + buffers;
    let (linear_bytes, trainable) = match setup.method {
        Method::Full => (linears * w, (embedding + norms + linears) * w),
        Method::Lora => (linears * w, adapters),
        Method::QLora {
            double_quant,
            block_size,
            ..
        } => {
            // Each weight is quantized on its own.
            let blocks = layers
                * linear_shapes
                    .iter()
                    .map(|v| v.div_ceil(block_size))
                    .sum::<u64>();
            // Codes two to a byte; absmax f32 per block, or one byte per block plus an f32
            // scale per 256 blocks with double quantization (and a 256-entry f32 code book).
            let absmax = if double_quant {
                blocks + blocks.div_ceil(256) * 4
            } else {
                blocks * 4
            };
            (linears.div_ceil(2) + absmax, adapters)
        }
    };
    (dense + linear_bytes + adapters, trainable)
}

/// LoRA parameters of one layer.
fn lora_parameters(config: &LlamaConfig, lora: &LoraConfig) -> u64 {
    config
        .block_linears()
        .iter()
        .zip(LoraTarget::ALL)
        .filter(|(_, target)| lora.targets.contains(target))
        .map(|(&(_, fan_out, fan_in), _)| (lora.r * (fan_in + fan_out)) as u64)
        .sum()
}
