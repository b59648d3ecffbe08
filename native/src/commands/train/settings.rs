//! `napkin train`'s settings: the defaults, then `--config FILE` (TOML), then the flags.

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};
use napkin_core::train::TrainConfig;

use crate::cli::TrainArgs;

/// Defaults, then the TOML file, then the flags given on the command line (`given` says
/// which: a flag left at its `--help` default does not override the file).
pub(super) fn settings(args: &TrainArgs, given: &dyn Fn(&str) -> bool) -> Result<TrainConfig> {
    let mut c = match &args.config {
        Some(path) => {
            let text =
                fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            toml::from_str::<TrainConfig>(&text)
                .with_context(|| format!("{}: not a valid run configuration", path.display()))?
        }
        None => TrainConfig::default(),
    };
    // A flag's value where it was given on the command line (the run file's key is the
    // field's name).
    macro_rules! set {
        ($($field:ident),* $(,)?) => {$(
            if given(stringify!($field)) {
                c.$field = args.$field.clone();
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
    if let Some(data) = &args.data {
        c.data = data.clone();
    }
    if let Some(out) = &args.out {
        c.out = out.clone();
    }
    set!(
        data_format,
        objective,
        beta,
        val_fraction,
        eval_every,
        early_stopping,
        shard,
        sample_tokens,
        lora_r,
        lora_alpha,
        lora_dropout,
        lora_targets,
        nf4_block_size,
        attention,
        micro_batch,
        accumulation,
        seq_len,
        optimizer,
        momentum,
        lr,
        weight_decay,
        warmup_steps,
        lr_scheduler,
        max_grad_norm,
        seed,
        dtype,
        device,
        save_every,
        keep_checkpoints,
    );
    if !args.sample_prompts.is_empty() {
        c.sample_prompts = args.sample_prompts.clone();
    }
    c.train_on_inputs |= args.train_on_inputs;
    if let Some(e) = &args.eval_data {
        c.eval_data = Some(e.clone());
    }
    if let Some(a) = &args.adapter {
        c.adapter = Some(a.clone());
    }
    if let Some(r) = args.warmup_ratio {
        c.warmup_ratio = Some(r);
    }
    if let Some(t) = &args.tokenizer {
        c.tokenizer = Some(t.clone());
    }
    if let Some(f) = args.chat_format {
        c.chat_format = Some(f);
    }
    if let Some(s) = args.steps {
        c.steps = Some(s);
    }
    if let Some(e) = args.epochs {
        c.epochs = Some(e);
    }
    c.nf4 |= args.nf4;
    c.double_quant |= args.double_quant;
    c.checkpointing |= args.checkpointing;
    c.chunked_loss |= args.chunked_loss;
    c.rslora |= args.rslora;
    c.dora |= args.dora;
    if args.no_pack {
        c.pack = false;
    }
    if args.no_capture {
        c.capture = false;
    }
    if given("offload") {
        c.offload_optimizer = crate::commands::offload_optimizer(args.offload)?;
    }
    if let Some(d) = args.merge_dtype {
        c.merge_dtype = Some(d);
    }
    if given("max_shard_size") {
        c.max_shard_bytes = crate::commands::shard_bytes(&args.max_shard_size)?;
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
