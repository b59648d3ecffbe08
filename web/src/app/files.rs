//! Files from the learner's disk, read in the page (nothing is uploaded): a Hugging Face
//! `config.json` becomes the selected model; a `napkin measure --json` report from a real
//! machine is shown beside the prediction.

use std::rc::Rc;

use napkin_core::memory::measure::MeasurementReport;
use wasm_bindgen_futures::{JsFuture, spawn_local};
use web_sys::HtmlInputElement;
use yew::prelude::*;

use super::charts::MeasuredTable;
use crate::import::{config_from_json, measurement_from_json};
use crate::page::PageAction;
use crate::state::Action;

#[derive(Properties, PartialEq)]
pub struct FilesProps {
    pub imported: Option<Rc<(String, MeasurementReport)>>,
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
    html! {
        <section class="panel" id="files">
            <h2>{ "Your own model or measurement" }</h2>
            <label for="config-file">{ "A Hugging Face config.json (Llama family) to predict: " }
                <input type="file" id="config-file" accept=".json,application/json" onchange={on_config} />
            </label>
            <label for="measurement-file">{ "A report from `napkin measure --json` on a real machine: " }
                <input type="file" id="measurement-file" accept=".json,application/json" onchange={on_measurement} />
            </label>
            if let Some(error) = &props.error {
                <p class="error" id="import-error">{ error }</p>
            }
            if let Some(imported) = &props.imported {
                <p class="note">{ format!("{}: measured on {} ({:.0} GFLOP/s, {:.0} GB/s)", imported.0, imported.1.this_machine.name, imported.1.this_machine.f32_flops / 1e9, imported.1.this_machine.bandwidth / 1e9) }</p>
                <MeasuredTable report={Rc::new(imported.1.clone())} />
            }
        </section>
    }
}
