//! Files a learner drops into the page: a Hugging Face `config.json` (a model to predict), the
//! JSON that `napkin measure --json` writes on a real machine (measured numbers to show beside
//! the prediction), and the `metrics.jsonl` of a `napkin train` run (its curves). Each is
//! parsed here with typed errors naming the file.

use napkin_core::config::LlamaConfig;
use napkin_core::measure::MeasurementReport;
use napkin_core::report::run::{MetricRow, parse_metrics};

/// Largest file the page reads (a measurement report with its trace is well under 1 MiB).
pub const MAX_IMPORT_BYTES: usize = 16 << 20;

/// Why a dropped file was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ImportError {
    /// Larger than [`MAX_IMPORT_BYTES`].
    #[error("{file}: {bytes} bytes is too large for a config or a measurement (at most {max})", max = MAX_IMPORT_BYTES)]
    TooLarge {
        /// The file's name.
        file: String,
        /// Its size.
        bytes: usize,
    },
    /// Not JSON, or not the expected document.
    #[error("{file}: not {expected}: {message}")]
    Invalid {
        /// The file's name.
        file: String,
        /// What was expected.
        expected: &'static str,
        /// serde's or the validator's message.
        message: String,
    },
}

fn check_size(file: &str, text: &str) -> Result<(), ImportError> {
    if text.len() > MAX_IMPORT_BYTES {
        return Err(ImportError::TooLarge {
            file: file.to_string(),
            bytes: text.len(),
        });
    }
    Ok(())
}

/// A Hugging Face Llama `config.json`, validated as napkin-core validates it.
pub fn config_from_json(file: &str, text: &str) -> Result<LlamaConfig, ImportError> {
    check_size(file, text)?;
    let invalid = |message: String| ImportError::Invalid {
        file: file.to_string(),
        expected: "a Hugging Face Llama config.json",
        message,
    };
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| invalid(e.to_string()))?;
    LlamaConfig::from_hf_json(&value, file).map_err(|e| invalid(e.to_string()))
}

/// The JSON report of `napkin measure --json`.
pub fn measurement_from_json(file: &str, text: &str) -> Result<MeasurementReport, ImportError> {
    check_size(file, text)?;
    serde_json::from_str(text).map_err(|e| ImportError::Invalid {
        file: file.to_string(),
        expected: "the JSON of `napkin measure --json`",
        message: e.to_string(),
    })
}

/// The `metrics.jsonl` of a `napkin train` run: its rows (lines that do not parse, such as a
/// torn last line, are left out as `napkin report` leaves them out).
pub fn metrics_from_jsonl(file: &str, text: &str) -> Result<Vec<MetricRow>, ImportError> {
    check_size(file, text)?;
    let (rows, unreadable) = parse_metrics(text);
    if rows.iter().all(|r| r.loss.is_none()) {
        return Err(ImportError::Invalid {
            file: file.to_string(),
            expected: "the metrics.jsonl of `napkin train`",
            message: format!("no line with a step and a loss ({unreadable} unreadable)"),
        });
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The page draws its curves with the SVG `napkin report` writes; its stylesheet must hold
    /// the same chart classes.
    #[test]
    fn the_page_stylesheet_holds_the_chart_classes() {
        let css = include_str!("../static/style.css");
        assert!(css.contains(napkin_core::report::run::CHART_STYLE));
    }

    #[test]
    fn a_runs_metrics_are_read_and_other_files_refused() {
        let text = "{\"step\":0,\"eval_loss\":2.5}\n{\"step\":1,\"loss\":2.0}\n{\"step\":2,\"lo";
        let rows = metrics_from_jsonl("metrics.jsonl", text).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1].loss, Some(2.0));
        let err = metrics_from_jsonl("m.jsonl", "{\"kinds\": 1}").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("m.jsonl: not the metrics.jsonl of `napkin train`"),
            "{err}"
        );
    }

    #[test]
    fn configs_are_validated_with_the_file_named() {
        let smol = LlamaConfig::smollm2_135m().to_hf_json().to_string();
        assert_eq!(
            config_from_json("config.json", &smol).unwrap(),
            LlamaConfig::smollm2_135m()
        );
        let mut zero_heads = LlamaConfig::smollm2_135m().to_hf_json();
        zero_heads["num_attention_heads"] = 0.into();
        let err = config_from_json("config.json", &zero_heads.to_string()).unwrap_err();
        assert!(err.to_string().contains("num_attention_heads"), "{err}");
        let err = config_from_json("c.json", "not json").unwrap_err();
        assert!(
            err.to_string().starts_with("c.json: not a Hugging Face"),
            "{err}"
        );
        let huge = " ".repeat(MAX_IMPORT_BYTES + 1);
        assert!(matches!(
            config_from_json("c.json", &huge),
            Err(ImportError::TooLarge { .. })
        ));
    }
}
