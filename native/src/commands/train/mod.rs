//! `napkin train`: fine-tuning with progress, metrics, checkpoints and resume.
//!
//! Settings come from the defaults, then `--config FILE` (TOML), then the flags. The run
//! writes into `--out`: `run_config.toml` (the settings used), `metrics.jsonl` (one line per
//! step, with the held-out loss on evaluation steps), `checkpoint-NNNNNN/` folders (crash-safe,
//! see `napkin_core::train::checkpoint`), `best/` (the weights of the lowest held-out loss),
//! and at the end the adapter (or the full model), and with `--merge` the merged model.

use std::cell::RefCell;
use std::fs;
use std::io::{IsTerminal, Write};
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use napkin_core::device::DeviceKind;
use napkin_core::distributed::Counted;
use napkin_core::distributed::launch::Launch;
use napkin_core::exercises::{Dimension, answer::parse_quantity};
use napkin_core::io::atomic::write_atomic;
use napkin_core::memory::counting_alloc::{live_bytes, peak_bytes, reset_peak};
use napkin_core::predict::preflight::{available_memory, check_fits};
use napkin_core::train::checkpoint::BEST_DIR;
use napkin_core::train::{TrainConfig, Trainer};
use serde_json::json;

use crate::cli::TrainArgs;

mod metrics;
mod settings;

use metrics::{add_eval, keep_metrics_up_to, metrics_line};
use settings::{settings, with_absolute_paths};

const MIB: f64 = 1024.0 * 1024.0;

/// `given(id)`: whether the flag of field `id` was given on the command line.
pub fn run(args: &TrainArgs, given: &dyn Fn(&str) -> bool) -> Result<()> {
    let mut config = settings(args, given)?;
    if let Some(change) = config.adopt_adapter()? {
        eprintln!("{change}");
    }
    config.validate()?;
    // Several ranks: every rank runs this command; rank 0 alone prints and writes.
    let launch = Launch::from_env()?;
    if launch.world > 1 && config.shard.is_none() {
        bail!(
            "this process is rank {} of {} ({:?} launcher): pass --shard ddp to train data-parallel",
            launch.rank,
            launch.world,
            launch.launcher
        );
    }
    let collective = match config.shard {
        Some(_) => Some(Rc::new(RefCell::new(Counted::for_launch(&launch)?))),
        None => None,
    };
    let result = train(args, config, &launch, collective.clone());
    if let Some(c) = collective {
        let mut c = c.borrow_mut();
        match &result {
            Ok(()) => c.finish(),
            Err(e) if c.world() > 1 => {
                // The other ranks may wait in a collective this one will not call: end them
                // all, after saying why.
                eprintln!(
                    "error on rank {} of {}: {e:#}; stopping every rank",
                    c.rank(),
                    c.world()
                );
                c.abort(1);
            }
            Err(_) => {}
        }
    }
    result
}

/// The run itself, on this rank (`collective`: its engine under `--shard ddp`).
fn train(
    args: &TrainArgs,
    config: TrainConfig,
    launch: &Launch,
    collective: Option<Rc<RefCell<Counted>>>,
) -> Result<()> {
    let lead = launch.rank == 0;
    preflight(args, &config)?;
    fs::create_dir_all(&config.out)
        .with_context(|| format!("creating {}", config.out.display()))?;
    let plain = args.plain || !std::io::stderr().is_terminal() || !lead;
    let what = format!(
        "loading {}{}, reading the data",
        config.model_name(),
        if config.nf4 {
            " and quantizing it to NF4"
        } else {
            ""
        }
    );
    let loaded = if lead {
        super::working(&what, plain, || Trainer::new(config, args.resume))
    } else {
        Trainer::new(config, args.resume)
    };
    let (mut trainer, skipped) = loaded?;
    let engine = collective.as_ref().map(|c| c.borrow().engine());
    let counts = || {
        collective
            .as_ref()
            .map(|c| c.borrow().counts().to_vec())
            .unwrap_or_default()
    };
    if let Some(c) = collective.clone() {
        trainer.join(c)?;
    }
    let (_, world) = trainer.rank_and_world();
    // Only rank 0 speaks: the other ranks' lines would repeat its own.
    macro_rules! say {
        ($($arg:tt)*) => { if lead { eprintln!($($arg)*); } };
    }
    for damaged in &skipped {
        say!("warning: skipped a damaged checkpoint: {damaged}");
    }
    let config = trainer.config.clone();
    let metrics_path = config.out.join("metrics.jsonl");
    if lead {
        // The run file names its files absolutely: `napkin report`, `eval --adapter` and a
        // later `--config` find them from any folder.
        let toml = toml::to_string_pretty(&with_absolute_paths(&config))
            .context("writing the run settings")?;
        write_atomic(&config.out.join("run_config.toml"), toml.as_bytes())?;
        keep_metrics_up_to(&metrics_path, trainer.step)?;
    }
    if world > 1 {
        say!(
            "data-parallel (DDP) over {world} ranks ({}): each step trains on {} × {} × {world} = {} sequences of {} tokens; rank r takes micro-batches r, r + {world}, … of each step's",
            engine.clone().unwrap_or_default(),
            config.micro_batch,
            config.accumulation,
            config.micro_batch * config.accumulation * world,
            config.seq_len
        );
    }
    if trainer.step > 0 {
        say!(
            "resuming after step {} of {}",
            trainer.step,
            trainer.total_steps()
        );
    }
    say!("{}", data_summary(&trainer));
    say!(
        "{} trainable parameters; {} steps",
        trainer.model.trainable_parameters(),
        trainer.total_steps()
    );

    // Without a terminal (a log file, CI) a bar would print nothing: lines instead.
    let bar = progress_bar(&trainer, plain);
    // Rank 0's metrics file; the other ranks write into nothing.
    let mut metrics: Box<dyn Write> = if lead {
        Box::new(
            fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&metrics_path)
                .with_context(|| format!("opening {}", metrics_path.display()))?,
        )
    } else {
        Box::new(std::io::sink())
    };
    if trainer.step == 0 && (trainer.has_eval() || !config.sample_prompts.is_empty()) {
        // The baseline before any update: where the curves start (not a candidate for best/).
        let eval = trainer.evaluate()?;
        let samples = trainer.sample()?;
        let mut line = json!({ "step": 0 });
        add_eval(&mut line, eval.as_ref(), &samples);
        if let Some(e) = &eval {
            bar.suspend(|| say!("before training: eval {}", e.describe()));
        }
        for s in &samples {
            bar.suspend(|| {
                say!(
                    "  sample before training: {:?} → {:?}",
                    s.prompt,
                    s.completion
                )
            });
        }
        writeln!(metrics, "{line}").context("writing metrics.jsonl")?;
    }
    let started = Instant::now();
    let mut tokens_total = 0usize;
    let mut run_peak = peak_bytes();
    while !trainer.is_done() {
        // The step's own heap peak, beside the running one.
        reset_peak();
        let stepped = trainer.train_step();
        let step_peak = peak_bytes();
        run_peak = run_peak.max(step_peak);
        let report = match stepped {
            Ok(r) => r,
            Err(e) => {
                bar.abandon();
                bail!("{e}");
            }
        };
        tokens_total += report.tokens;
        if let Some(note) = trainer.take_capture_note() {
            bar.suspend(|| say!("{note}"));
        }
        let due = trainer.eval_due();
        let eval = match due.then(|| trainer.evaluate()).transpose()?.flatten() {
            Some(e) => Some((e, trainer.record_eval(&e)?)),
            None => None,
        };
        let samples = if due { trainer.sample()? } else { Vec::new() };
        let line = metrics_line(&report, step_peak, run_peak, eval.as_ref(), &samples);
        writeln!(metrics, "{line}").context("writing metrics.jsonl")?;
        metrics.flush().context("writing metrics.jsonl")?;
        let eval_text = match &eval {
            Some((e, best)) => format!(
                "  eval {}{}",
                e.describe(),
                if *best { " best" } else { "" }
            ),
            None => String::new(),
        };
        let rewards = match &report.preference {
            Some(m) => format!(
                " (reward accuracy {:.2}, margin {:.3})",
                m.rewards_accuracy, m.rewards_margin
            ),
            None => String::new(),
        };
        let message = format!(
            "loss {:.4}{rewards}{eval_text}  lr {:.2e}  {:.0} tok/s  heap {:.0} MiB (step peak {:.0})",
            report.loss,
            report.lr,
            report.tokens as f64 / report.seconds.max(1e-9),
            live_bytes() as f64 / MIB,
            step_peak as f64 / MIB
        );
        if plain {
            say!("step {}/{}  {message}", report.step, trainer.total_steps());
        } else {
            bar.set_position(report.step);
            bar.set_message(message);
        }
        for s in &samples {
            bar.suspend(|| {
                say!(
                    "  sample after step {}: {:?} → {:?}",
                    report.step,
                    s.prompt,
                    s.completion
                )
            });
        }
        let at_end = trainer.is_done();
        if (config.save_every > 0 && report.step % config.save_every == 0) || at_end {
            // Every rank checks that the replicas agree; rank 0 writes.
            trainer.check_replicas()?;
            if lead {
                let dir = trainer.save_checkpoint()?;
                bar.suspend(|| eprintln!("saved {}", dir.display()));
            }
        }
    }
    bar.finish();
    if !lead {
        return Ok(());
    }
    if trainer.stopped_early() {
        eprintln!(
            "stopped early after step {} of {}: the held-out loss has not improved for {} evaluations (best {:.4} after step {}, its weights in {})",
            trainer.step,
            trainer.total_steps(),
            config.early_stopping,
            trainer.eval.best_loss.unwrap_or(f64::NAN),
            trainer.eval.best_step,
            config.out.join(BEST_DIR).display()
        );
    }
    let written = if args.merge {
        super::working("writing the adapter and the merged model", plain, || {
            trainer.save_final(true)
        })?
    } else {
        trainer.save_final(false)?
    };
    let seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "done: {} steps in {seconds:.1} s, {:.0} tokens/s, peak heap {:.1} MiB",
        trainer.step,
        tokens_total as f64 / seconds.max(1e-9),
        run_peak.max(peak_bytes()) as f64 / MIB
    );
    for path in written {
        eprintln!("wrote {}", path.display());
    }
    if world > 1 {
        let counts = counts();
        let line: Vec<String> = counts
            .iter()
            .map(|c| {
                format!(
                    "{} {} × {} ({} bytes)",
                    c.what,
                    c.op.name(),
                    c.calls,
                    c.payload_bytes
                )
            })
            .collect();
        eprintln!(
            "collectives (counted at the call, rank 0): {}",
            line.join("; ")
        );
        write_atomic(
            &config.out.join("communication.json"),
            serde_json::to_string_pretty(&counts)?.as_bytes(),
        )?;
    }
    let page = super::report::write_report(&config.out, &config.out.join("report.html"))?;
    eprintln!("wrote {} (napkin report)", page.display());
    Ok(())
}

/// Refuses a run whose predicted peak is more than the memory it may use (unless --force).
fn preflight(args: &TrainArgs, config: &TrainConfig) -> Result<()> {
    if args.force {
        return Ok(());
    }
    let limit = match &args.memory_limit {
        Some(text) => Some(
            parse_quantity(text, Dimension::Bytes)
                .map_err(|e| anyhow::anyhow!("--memory-limit: {e}"))?
                .value as u64,
        ),
        None => match config.device {
            // The device's own memory, as its driver states it.
            kind @ (DeviceKind::Wgpu | DeviceKind::Cuda) => {
                napkin_core::device::memory_capacity(&kind.open()?)
            }
            _ => available_memory(),
        },
    };
    let Some(limit) = limit else {
        return Ok(());
    };
    let model = match &config.preset {
        Some(name) => napkin_core::config::LlamaConfig::preset(name)?,
        None => super::model_config(&config.model)?,
    };
    check_fits(&config.scenario(model)?, limit)?;
    Ok(())
}

/// What the data turned into, in a line or two.
fn data_summary(trainer: &Trainer) -> String {
    let d = &trainer.data;
    let c = &trainer.config;
    let t = &d.train;
    let kind = match d.format {
        Some(f) => format!("{f} samples"),
        None if c.objective.is_preference() => format!(
            "preference pairs for {} (each pair one row: prompt + chosen, then prompt + rejected, each cut to --seq-len)",
            c.objective
        ),
        None => "windows of plain text".to_string(),
    };
    let mut text = format!(
        "data: {} {kind} ({} longer than {} tokens, cut; {} with nothing to learn, dropped): {} tokens, {} learned; {} {:.1} % of the token slots, {} of {}×{} per epoch",
        t.samples,
        t.truncated,
        c.seq_len,
        t.dropped,
        t.tokens,
        t.label_tokens,
        if c.pack && !c.objective.is_preference() {
            "packed into"
        } else {
            "padded: real tokens fill"
        },
        100.0 * t.fill,
        plural(t.batches_per_epoch, "micro-batch", "micro-batches"),
        c.micro_batch,
        c.seq_len,
    );
    if t.dropped > 0 {
        text.push_str(&format!(
            "\nwarning: {} of {} samples have no token to learn within the first {} (a long prompt or template pushes the reply past it): raise --seq-len to train on them",
            t.dropped,
            t.samples + t.dropped,
            c.seq_len
        ));
    }
    if d.held_out_samples > 0 {
        let source = match &c.eval_data {
            Some(path) => path.display().to_string(),
            None => format!("{} of the data, seeded", c.val_fraction),
        };
        text.push_str(&format!(
            "\nheld out: {} ({source}), {} per evaluation, {}",
            if c.objective.is_preference() {
                plural(d.held_out_samples, "pair", "pairs")
            } else {
                plural(d.held_out_samples, "sample", "samples")
            },
            plural(d.held_out_batches, "micro-batch", "micro-batches"),
            match c.eval_every {
                0 => "after the last step".to_string(),
                1 => "after every step".to_string(),
                n => format!("every {n} steps and after the last"),
            }
        ));
        if c.early_stopping > 0 {
            text.push_str(&format!(
                "; early stopping after {} without a new best",
                c.early_stopping
            ));
        }
    }
    text
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn progress_bar(trainer: &Trainer, plain: bool) -> ProgressBar {
    if plain {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(trainer.total_steps());
    bar.set_position(trainer.step);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} steps [{elapsed} < {eta}] {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(Duration::from_millis(500));
    bar
}
