//! What [`Trainer::new`](super::Trainer::new) does, phase by phase: refuse a device that cannot
//! run the settings, build the model with its tricks, make the optimizer, start or resume the
//! run's progress, and lay out the learning-rate schedule.

use std::path::PathBuf;

use burn::tensor::{Device, FloatDType};

use super::AdamWConfig;
use super::checkpoint::TrainerState;
use super::config::TrainConfig;
use super::data::Stream;
use super::eval::EvalState;
use super::optimizer::{Optimizer, OptimizerConfig};
use super::schedule::LrSchedule;
use crate::config::{LlamaConfig, LoraConfig};
use crate::device::DeviceKind;
use crate::error::{Error, Result};
use crate::io::load_model_with;
use crate::model::Llama;
use crate::tokenizer::TextTokenizer;

/// Refuses a device that cannot run the settings: 16-bit compute on an f32-only backend, or
/// optimizer offload where the device's memory is host memory already.
pub(super) fn check_device(config: &TrainConfig, compute: Option<FloatDType>) -> Result<()> {
    let kind = config.device;
    if compute.is_some() && !kind.supports_half_precision() {
        return Err(Error::config(
            "--dtype",
            format!(
                "{} on `{}` ({}): that backend computes in f32 only; use --device flex (CPU), wgpu or cuda, or --dtype f32",
                config.dtype,
                config.device,
                kind.backend_name()
            ),
        ));
    }
    if compute == Some(FloatDType::BF16) && kind == DeviceKind::Wgpu {
        // cubecl's wgpu backend compiles its kernels to WGSL, which has no bf16 type: the
        // first bf16 kernel would panic in the shader compiler.
        return Err(Error::config(
            "--dtype",
            format!(
                "bf16 on `{}` ({}): WGSL, the shading language wgpu's kernels are compiled to, \
                 has no bf16 type; use --dtype f16 there (with loss scaling), or bf16 on cuda",
                config.device,
                kind.backend_name()
            ),
        ));
    }
    if config.offload_optimizer && kind.is_cpu() {
        return Err(Error::config(
            "--offload",
            format!(
                "`{}` ({}) computes in host memory already: offloading the optimizer state would only copy it from one heap to another; use --device wgpu or cuda, or see the prediction with `napkin estimate --offload optimizer`",
                config.device,
                kind.backend_name()
            ),
        ));
    }
    Ok(())
}

/// The model with its tricks: the base (NF4 quantized as it is read), the LoRA adapters (new,
/// from `--adapter`, or from the checkpoint resumed) and, under 16-bit compute with LoRA, the
/// frozen base stored in that dtype. Resuming full fine-tuning starts from the saved weights.
pub(super) fn model_with_tricks(
    config: &TrainConfig,
    device: &Device,
    compute: Option<FloatDType>,
    found: Option<&(PathBuf, TrainerState)>,
) -> Result<(Llama, Option<LoraConfig>)> {
    device.seed(config.seed);
    let full_resume = found.filter(|_| config.lora_r == 0);
    // With NF4 each block linear is quantized as it is read (or made): the float base never
    // exists whole (QLoRA's load peak stays near the NF4 size).
    let nf4 = config.nf4_config();
    let mut model = match (&config.preset, full_resume) {
        // A preset's random base, seeded: a resumed LoRA run makes the same one again.
        (Some(name), None) => {
            let preset = LlamaConfig::preset(name)?;
            match &nf4 {
                Some(nf4) => Llama::init_nf4(&preset, device, nf4)?,
                None => Llama::init(&preset, device),
            }
        }
        (_, Some((dir, _))) => load_model_with(dir, device, nf4.as_ref())?,
        (None, None) => load_model_with(&config.model, device, nf4.as_ref())?,
    };
    model.attention = config.attention;
    let lora = config.lora_config()?;
    if let Some(lora) = &lora {
        model = match (found, &config.adapter) {
            (Some((dir, _)), _) => model.load_lora(dir)?.0,
            (None, Some(adapter)) => model.load_lora(adapter)?.0,
            (None, None) => model.with_lora(lora)?,
        };
    }
    // Mixed precision with LoRA: the frozen base is stored in the compute precision.
    if let (Some(dtype), Some(_)) = (compute, &lora) {
        model = model.cast_frozen_base(dtype);
    }
    Ok((model, lora))
}

/// A preset's random embedding must hold every id the tokenizer gives (a real checkpoint and
/// its own tokenizer agree already). Checked before the model is made.
pub(super) fn check_vocabulary(config: &TrainConfig, tokenizer: &TextTokenizer) -> Result<()> {
    let Some(name) = &config.preset else {
        return Ok(());
    };
    let (tokens, rows) = (
        tokenizer.vocab_size(),
        LlamaConfig::preset(name)?.vocab_size,
    );
    if tokens > rows {
        let holding: Vec<&str> = LlamaConfig::presets()
            .into_iter()
            .filter(|(_, c)| c.vocab_size >= tokens)
            .map(|(n, _)| n)
            .collect();
        return Err(Error::config(
            "--tokenizer",
            format!(
                "the tokenizer has {tokens} tokens but --preset {name} embeds {rows}; {}",
                if holding.is_empty() {
                    "no preset's vocabulary holds it".to_string()
                } else {
                    format!("presets whose vocabulary holds it: {}", holding.join(", "))
                }
            ),
        ));
    }
    Ok(())
}

/// Every token id of the data must have a row in the model's embedding: a `--tokenizer` that
/// is not the checkpoint's can give ids past it.
pub(super) fn check_ids_fit(
    config: &TrainConfig,
    largest_id: Option<u32>,
    vocab_size: usize,
) -> Result<()> {
    match largest_id {
        Some(id) if id as usize >= vocab_size => Err(Error::config(
            if config.tokenizer.is_some() {
                "--tokenizer"
            } else {
                "--data"
            },
            format!(
                "the data tokenizes to id {id}, but the model embeds {vocab_size} tokens (ids \
                 0 to {}): use the checkpoint's own tokenizer",
                vocab_size - 1
            ),
        )),
        _ => Ok(()),
    }
}

/// The optimizer the settings name, in device memory or offloaded to the host.
pub(super) fn optimizer_for(config: &TrainConfig) -> Optimizer {
    let optimizer_config = OptimizerConfig {
        kind: config.optimizer,
        adamw: AdamWConfig {
            weight_decay: config.weight_decay,
            ..AdamWConfig::default()
        },
        momentum: config.momentum,
    };
    if config.offload_optimizer {
        Optimizer::offloaded(&optimizer_config, crate::device::cpu())
    } else {
        Optimizer::new(&optimizer_config)
    }
}

/// Where a run stands: a new one, or what a checkpoint saved.
pub(super) struct Progress {
    pub(super) step: u64,
    pub(super) eval: EvalState,
    pub(super) loss_scale: f64,
    pub(super) good_steps: u64,
}

impl Progress {
    /// Step 0; f16 starts its loss scale at 2^16 (torch's `GradScaler`).
    pub(super) fn start(compute: Option<FloatDType>) -> Self {
        Progress {
            step: 0,
            eval: EvalState::default(),
            loss_scale: if compute == Some(FloatDType::F16) {
                65_536.0
            } else {
                1.0
            },
            good_steps: 0,
        }
    }
}

/// The learning-rate schedule over the run's steps (`--steps`, or the epochs' batches).
pub(super) fn schedule_for(config: &TrainConfig, loader: &Stream, ranks: usize) -> LrSchedule {
    let total_steps = config.steps.unwrap_or_else(|| {
        let epochs = config.epochs.unwrap_or(1.0);
        let per_epoch = loader
            .batches_per_epoch()
            .div_ceil(config.accumulation * ranks.max(1)) as f64;
        (epochs * per_epoch).ceil().max(1.0) as u64
    });
    LrSchedule {
        kind: config.lr_scheduler,
        peak: config.lr,
        warmup_steps: config
            .warmup_for(total_steps)
            .min(total_steps.saturating_sub(1)),
        total_steps,
    }
}

/// Refuses to resume a checkpoint written with settings that change the meaning of its state.
pub(super) fn check_same_run(now: &TrainConfig, saved: &TrainConfig) -> Result<()> {
    let key = |c: &TrainConfig| {
        (
            (c.model.clone(), c.preset.clone()),
            (c.lora_r, c.dora),
            c.lora_targets.clone(),
            c.nf4,
            c.optimizer,
            c.micro_batch,
            c.accumulation,
            c.seq_len,
            c.pack,
            c.seed,
            c.dtype,
            (
                c.data_format,
                c.train_on_inputs,
                c.val_fraction.to_bits(),
                c.objective,
                c.beta.to_bits(),
            ),
        )
    };
    if key(now) != key(saved) {
        return Err(Error::config(
            "--resume",
            format!(
                "the checkpoint in {} was written by a run with other settings (model, LoRA, DoRA, NF4, optimizer, batch, sequence length, packing, seed, dtype, data format, train-on-inputs, held-out fraction, objective or beta); use another --out or the same settings",
                now.out.display()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod device_checks {
    use super::check_device;
    use crate::device::DeviceKind;
    use crate::train::{ComputeDtype, TrainConfig};

    /// bf16 on wgpu is refused by name before any kernel is compiled (it panicked in cubecl's
    /// WGSL compiler: `UnsupportedType("cube.bf16")`); f16 there and bf16 on CUDA pass.
    #[test]
    fn bf16_on_wgpu_is_refused_with_the_flag() {
        let check = |device, dtype| {
            let config = TrainConfig {
                device,
                dtype,
                ..TrainConfig::default()
            };
            check_device(&config, config.compute_dtype().expect("a dtype"))
        };
        let refused = check(DeviceKind::Wgpu, ComputeDtype::Bf16).expect_err("refused");
        let text = refused.to_string();
        assert!(text.contains("--dtype") && text.contains("bf16") && text.contains("f16"));
        assert!(check(DeviceKind::Wgpu, ComputeDtype::F16).is_ok());
        assert!(check(DeviceKind::Cuda, ComputeDtype::Bf16).is_ok());
    }
}
