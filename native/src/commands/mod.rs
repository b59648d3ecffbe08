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
use napkin_core::config::{LlamaConfig, LoraConfig, LoraTarget, Nf4Config, OptimizerKind};
use napkin_core::predict::inventory::Scenario;

use crate::cli::ScenarioArgs;
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
pub fn offload_optimizer(what: &str) -> Result<bool> {
    match what.to_ascii_lowercase().as_str() {
        "none" => Ok(false),
        "optimizer" => Ok(true),
        "params" | "parameters" | "params,optimizer" => bail!(
            "--offload {what}: napkin's engine offloads the optimizer state only; parameter offload is predicted by `napkin estimate --offload params`"
        ),
        _ => bail!("--offload {what}: expected `optimizer` or `none`"),
    }
}

impl ScenarioArgs {
    /// LoRA on the linears of `--lora-targets`, as the flags ask (None: full fine-tuning; α
    /// defaults to 2r).
    pub fn lora(&self) -> Result<Option<LoraConfig>> {
        if self.lora_r == 0 {
            return Ok(None);
        }
        let targets = LoraTarget::parse_list(&self.lora_targets)?;
        Ok(Some(LoraConfig {
            r: self.lora_r,
            alpha: self.lora_alpha.unwrap_or(2.0 * self.lora_r as f64),
            targets,
            ..LoraConfig::default()
        }))
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
        if self.micro_batch == 0 || self.seq_len < 2 {
            bail!("--micro-batch must be at least 1 and --seq-len at least 2");
        }
        if self.nf4().is_some_and(|nf4| nf4.validate().is_err()) {
            bail!(
                "--nf4-block-size {}: expected an even number from 2 to 2^20",
                self.nf4_block_size
            );
        }
        Ok(Scenario {
            lora: self.lora()?,
            nf4: self.nf4(),
            optimizer,
            checkpointing: self.checkpointing,
            accumulation: self.accumulation.max(1),
            attention: self
                .attention
                .as_deref()
                .unwrap_or("eager")
                .parse()
                .context("--attention")?,
            kernels: self.kernels.parse().context("--kernels")?,
            rows: self.rows.parse().context("--rows")?,
            ..Scenario::new(config, self.micro_batch, self.seq_len)
        })
    }
}

/// Whether `--dtype` asks for 16-bit autocast on `kind` (f32, or bf16/f16 where the backend
/// computes in 16 bits).
pub fn half_precision_on(
    dtype: &str,
    kind: napkin_core::device::DeviceKind,
) -> anyhow::Result<bool> {
    match dtype {
        "f32" | "fp32" | "float32" => Ok(false),
        "bf16" | "f16" | "fp16" | "bfloat16" | "float16" => {
            if !kind.supports_half_precision() {
                anyhow::bail!(
                    "--dtype {dtype}: {} computes in f32 only; use --device flex, wgpu or cuda",
                    kind.backend_name()
                );
            }
            Ok(true)
        }
        other => anyhow::bail!("--dtype `{other}`: expected f32, bf16 or f16"),
    }
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
        "adapter {}: r {}, α {}, {} target(s){}",
        dir.display(),
        lora.r,
        lora.alpha,
        lora.targets.len(),
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
