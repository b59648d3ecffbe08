//! The report of a training run: `metrics.jsonl` read back, drawn as curves (training and
//! held-out loss, learning rate, gradient norm, tokens/s, heap memory per step, and a
//! preference run's reward accuracy and margin under TRL's names), with the
//! sample generations, the predicted beside the measured memory peak, and the run's settings —
//! one HTML page with inline SVG and CSS, no script and nothing fetched, that opens anywhere.

use std::fmt::Write;

use serde_json::Value;

use super::chart::{Series, line_chart};
use super::svg::{escape, line_chart_svg};

/// One line of `metrics.jsonl` (a step, or the baseline before training at step 0).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MetricRow {
    /// Optimizer steps completed.
    pub step: u64,
    /// Training loss of the step (None on the baseline line).
    pub loss: Option<f64>,
    /// Learning rate used.
    pub lr: Option<f64>,
    /// Gradient norm before clipping.
    pub grad_norm: Option<f64>,
    /// Throughput of the step.
    pub tokens_per_second: Option<f64>,
    /// Heap bytes live after the step.
    pub heap_bytes: Option<f64>,
    /// Heap peak so far.
    pub peak_heap_bytes: Option<f64>,
    /// Heap peak of this step alone (forward, backward and update).
    pub step_peak_heap_bytes: Option<f64>,
    /// Held-out loss, on evaluation steps.
    pub eval_loss: Option<f64>,
    /// A preference step's `rewards/accuracies` and `rewards/margins`.
    pub rewards: Option<(f64, f64)>,
    /// The same on the held-out pairs, on evaluation steps.
    pub eval_rewards: Option<(f64, f64)>,
    /// Sample prompts and answers, on evaluation steps.
    pub samples: Vec<(String, String)>,
}

/// The rows of `metrics.jsonl`, and how many lines could not be read (a torn last line of a
/// killed run, say).
pub fn parse_metrics(text: &str) -> (Vec<MetricRow>, usize) {
    let mut rows = Vec::new();
    let mut unreadable = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            unreadable += 1;
            continue;
        };
        let Some(step) = v["step"].as_u64() else {
            unreadable += 1;
            continue;
        };
        let number = |key: &str| v[key].as_f64();
        let samples = v["samples"]
            .as_array()
            .map(|list| {
                list.iter()
                    .filter_map(|s| {
                        Some((
                            s["prompt"].as_str()?.to_string(),
                            s["completion"].as_str()?.to_string(),
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default();
        rows.push(MetricRow {
            step,
            loss: number("loss"),
            lr: number("lr"),
            grad_norm: number("grad_norm"),
            tokens_per_second: number("tokens_per_second"),
            heap_bytes: number("heap_bytes"),
            peak_heap_bytes: number("peak_heap_bytes"),
            step_peak_heap_bytes: number("step_peak_heap_bytes"),
            eval_loss: number("eval_loss"),
            rewards: number("rewards/accuracies").zip(number("rewards/margins")),
            eval_rewards: number("eval_rewards/accuracies").zip(number("eval_rewards/margins")),
            samples,
        });
    }
    (rows, unreadable)
}

/// The step's peak memory as the predictor saw it beside the run's measured peak.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryCheck {
    /// What was measured (`heap (counting allocator)`, say).
    pub measured_what: String,
    /// The predicted step peak, bytes.
    pub predicted: u64,
    /// The measured peak, bytes.
    pub measured: u64,
}

/// Everything on the page.
#[derive(Debug, Clone, PartialEq)]
pub struct RunReport {
    /// The page's heading (the run folder, say).
    pub title: String,
    /// The run's settings, key and value, in order.
    pub settings: Vec<(String, String)>,
    /// The metrics, in file order.
    pub rows: Vec<MetricRow>,
    /// Lines of metrics.jsonl that could not be read.
    pub unreadable_lines: usize,
    /// Predicted beside measured memory, when the prediction could be made.
    pub memory: Option<MemoryCheck>,
    /// Why there is no memory check, when there is none.
    pub memory_note: Option<String>,
}

const CHART_W: f64 = 520.0;
const CHART_H: f64 = 200.0;
const MIB: f64 = 1024.0 * 1024.0;

/// The chart classes of [`line_chart_svg`](super::svg::line_chart_svg), as a literal for
/// `concat!`.
macro_rules! chart_style {
    () => {
        concat!(
            "svg.c-chart{width:100%;height:auto}.c-grid{stroke:#e6e9ee}.c-axis{stroke:#6b7480}",
            ".c-tick,.c-legend,.c-axis-name{font-size:11px;fill:#3b434d}.c-series{fill:none;stroke-width:1.8}",
            ".c-train{stroke:#2b6cb0}.c-eval{stroke:#c05621;stroke-dasharray:5 3}.c-peak{stroke:#805ad5;stroke-dasharray:2 2}",
            ".c-marker{stroke:none}.c-marker.c-train{fill:#2b6cb0}.c-marker.c-eval{fill:#c05621}.c-marker.c-peak{fill:#805ad5}",
        )
    };
}

const STYLE: &str = concat!(
    "body{font:15px/1.45 system-ui,sans-serif;margin:2rem auto;max-width:1180px;padding:0 1rem;color:#1d232b}",
    "h1{font-size:1.5rem}h2{font-size:1.1rem;margin-top:2rem}",
    ".grid-charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(520px,1fr));gap:1rem}",
    "figure{margin:0;border:1px solid #d4d9e0;border-radius:6px;padding:.5rem}figcaption{font-weight:600}",
    "table{border-collapse:collapse;margin:.5rem 0}",
    "td,th{border:1px solid #d4d9e0;padding:.25rem .6rem;text-align:left;vertical-align:top}",
    "td.num{text-align:right;font-variant-numeric:tabular-nums}td.text{white-space:pre-wrap}.note{color:#56606b}",
    chart_style!()
);

/// The chart classes (a page drawing [`line_chart_svg`](super::svg::line_chart_svg) charts
/// needs them in its stylesheet; the browser sandbox's has them).
pub const CHART_STYLE: &str = chart_style!();

/// The page.
pub fn run_report_html(r: &RunReport) -> String {
    let steps: Vec<&MetricRow> = r.rows.iter().filter(|m| m.loss.is_some()).collect();
    let series = |label: &str, class: &'static str, f: &dyn Fn(&MetricRow) -> Option<f64>| Series {
        label: label.into(),
        class,
        points: r
            .rows
            .iter()
            .filter_map(|m| Some((m.step as f64, f(m)?)))
            .collect(),
    };
    let chart = |title: &str, y_name: &str, list: Vec<Series>| {
        let geometry = line_chart(&list, CHART_W, CHART_H);
        format!(
            "<figure><figcaption>{}</figcaption>{}</figure>",
            escape(title),
            line_chart_svg(&geometry, title, "optimizer step", y_name)
        )
    };
    let mut h = String::new();
    let _ = write!(
        h,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>napkin run: {t}</title>\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><style>{STYLE}</style></head><body>\
         <h1>napkin run: {t}</h1>",
        t = escape(&r.title)
    );
    // The headline.
    let last = steps.last();
    let best = r
        .rows
        .iter()
        .filter_map(|m| Some((m.step, m.eval_loss?)))
        .filter(|(step, _)| *step > 0)
        .min_by(|a, b| a.1.total_cmp(&b.1));
    let _ = write!(h, "<p>{} optimizer steps", steps.len());
    if let (Some(first), Some(last)) = (steps.first(), last) {
        let _ = write!(
            h,
            "; training loss {:.4} at step {} → {:.4} at step {}",
            first.loss.unwrap_or(f64::NAN),
            first.step,
            last.loss.unwrap_or(f64::NAN),
            last.step
        );
    }
    if let Some((step, loss)) = best {
        let _ = write!(h, "; lowest held-out loss {loss:.4} after step {step}");
    }
    h.push_str(".</p>");
    if r.unreadable_lines > 0 {
        let _ = write!(
            h,
            "<p class=\"note\">{} line(s) of metrics.jsonl could not be read and are left out.</p>",
            r.unreadable_lines
        );
    }

    h.push_str("<h2>Curves</h2><div class=\"grid-charts\">");
    let mut loss = vec![series("training loss", "c-train", &|m| m.loss)];
    if r.rows.iter().any(|m| m.eval_loss.is_some()) {
        loss.push(series("held-out loss", "c-eval", &|m| m.eval_loss));
    }
    h.push_str(&chart("Loss", "nats / token", loss));
    if r.rows
        .iter()
        .any(|m| m.rewards.is_some() || m.eval_rewards.is_some())
    {
        // A preference run: the share of pairs whose chosen reply out-rewards the rejected
        // one, and by how much (TRL's `rewards/accuracies` and `rewards/margins`).
        h.push_str(&chart(
            "Reward accuracy",
            "share of pairs",
            vec![
                series("training", "c-train", &|m| m.rewards.map(|r| r.0)),
                series("held out", "c-eval", &|m| m.eval_rewards.map(|r| r.0)),
            ],
        ));
        h.push_str(&chart(
            "Reward margin",
            "chosen − rejected",
            vec![
                series("training", "c-train", &|m| m.rewards.map(|r| r.1)),
                series("held out", "c-eval", &|m| m.eval_rewards.map(|r| r.1)),
            ],
        ));
    }
    h.push_str(&chart(
        "Learning rate",
        "lr",
        vec![series("learning rate", "c-train", &|m| m.lr)],
    ));
    h.push_str(&chart(
        "Gradient norm (before clipping)",
        "global norm",
        vec![series("gradient norm", "c-train", &|m| m.grad_norm)],
    ));
    h.push_str(&chart(
        "Throughput",
        "tokens / s",
        vec![series("tokens / s", "c-train", &|m| m.tokens_per_second)],
    ));
    h.push_str(&chart(
        "Heap memory",
        "MiB",
        vec![
            series("live after the step", "c-train", &|m| {
                m.heap_bytes.map(|b| b / MIB)
            }),
            series("the step's peak", "c-peak", &|m| {
                m.step_peak_heap_bytes.map(|b| b / MIB)
            }),
        ],
    ));
    h.push_str("</div>");

    h.push_str("<h2>Memory: predicted beside measured</h2>");
    match (&r.memory, &r.memory_note) {
        (Some(m), _) => {
            let _ = write!(
                h,
                "<table><tr><th></th><th>bytes</th><th>MiB</th></tr>\
                 <tr><td>predicted step peak (napkin's inventory)</td><td class=\"num\">{}</td><td class=\"num\">{:.1}</td></tr>\
                 <tr><td>measured peak: {}</td><td class=\"num\">{}</td><td class=\"num\">{:.1}</td></tr>\
                 <tr><td>measured / predicted</td><td class=\"num\" colspan=\"2\">{:.3}</td></tr></table>",
                m.predicted,
                m.predicted as f64 / MIB,
                escape(&m.measured_what),
                m.measured,
                m.measured as f64 / MIB,
                m.measured as f64 / m.predicted.max(1) as f64
            );
        }
        (None, Some(note)) => {
            let _ = write!(h, "<p class=\"note\">{}</p>", escape(note));
        }
        (None, None) => h.push_str("<p class=\"note\">No prediction.</p>"),
    }

    let sampled: Vec<&MetricRow> = r.rows.iter().filter(|m| !m.samples.is_empty()).collect();
    if !sampled.is_empty() {
        h.push_str("<h2>Sample generations (greedy)</h2><table><tr><th>after step</th><th>prompt</th><th>answer</th></tr>");
        for m in sampled {
            for (prompt, answer) in &m.samples {
                let answer = if answer.trim().is_empty() {
                    format!(
                        "<span class=\"note\">(only white space: {:?})</span>",
                        answer
                    )
                } else {
                    escape(answer)
                };
                let _ = write!(
                    h,
                    "<tr><td class=\"num\">{}</td><td>{}</td><td class=\"text\">{answer}</td></tr>",
                    m.step,
                    escape(prompt),
                );
            }
        }
        h.push_str("</table>");
    }

    h.push_str("<h2>Settings</h2><table>");
    for (key, value) in &r.settings {
        let _ = write!(
            h,
            "<tr><th>{}</th><td>{}</td></tr>",
            escape(key),
            escape(value)
        );
    }
    h.push_str("</table><p class=\"note\">Written by napkin from the run's metrics.jsonl and run_config.toml.</p></body></html>\n");
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_lines_are_read_and_a_torn_line_is_counted() {
        let text = concat!(
            r#"{"step":0,"eval_loss":2.5,"samples":[{"prompt":"Hi","completion":"Hello"}]}"#,
            "\n",
            r#"{"step":1,"loss":2.0,"lr":0.001,"grad_norm":1.5,"tokens_per_second":100.0,"heap_bytes":1048576,"peak_heap_bytes":2097152}"#,
            "\n",
            r#"{"step":2,"loss":1.8,"lr"#,
        );
        let (rows, bad) = parse_metrics(text);
        assert_eq!((rows.len(), bad), (2, 1));
        assert_eq!(rows[0].eval_loss, Some(2.5));
        assert_eq!(rows[0].loss, None);
        assert_eq!(rows[0].samples, [("Hi".to_string(), "Hello".to_string())]);
        assert_eq!(rows[1].heap_bytes, Some(1048576.0));
    }

    /// A preference run's metrics (TRL's names, as `napkin train` writes them) are read and
    /// drawn; a supervised run's page has no reward charts.
    #[test]
    fn a_preference_run_gets_its_reward_curves() {
        let text = [
            r#"{"step":0,"eval_loss":0.6931,"eval_rewards/accuracies":0.0,"eval_rewards/margins":0.0}"#,
            r#"{"step":1,"loss":0.69,"lr":0.001,"rewards/accuracies":0.5,"rewards/margins":0.01}"#,
            r#"{"step":2,"loss":0.6,"lr":0.001,"rewards/accuracies":0.75,"rewards/margins":0.2,"eval_loss":0.65,"eval_rewards/accuracies":0.6,"eval_rewards/margins":0.1}"#,
        ]
        .join("\n");
        let (rows, _) = parse_metrics(&text);
        assert_eq!(rows[1].rewards, Some((0.5, 0.01)));
        assert_eq!(rows[2].eval_rewards, Some((0.6, 0.1)));
        let page = |rows| {
            run_report_html(&RunReport {
                title: "run".into(),
                settings: vec![],
                rows,
                unreadable_lines: 0,
                memory: None,
                memory_note: None,
            })
        };
        assert!(page(rows).contains("Reward accuracy"));
        let (sft, _) = parse_metrics(r#"{"step":1,"loss":2.0,"lr":0.001}"#);
        assert!(!page(sft).contains("Reward accuracy"));
    }

    #[test]
    fn the_page_escapes_what_it_shows_and_fetches_nothing() {
        let (rows, _) = parse_metrics(concat!(
            r#"{"step":1,"loss":2.0,"lr":0.001,"samples":[{"prompt":"<b>","completion":"a & b"}],"eval_loss":2.2}"#,
            "\n",
            r#"{"step":2,"loss":1.5,"lr":0.0005,"eval_loss":2.1}"#
        ));
        let html = run_report_html(&RunReport {
            title: "runs/<x>".into(),
            settings: vec![("lr".into(), "0.001".into())],
            rows,
            unreadable_lines: 0,
            memory: None,
            memory_note: Some("no model".into()),
        });
        assert!(html.contains("runs/&lt;x&gt;") && !html.contains("<x>"));
        assert!(html.contains("&lt;b&gt;") && html.contains("a &amp; b"));
        assert!(html.contains("lowest held-out loss 2.1000 after step 2"));
        for external in ["http://", "https://", "<script", "src=", "@import", "url("] {
            let outside_svg_namespace = html.replace("xmlns=\"http://www.w3.org/2000/svg\"", "");
            assert!(!outside_svg_namespace.contains(external), "{external}");
        }
    }
}
