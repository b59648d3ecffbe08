//! `napkin report OUT_DIR`: the run's curves, samples, settings and predicted-vs-measured
//! memory as one self-contained HTML page (`OUT_DIR/report.html` unless `--out`).

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use napkin_core::io::atomic::write_atomic;
use napkin_core::predict::timeline::step_timeline;
use napkin_core::report::run::{MemoryCheck, RunReport, parse_metrics, run_report_html};
use napkin_core::train::TrainConfig;

use crate::cli::ReportArgs;

pub fn run(args: &ReportArgs) -> Result<()> {
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| args.run.join("report.html"));
    let written = write_report(&args.run, &out)?;
    eprintln!("wrote {}", written.display());
    Ok(())
}

/// Reads `run/metrics.jsonl` and `run/run_config.toml` and writes the page to `out`.
pub fn write_report(run: &Path, out: &Path) -> Result<PathBuf> {
    let metrics_path = run.join("metrics.jsonl");
    let text = fs::read_to_string(&metrics_path).with_context(|| {
        format!(
            "reading {} (is {} a `napkin train` output folder?)",
            metrics_path.display(),
            run.display()
        )
    })?;
    let (rows, unreadable_lines) = parse_metrics(&text);
    let config_path = run.join("run_config.toml");
    let config_text = fs::read_to_string(&config_path).ok();
    let config: Option<TrainConfig> = config_text.as_deref().and_then(|t| toml::from_str(t).ok());
    let settings = config_text
        .as_deref()
        .and_then(|t| t.parse::<toml::Table>().ok())
        .map(|table| {
            table
                .iter()
                .map(|(k, v)| (k.clone(), v.to_string().trim_matches('"').to_string()))
                .collect()
        })
        .unwrap_or_default();
    let measured = rows
        .iter()
        .filter_map(|r| r.step_peak_heap_bytes)
        .fold(None, |m: Option<f64>, b| Some(m.map_or(b, |m| m.max(b))));
    let (memory, memory_note) = match (&config, measured) {
        (None, _) => (None, Some(format!("{} is missing or unreadable: no prediction.", config_path.display()))),
        (Some(_), None) => (None, Some("metrics.jsonl holds no step peak (written by an older napkin).".into())),
        (Some(c), Some(measured)) => match predicted_peak(c, run) {
            Ok(predicted) if is_cpu(c) => (
                Some(MemoryCheck {
                    measured_what: "the largest step's heap peak (counting allocator: every host allocation, the model and data included)".into(),
                    predicted,
                    measured: measured as u64,
                }),
                None,
            ),
            Ok(_) => (None, Some(format!("device `{}`: the step's memory is on the device, which the heap does not see; `napkin measure` compares the device pool with the prediction.", c.device))),
            Err(e) => (None, Some(format!("no prediction: {e:#}"))),
        },
    };
    let page = run_report_html(&RunReport {
        title: run.display().to_string(),
        settings,
        rows,
        unreadable_lines,
        memory,
        memory_note,
    });
    write_atomic(out, page.as_bytes())?;
    Ok(out.to_path_buf())
}

fn is_cpu(c: &TrainConfig) -> bool {
    c.device.is_cpu()
}

/// The predictor's step peak for the run's settings (needs the model's configuration).
fn predicted_peak(c: &TrainConfig, run: &Path) -> Result<u64> {
    let model = super::model_config(&resolve(&c.model, run, &c.out))?;
    Ok(step_timeline(&c.scenario(model)?).peak.bytes)
}

/// A path of the run's settings as `napkin train` saw it: a relative path was relative to the
/// folder it ran in, which is `run` with the relative `out` taken off its end (so the report
/// finds the model from any folder).
fn resolve(path: &Path, run: &Path, out: &Path) -> PathBuf {
    if path.is_absolute() || out.is_absolute() {
        return path.to_path_buf();
    }
    let Ok(mut started_in) = run.canonicalize() else {
        return path.to_path_buf();
    };
    for _ in out
        .components()
        .filter(|c| matches!(c, std::path::Component::Normal(_)))
    {
        if !started_in.pop() {
            return path.to_path_buf();
        }
    }
    started_in.join(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relative_path_is_found_from_the_folder_the_run_started_in() {
        let root = std::env::temp_dir().join(format!("napkin-resolve-{}", std::process::id()));
        let run = root.join("runs/smol");
        fs::create_dir_all(&run).unwrap();
        let root = root.canonicalize().unwrap();
        assert_eq!(
            resolve(Path::new("models/m.gguf"), &run, Path::new("runs/smol")),
            root.join("models/m.gguf")
        );
        assert_eq!(
            resolve(Path::new("/abs/m.gguf"), &run, Path::new("runs/smol")),
            Path::new("/abs/m.gguf")
        );
        fs::remove_dir_all(&root).unwrap();
    }
}
