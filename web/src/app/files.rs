//! Files from the learner's disk, read in the page (nothing is uploaded): a Hugging Face
//! `config.json` becomes the selected model; a `napkin measure --json` report from a real
//! machine is shown beside the prediction; a `napkin train` run's `metrics.jsonl` is drawn.

use std::rc::Rc;

use napkin_core::measure::MeasurementReport;
use napkin_core::report::chart::Series;
use napkin_core::report::run::MetricRow;
use wasm_bindgen_futures::{JsFuture, spawn_local};
use web_sys::HtmlInputElement;
use yew::prelude::*;

use super::charts::{CurveChart, MeasuredTable};
use crate::import::{config_from_json, measurement_from_json, metrics_from_jsonl};
use crate::page::PageAction;
use crate::state::Action;

#[derive(Properties, PartialEq)]
pub struct FilesProps {
    pub imported: Option<Rc<(String, MeasurementReport)>>,
    pub imported_run: Option<Rc<(String, Vec<MetricRow>)>>,
    pub error: Option<String>,
    pub dispatch: Callback<PageAction>,
}

/// Reads the chosen file as text and hands (name, text) to `then`.
fn read_file(e: Event, dispatch: Callback<PageAction>, then: fn(String, String) -> PageAction) {
    let input: HtmlInputElement = e.target_unchecked_into();
    let Some(file) = input.files().and_then(|f| f.get(0)) else {
        return;
    };
    let name = file.name();
    spawn_local(async move {
        let action = match JsFuture::from(file.text()).await {
            Ok(text) => then(name, text.as_string().unwrap_or_default()),
            Err(e) => PageAction::ImportFailed(format!("{name}: could not be read: {e:?}")),
        };
        dispatch.emit(action);
    });
}

fn config_action(name: String, text: String) -> PageAction {
    match config_from_json(&name, &text) {
        Ok(config) => PageAction::Sandbox(Action::UseConfig(name, Box::new(config))),
        Err(e) => PageAction::ImportFailed(e.to_string()),
    }
}

fn measurement_action(name: String, text: String) -> PageAction {
    match measurement_from_json(&name, &text) {
        Ok(report) => PageAction::Imported(name, Box::new(report)),
        Err(e) => PageAction::ImportFailed(e.to_string()),
    }
}

fn metrics_action(name: String, text: String) -> PageAction {
    match metrics_from_jsonl(&name, &text) {
        Ok(rows) => PageAction::ImportedRun(name, rows),
        Err(e) => PageAction::ImportFailed(e.to_string()),
    }
}

/// One curve of an imported run: the rows where `value` is known.
fn curve(
    rows: &[MetricRow],
    label: &str,
    class: &'static str,
    value: fn(&MetricRow) -> Option<f64>,
) -> Series {
    Series {
        label: label.into(),
        class,
        points: rows
            .iter()
            .filter_map(|r| Some((r.step as f64, value(r)?)))
            .collect(),
    }
}

#[function_component(Files)]
pub fn files(props: &FilesProps) -> Html {
    let on_config = {
        let d = props.dispatch.clone();
        Callback::from(move |e: Event| read_file(e, d.clone(), config_action))
    };
    let on_measurement = {
        let d = props.dispatch.clone();
        Callback::from(move |e: Event| read_file(e, d.clone(), measurement_action))
    };
    let on_metrics = {
        let d = props.dispatch.clone();
        Callback::from(move |e: Event| read_file(e, d.clone(), metrics_action))
    };
    html! {
        <section class="panel" id="files">
            <h2>{ "Your own model or measurement" }</h2>
            <label for="config-file">{ "A Hugging Face config.json (Llama family) to predict: " }
                <input type="file" id="config-file" accept=".json,application/json" onchange={on_config} />
            </label>
            <label for="measurement-file">{ "A report from `napkin measure --json` on a real machine: " }
                <input type="file" id="measurement-file" accept=".json,application/json" onchange={on_measurement} />
            </label>
            <label for="metrics-file">{ "The metrics.jsonl of a `napkin train` run: " }
                <input type="file" id="metrics-file" accept=".jsonl,.json,application/json" onchange={on_metrics} />
            </label>
            if let Some(error) = &props.error {
                <p class="error" id="import-error">{ error }</p>
            }
            if let Some(imported) = &props.imported {
                <p class="note">{ format!("{}: measured on {} ({:.0} GFLOP/s, {:.0} GB/s)", imported.0, imported.1.this_machine.name, imported.1.this_machine.f32_flops / 1e9, imported.1.this_machine.bandwidth / 1e9) }</p>
                <MeasuredTable report={Rc::new(imported.1.clone())} />
            }
            if let Some(run) = &props.imported_run {
                <p class="note" id="imported-run">{ format!("{}: {} steps", run.0, run.1.iter().filter(|r| r.loss.is_some()).count()) }</p>
                <CurveChart id="imported-loss" title="loss per step of the imported run" y_name="nats / token"
                    series={vec![curve(&run.1, "training loss", "c-train", |r| r.loss), curve(&run.1, "held-out loss", "c-eval", |r| r.eval_loss)]} />
                <CurveChart id="imported-lr" title="learning rate per step of the imported run" y_name="lr"
                    series={vec![curve(&run.1, "learning rate", "c-train", |r| r.lr)]} />
            }
        </section>
    }
}
