//! `napkin estimate --engine pytorch`: one Hugging Face training step's memory as PyTorch
//! spends it (`predict::pytorch`), for a model napkin knows the shape of.

use anyhow::{Result, bail};
use napkin_core::config::{LlamaConfig, LoraConfig, LoraTarget, ObjectiveKind};
use napkin_core::predict::pytorch::device_process::{self, DeviceProcess, Workspaces};
use napkin_core::predict::pytorch::{
    Attention, Checkpointing, Method, ModuleMode, PyTorchSetup, PyTorchStep, Quant4bit, Stack,
    TorchDevice, TorchDtype, TrlDpo, predict,
};
use napkin_core::predict::units::accelerate_units;
use serde_json::json;

use napkin_core::config::AttentionKind;
use napkin_core::train::ComputeDtype;

use crate::cli::{EstimateArgs, Releases, ScenarioAttention};

pub fn run(args: &EstimateArgs, name: &str, config: &LlamaConfig) -> Result<()> {
    if args.scenario.dora {
        anyhow::bail!(
            "--dora with --engine pytorch: the PyTorch profile replays peft's plain LoRA, not its DoRA layers (napkin's own engine predicts DoRA: drop --engine pytorch)"
        );
    }
    if args.scenario.chunked_loss {
        bail!(
            "--chunked-loss with --engine pytorch: the PyTorch profile replays transformers' loss over the whole logits (napkin's own engine predicts the chunked loss: drop --engine pytorch)"
        );
    }
    match args.scenario.objective {
        ObjectiveKind::Sft | ObjectiveKind::Dpo => {}
        ObjectiveKind::Orpo => anyhow::bail!(
            "--objective orpo with --engine pytorch: the PyTorch profile replays transformers' supervised step and TRL's DPOTrainer, not its ORPOTrainer (napkin's own engine predicts ORPO: drop --engine pytorch)"
        ),
    }
    let p = &args.pytorch;
    if args.scenario.objective != ObjectiveKind::Dpo && (p.precompute_ref || p.prompt_tokens > 0) {
        bail!("--precompute-ref and --prompt-tokens describe TRL's DPO step: give --objective dpo");
    }
    let setup = setup(args)?;
    let step = predict(config, &setup);
    // The caching allocator's segments: a fresh CUDA process that loads the model and runs
    // the step.
    let workspace = args.pytorch.cublas_workspace_mib << 20;
    let process = (setup.device == TorchDevice::Cuda)
        .then(|| device_process::replay(config, &setup, workspace, Workspaces::AtFirstProduct));
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "model": name, "setup": setup, "step": step,
                "peak_allocated": step.peak_allocated(),
                "adamw_state": adamw_state(&step),
                "cuda_process": process.map(|p| json!({
                    "max_reserved": p.max_reserved,
                    "reserved": p.reserved,
                    "max_allocated": p.max_allocated,
                    "cublas_workspace_per_handle": workspace,
                })),
            }))?
        );
        return Ok(());
    }
    print!(
        "{}",
        report(name, &setup, &step, process.map(|p| (p, workspace)))
    );
    Ok(())
}

/// torch.optim.AdamW's two f32 moments per trainable value, allocated at the first step.
fn adamw_state(step: &PyTorchStep) -> u64 {
    // `.grad` has the parameter's dtype; the moments take it too (f32 for peft's adapters).
    2 * step.trainable
}

fn setup(args: &EstimateArgs) -> Result<PyTorchSetup> {
    let (s, p) = (&args.scenario, &args.pytorch);
    if s.micro_batch == 0 || s.seq_len < 2 {
        bail!("--micro-batch must be at least 1 and --seq-len at least 2");
    }
    let half = match args.dtype {
        ComputeDtype::F32 => TorchDtype::F32,
        ComputeDtype::Bf16 => TorchDtype::Bf16,
        ComputeDtype::F16 => TorchDtype::F16,
    };
    let lora = (s.lora_r > 0)
        .then(|| -> Result<LoraConfig> {
            Ok(LoraConfig {
                r: s.lora_r,
                alpha: 2.0 * s.lora_r as f64,
                dropout: p.lora_dropout,
                targets: LoraTarget::parse_list(&s.lora_targets)?,
                ..LoraConfig::default()
            })
        })
        .transpose()?;
    let method = match (s.nf4, lora.is_some()) {
        (false, false) => Method::Full,
        (false, true) => Method::Lora,
        (true, true) => Method::QLora {
            quant: p.quant_type,
            double_quant: s.double_quant,
            block_size: 64,
        },
        (true, false) => bail!("--nf4 with --engine pytorch is QLoRA: give --lora-r too"),
    };
    let dpo = (s.objective == ObjectiveKind::Dpo)
        .then(|| -> Result<TrlDpo> {
            if lora.is_none() {
                bail!(
                    "--objective dpo with --engine pytorch needs --lora-r: the profile replays TRL's DPOTrainer over a peft adapter, whose reference is the base with the adapter disabled (full fine-tuning's reference is a second model, not profiled)"
                );
            }
            if p.prompt_tokens >= s.seq_len {
                bail!(
                    "--prompt-tokens {} leaves no completion in a --seq-len {} sequence",
                    p.prompt_tokens,
                    s.seq_len
                );
            }
            Ok(TrlDpo {
                precompute_ref: p.precompute_ref,
                prompt_tokens: p.prompt_tokens,
            })
        })
        .transpose()?;
    let qlora = matches!(method, Method::QLora { .. });
    let checkpointing = s.checkpointing.then_some(if p.non_reentrant {
        Checkpointing::NonReentrant
    } else {
        Checkpointing::Reentrant
    });
    Ok(PyTorchSetup {
        // A DPO micro-batch of B pairs is 2B rows of T tokens: the chosen, then the rejected.
        batch: if dpo.is_some() {
            2 * s.micro_batch
        } else {
            s.micro_batch
        },
        seq: s.seq_len,
        method,
        lora,
        // prepare_model_for_kbit_training casts every other parameter to f32; the 4-bit
        // products compute in --dtype (bf16 unless f16 is asked for).
        dtype: if qlora && !p.no_kbit_prepare {
            TorchDtype::F32
        } else {
            half
        },
        compute_dtype: if half == TorchDtype::F16 {
            TorchDtype::F16
        } else {
            TorchDtype::Bf16
        },
        mode: p.torch_mode,
        checkpointing,
        input_require_grads: PyTorchSetup::input_hooked(s.lora_r > 0, qlora, checkpointing),
        // Unless told otherwise, what transformers picks for Llama: sdpa.
        attention: match s.attention {
            Some(ScenarioAttention::Napkin(AttentionKind::Eager)) => Attention::Eager,
            Some(ScenarioAttention::Napkin(AttentionKind::Efficient))
            | Some(ScenarioAttention::Sdpa)
            | None => Attention::Sdpa,
        },
        device: p.torch_device,
        stack: match p.torch_releases {
            Releases::Current => Stack::MEASURED,
            Releases::Spring2024 => Stack::SPRING_2024,
        },
        dpo,
    })
}

fn report(
    name: &str,
    setup: &PyTorchSetup,
    step: &PyTorchStep,
    process: Option<(DeviceProcess, u64)>,
) -> String {
    let gb = |b: u64| format!("{:>9.3} GB", b as f64 / 1e9);
    let method = match setup.method {
        Method::Full => "full fine-tuning".to_string(),
        Method::Lora => "LoRA".to_string(),
        Method::QLora {
            quant,
            double_quant,
            ..
        } => format!(
            "QLoRA ({}{}, compute {})",
            match quant {
                Quant4bit::Nf4 => "nf4",
                Quant4bit::Fp4 => "fp4",
            },
            if double_quant { " + double quant" } else { "" },
            match setup.compute_dtype {
                TorchDtype::F32 => "f32",
                TorchDtype::Bf16 => "bf16",
                TorchDtype::F16 => "f16",
            }
        ),
    };
    let adapters = setup.lora.as_ref().map_or(String::new(), |l| {
        let targets: Vec<String> = l.targets.iter().map(|t| t.to_string()).collect();
        let dropout = if setup.adapter_dropout_runs() {
            format!("dropout {}", l.dropout)
        } else if setup.dpo.is_some() {
            "dropout disabled by TRL".to_string()
        } else {
            "dropout off in eval mode".to_string()
        };
        format!(" r {} on {} ({dropout})", l.r, targets.join(","))
    });
    let saved: u64 = step.saved_per_layer.iter().sum::<u64>() + step.saved_outside;
    let largest_layer = step.saved_per_layer.iter().copied().max().unwrap_or(0);
    let mode = match setup.mode {
        ModuleMode::Train => "train",
        ModuleMode::Eval => "eval",
        ModuleMode::AsLoaded => "as loaded",
    };
    let checkpointing = match (setup.checkpointing, setup.active_checkpointing()) {
        (None, _) => "no checkpointing",
        (Some(_), None) => "checkpointing enabled but skipped (eval-mode model)",
        (_, Some(Checkpointing::Reentrant)) => "reentrant checkpointing",
        (_, Some(Checkpointing::NonReentrant)) => "non-reentrant checkpointing",
    };
    let mut out = format!(
        "PyTorch profile of {name}: {method}{adapters}\n  B {} × T {}, {} attention, {}, modules {mode}, {checkpointing}, {} releases\n",
        setup.batch,
        setup.seq,
        match setup.attention {
            Attention::Eager => "eager",
            Attention::Sdpa => "sdpa",
        },
        match setup.device {
            TorchDevice::Cuda => "cuda",
            TorchDevice::Cpu => "cpu",
        },
        setup.stack.name,
    );
    if let Some(dpo) = setup.dpo {
        out += &format!(
            "  TRL DPOTrainer: {} pairs = {} rows (chosen, rejected), fused LM head, {}\n",
            setup.batch / 2,
            setup.batch,
            if dpo.precompute_ref {
                "reference log-probs precomputed".to_string()
            } else {
                "reference forward with the adapter disabled".to_string()
            }
        );
    }
    out += &format!("  weights (+ 4-bit absmax)          {}\n", gb(step.weights));
    out += &format!(
        "  .grad of the trainable values     {}\n",
        gb(step.trainable)
    );
    out += &format!(
        "  saved for the backward            {}  (largest layer {}, outside the layers {})\n",
        gb(saved),
        accelerate_units(largest_layer as f64),
        accelerate_units(step.saved_outside as f64)
    );
    out += &format!(
        "  {:<34}{}  (above the weights)\n",
        if setup.dpo.is_some() {
            "after the forwards (+ loss)"
        } else {
            "after the forward (+ logits)"
        },
        gb(step.alive_after_forward)
    );
    out += &format!(
        "  peak of forward + backward        {}  ({})\n",
        gb(step.peak_allocated()),
        match setup.device {
            TorchDevice::Cuda => "torch.cuda.max_memory_allocated",
            TorchDevice::Cpu => "the CPU allocator's running total, as torch.profiler counts it",
        }
    );
    out += &format!(
        "  + AdamW moments once stepped      {}\n",
        gb(adamw_state(step))
    );
    match process {
        Some((p, workspace)) => {
            out += &format!(
                "  whole process, allocated          {}  (max_memory_allocated: load, cuBLAS, step)\n",
                gb(p.max_allocated)
            );
            out += &format!(
                "  whole process, reserved           {}  (max_memory_reserved: the caching allocator's segments; cuBLAS {} MiB a handle)\n",
                gb(p.max_reserved),
                workspace >> 20
            );
        }
        None => out += "  (allocated bytes; reserved is a CUDA allocator's figure)\n",
    }
    out
}
