//! `metrics.jsonl`: one line per step (with the held-out loss and sample answers on
//! evaluation steps), cut back to the checkpoint's step on resume.

use std::fs;
use std::path::Path;

use anyhow::Result;
use napkin_core::io::atomic::write_atomic;
use napkin_core::memory::counting_alloc::live_bytes;
use napkin_core::train::{EvalReport, PreferenceMetrics, SampleText, StepReport};
use serde_json::json;

pub(super) fn metrics_line(
    report: &StepReport,
    step_peak: usize,
    run_peak: usize,
    eval: Option<&(EvalReport, bool)>,
    samples: &[SampleText],
) -> String {
    let mut line = json!({
        "step": report.step,
        "loss": report.loss,
        "lr": report.lr,
        "grad_norm": report.grad_norm,
        "label_tokens": report.label_tokens,
        "tokens": report.tokens,
        "seconds": report.seconds,
        "loss_scale": report.loss_scale,
        "skipped": report.skipped,
        "tokens_per_second": report.tokens as f64 / report.seconds.max(1e-9),
        "heap_bytes": live_bytes(),
        "peak_heap_bytes": run_peak,
        "step_peak_heap_bytes": step_peak,
    });
    if let Some(m) = &report.preference {
        add_preference(&mut line, m, "");
    }
    if let Some((_, best)) = eval {
        line["eval_best"] = json!(best);
    }
    add_eval(&mut line, eval.map(|(e, _)| e), samples);
    line.to_string()
}

/// An evaluation's fields and the sample answers, added to a metrics line.
pub(super) fn add_eval(
    line: &mut serde_json::Value,
    eval: Option<&EvalReport>,
    samples: &[SampleText],
) {
    if let Some(e) = eval {
        line["eval_loss"] = json!(e.loss);
        line["eval_perplexity"] = json!(e.perplexity);
        line["eval_tokens"] = json!(e.tokens);
        if let Some(m) = &e.preference {
            add_preference(line, m, "eval_");
        }
    }
    if !samples.is_empty() {
        line["samples"] = json!(samples);
    }
}

/// A preference step's (or evaluation's) metrics under TRL's names, `prefix` before each.
fn add_preference(line: &mut serde_json::Value, m: &PreferenceMetrics, prefix: &str) {
    let mut fields = vec![
        ("rewards/chosen", m.rewards_chosen),
        ("rewards/rejected", m.rewards_rejected),
        ("rewards/accuracies", m.rewards_accuracy),
        ("rewards/margins", m.rewards_margin),
        ("logps/chosen", m.logps_chosen),
        ("logps/rejected", m.logps_rejected),
    ];
    if m.nll != 0.0 {
        fields.extend([
            ("nll_loss", m.nll),
            ("log_odds_ratio", m.log_odds_ratio),
            ("log_odds_chosen", m.log_odds_chosen),
        ]);
    }
    for (name, value) in fields {
        line[format!("{prefix}{name}")] = json!(value);
    }
    line[format!("{prefix}pairs")] = json!(m.pairs);
}

/// On resume, drops metric lines after the checkpoint's step (and a torn last line); a run
/// that starts from step 0 keeps none (it writes its baseline evaluation again).
pub(super) fn keep_metrics_up_to(path: &Path, step: u64) -> Result<()> {
    let Ok(text) = fs::read_to_string(path) else {
        return Ok(());
    };
    let kept: String = text
        .lines()
        .filter(|line| {
            serde_json::from_str::<serde_json::Value>(line)
                .ok()
                .and_then(|v| v["step"].as_u64())
                .is_some_and(|s| step > 0 && s <= step)
        })
        .map(|line| format!("{line}\n"))
        .collect();
    write_atomic(path, kept.as_bytes())?;
    Ok(())
}
