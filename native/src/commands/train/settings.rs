//! `napkin train`'s settings: the defaults, then `--config FILE` (TOML), then the flags.

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};
use napkin_core::train::TrainConfig;

use crate::cli::TrainArgs;

/// Defaults, then the TOML file, then the flags.
pub(super) fn settings(args: &TrainArgs) -> Result<TrainConfig> {
    let mut c = match &args.config {
        Some(path) => {
            let text =
                fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            toml::from_str::<TrainConfig>(&text)
                .with_context(|| format!("{}: not a valid run configuration", path.display()))?
        }
        None => TrainConfig::default(),
    };
    macro_rules! set {
        ($($field:ident),*) => {$(
            if let Some(v) = &args.$field {
                c.$field = v.clone().into();
            }
        )*};
    }
    // --model and --preset replace each other (whichever a TOML file named).
    if let Some(model) = &args.model {
        c.model = model.clone();
        c.preset = None;
    }
    if let Some(preset) = &args.preset {
        c.preset = Some(preset.clone());
        c.model = Default::default();
    }
    set!(
        data,
        out,
        lora_r,
        lora_alpha,
        lora_dropout,
        targets,
        micro_batch,
        accum
    );
    set!(seq_len, lr, weight_decay, warmup_steps, max_grad_norm, seed);
    if let Some(d) = &args.dtype {
        c.dtype = d.parse()?;
    }
    if let Some(d) = &args.device {
        c.device = d.parse()?;
    }
    set!(
        save_every,
        keep_checkpoints,
        nf4_block_size,
        momentum,
        val_fraction,
        eval_every,
        early_stopping,
        sample_tokens
    );
    if !args.sample_prompts.is_empty() {
        c.sample_prompts = args.sample_prompts.clone();
    }
    c.train_on_inputs |= args.train_on_inputs;
    if let Some(f) = &args.data_format {
        c.data_format = f.parse()?;
    }
    if let Some(e) = &args.eval_data {
        c.eval_data = Some(e.clone());
    }
    if let Some(a) = &args.adapter {
        c.adapter = Some(a.clone());
    }
    if let Some(r) = args.warmup_ratio {
        c.warmup_ratio = Some(r);
    }
    if let Some(k) = &args.lr_scheduler {
        c.lr_scheduler = k.parse()?;
    }
    if let Some(t) = &args.tokenizer {
        c.tokenizer = Some(t.clone());
    }
    if let Some(f) = &args.chat_format {
        c.chat_format = Some(f.clone());
    }
    if let Some(s) = args.steps {
        c.steps = Some(s);
    }
    if let Some(e) = args.epochs {
        c.epochs = Some(e);
    }
    if let Some(o) = &args.optimizer {
        c.optimizer = o.parse()?;
    }
    c.nf4 |= args.nf4;
    c.double_quant |= args.double_quant;
    c.checkpointing |= args.checkpointing;
    c.rslora |= args.rslora;
    if let Some(a) = &args.attention {
        c.attention = a.parse().context("--attention")?;
    }
    if args.no_pack {
        c.pack = false;
    }
    if let Some(what) = &args.offload {
        c.offload_optimizer = crate::commands::offload_optimizer(what)?;
    }
    if let Some(d) = &args.merge_dtype {
        c.merge_dtype = Some(d.parse()?);
    }
    if let Some(size) = &args.max_shard_size {
        c.max_shard_bytes = crate::commands::shard_bytes(size)?;
    }
    Ok(c)
}

/// The settings with every file path made absolute (against the current folder).
pub(super) fn with_absolute_paths(config: &TrainConfig) -> TrainConfig {
    let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    TrainConfig {
        model: absolute(&config.model),
        data: absolute(&config.data),
        out: absolute(&config.out),
        tokenizer: config.tokenizer.as_deref().map(absolute),
        eval_data: config.eval_data.as_deref().map(absolute),
        ..config.clone()
    }
}
