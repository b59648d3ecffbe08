//! One module per subcommand.

pub mod bench;
pub mod completions;
pub mod estimate;
pub mod estimate_pytorch;
pub mod eval;
pub mod exercise;
pub mod export;
pub mod generate;
pub mod inspect;
pub mod measure;
pub mod quantize;
pub mod report;
pub mod train;

use std::path::Path;

use anyhow::{Context, Result, bail};
use napkin_core::config::{
    AttentionKind, LlamaConfig, LoraConfig, Nf4Config, OptimizerKind, TargetNames,
};
use napkin_core::device::DeviceKind;
use napkin_core::predict::inventory::Scenario;
use napkin_core::predict::settings::StepSettings;
use napkin_core::train::ComputeDtype;

use crate::cli::{Offload, ScenarioArgs, ScenarioAttention};
use napkin_core::io::gguf::{GgufFile, gguf_config};

/// A model's configuration without reading its weights: GGUF metadata or config.json.
pub fn model_config(path: &Path) -> Result<LlamaConfig> {
    let path = &napkin_core::io::resolve_model_path(path)?;
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        return Ok(gguf_config(&GgufFile::open(path)?)?);
    }
    let file = path.join("config.json");
    LlamaConfig::from_hf_file(&file).with_context(|| format!("reading {}", file.display()))
}

/// `--offload` of `train` and `measure`: whether the optimizer runs offloaded. The engine
/// offloads the optimizer only; parameter offload is predicted (`napkin estimate --offload`).
pub fn offload_optimizer(what: Offload) -> Result<bool> {
    match what {
        Offload::None => Ok(false),
        Offload::Optimizer => Ok(true),
        Offload::Params => bail!(
            "--offload params: napkin's engine offloads the optimizer state only; parameter offload is predicted by `napkin estimate --offload params`"
        ),
    }
}

impl ScenarioArgs {
    /// The step's settings as the flags ask (f32; see [`with_autocast`]).
    pub fn settings(&self, optimizer: OptimizerKind) -> Result<StepSettings> {
        let targets = TargetNames::parse(&self.lora_targets)?;
        Ok(StepSettings {
            micro_batch: self.micro_batch,
            seq_len: self.seq_len,
            objective: self.objective,
            lora_r: self.lora_r,
            dora: self.dora,
            lora_alpha: self.lora_alpha,
            lora_targets: targets.blocks,
            lora_embedding: targets.embedding,
            lora_head: targets.head,
            nf4: self.nf4(),
            optimizer,
            checkpointing: self.checkpointing,
            chunked_loss: self.chunked_loss,
            accumulation: self.accumulation,
            attention: match self.attention {
                None => AttentionKind::Eager,
                Some(ScenarioAttention::Napkin(kind)) => kind,
                Some(ScenarioAttention::Sdpa) => bail!(
                    "--attention sdpa is PyTorch's (--engine pytorch); napkin's engine runs eager or efficient"
                ),
            },
            kernels: self.kernels,
            rows: self.rows,
            ..StepSettings::default()
        })
    }

    /// LoRA on the linears of `--lora-targets`, as the flags ask (None: full fine-tuning; α
    /// defaults to 2r).
    pub fn lora(&self) -> Result<Option<LoraConfig>> {
        Ok(self.settings(OptimizerKind::AdamW)?.lora())
    }

    /// NF4 as the flags ask.
    pub fn nf4(&self) -> Option<Nf4Config> {
        self.nf4.then_some(Nf4Config {
            block_size: self.nf4_block_size,
            double_quant: self.double_quant,
        })
    }

    /// The predictor's scenario for a model of `config` (f32; see [`with_autocast`]).
    pub fn scenario(&self, config: LlamaConfig, optimizer: OptimizerKind) -> Result<Scenario> {
        Ok(self.settings(optimizer)?.scenario(config)?)
    }
}

/// Whether `--dtype` asks for 16-bit autocast on `kind` (f32, or bf16/f16 where the backend
/// computes in 16 bits).
pub fn half_precision_on(dtype: ComputeDtype, kind: DeviceKind) -> Result<bool> {
    if dtype == ComputeDtype::F32 {
        return Ok(false);
    }
    if !kind.supports_half_precision() {
        bail!(
            "--dtype {dtype}: {} computes in f32 only; use --device flex, wgpu or cuda",
            kind.backend_name()
        );
    }
    Ok(true)
}

/// `s` trained under bf16/f16 autocast when `half`, as `napkin train --dtype` runs it: the linear
/// layers compute in 16 bits, and a LoRA run stores its frozen dense base in 16 bits.
pub fn with_autocast(s: Scenario, half: bool) -> Scenario {
    Scenario {
        half_compute: half,
        ..s
    }
}

/// Bytes over the host link in words: up in all (by kind), and read back.
pub fn link_summary(l: &napkin_core::device::link::LinkBytes) -> String {
    use napkin_core::predict::units::accelerate_units as units;
    format!(
        "up {} (weights {}, data {}, optimizer {}), read back {}",
        units(l.up() as f64),
        units(l.weights_up as f64),
        units(l.data_up as f64),
        units(l.optimizer_up as f64),
        units(l.read_back as f64)
    )
}

/// Runs `work` under a spinner with the elapsed time (a line before and after without a
/// terminal), so a long load does not look like a hang.
pub fn working<T>(what: &str, plain: bool, work: impl FnOnce() -> T) -> T {
    let start = std::time::Instant::now();
    if plain {
        eprintln!("{what}...");
        let out = work();
        eprintln!("  done in {:.1} s", start.elapsed().as_secs_f64());
        return out;
    }
    let spinner = indicatif::ProgressBar::new_spinner();
    spinner.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    spinner.set_message(what.to_string());
    spinner.enable_steady_tick(std::time::Duration::from_millis(200));
    let out = work();
    spinner.finish_and_clear();
    eprintln!("{what}: {:.1} s", start.elapsed().as_secs_f64());
    out
}

/// The model at `path`, with the LoRA adapter in `adapter` when given. A `napkin train` output
/// folder (its `run_config.toml` beside the adapter) brings the NF4 settings the base was
/// trained with, so a QLoRA adapter meets the same quantized base.
/// The NF4 base an adapter folder's run trained on (`run_config.toml`), if any.
pub fn trained_nf4_base(dir: &Path) -> Result<Option<napkin_core::config::Nf4Config>> {
    let run_config = dir.join("run_config.toml");
    Ok(match std::fs::read_to_string(&run_config) {
        Ok(text) => toml::from_str::<napkin_core::train::TrainConfig>(&text)
            .with_context(|| format!("{}: not a run configuration", run_config.display()))?
            .nf4_config(),
        Err(_) => None,
    })
}

pub fn load_with_adapter(
    path: &Path,
    adapter: Option<&Path>,
    device: &burn::tensor::Device,
) -> Result<napkin_core::model::Llama> {
    let Some(dir) = adapter else {
        return Ok(napkin_core::io::load_model(path, device)?);
    };
    let nf4 = trained_nf4_base(dir)?;
    let model = napkin_core::io::load_model_with(path, device, nf4.as_ref())?;
    let (model, lora) = model
        .load_lora(dir)
        .with_context(|| format!("loading the adapter in {}", dir.display()))?;
    eprintln!(
        "adapter {}: r {}, α {}, {} target(s){}{}",
        dir.display(),
        lora.r,
        lora.alpha,
        lora.targets.len(),
        if lora.use_dora { ", DoRA" } else { "" },
        match &nf4 {
            Some(n) => format!(
                ", on an NF4 base (block {}{}) as trained",
                n.block_size,
                if n.double_quant {
                    ", double quantization"
                } else {
                    ""
                }
            ),
            None => String::new(),
        }
    );
    Ok(model)
}

/// `--max-shard-size`: a byte size with a unit (`5GB`, `500MB`, `2GiB`), more than zero.
pub fn shard_bytes(text: &str) -> Result<u64> {
    use napkin_core::exercises::{Dimension, answer::parse_quantity};
    let bytes = parse_quantity(text, Dimension::Bytes)
        .map_err(|e| anyhow::anyhow!("--max-shard-size: {e}"))?
        .value as u64;
    if bytes == 0 {
        bail!("--max-shard-size: must be more than 0 bytes");
    }
    Ok(bytes)
}
