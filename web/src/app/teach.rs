//! "Teach a real model": SmolLM2-135M-Instruct, fetched from the sandbox's server (or picked
//! from disk; nothing leaves the machine), taught the learner's question/answer pairs with
//! QLoRA in the worker; the question answered before and after, the loss, tokens per second,
//! and the memory measured beside the prediction per block and per kind.

use std::rc::Rc;

use wasm_bindgen::JsValue;
use wasm_bindgen_futures::{JsFuture, spawn_local};
use web_sys::{HtmlInputElement, HtmlSelectElement, HtmlTextAreaElement};
use yew::prelude::*;

use super::charts::{LossChart, MeasuredTable};
use super::format::{bytes, seconds};
use super::run::{
    WorkerSlot, browser_has_webgpu, download_line, status_name, stop_button, worker_in,
};
use crate::page::{Job, LessonField, PageAction, Run, RunStatus};
use crate::real_model::{LessonDraft, REAL_MODEL_FILE, REAL_MODEL_URL, RealModelRequest};
use crate::training::{AnswerStage, TrainBackend};

/// What the worker calls the model file in its `downloading` events (`worker.js`).
const MODEL_DOWNLOAD: &str = "the model";

#[derive(Properties, PartialEq)]
pub struct TeachPanelProps {
    pub lesson: LessonDraft,
    pub run: Rc<Run>,
    pub dispatch: Callback<PageAction>,
}

/// The worker's message: the request and either the file the learner picked (transferred,
/// not copied) or the server's address for it.
fn post_lesson(
    slot: &WorkerSlot,
    dispatch: &Callback<PageAction>,
    request: &RealModelRequest,
    backend: TrainBackend,
    file: Option<(String, js_sys::ArrayBuffer)>,
) {
    let fail = |m: String| dispatch.emit(PageAction::WorkerError(Job::Real, m));
    let json = match serde_json::to_string(request) {
        Ok(json) => json,
        Err(e) => return fail(e.to_string()),
    };
    if !worker_in(slot, Job::Real, dispatch) {
        return;
    }
    let message = js_sys::Object::new();
    let set = |key: &str, value: &JsValue| {
        let _ = js_sys::Reflect::set(&message, &JsValue::from_str(key), value);
    };
    set("job", &JsValue::from_str("teach"));
    set("request", &JsValue::from_str(&json));
    let backend = match backend {
        TrainBackend::Cpu => "cpu",
        TrainBackend::WebGpu => "web_gpu",
    };
    set("backend", &JsValue::from_str(backend));
    let transfer = js_sys::Array::new();
    match file {
        Some((name, buffer)) => {
            set("name", &JsValue::from_str(&name));
            set("file", &buffer);
            transfer.push(&buffer);
        }
        None => {
            set("name", &JsValue::from_str(REAL_MODEL_FILE));
            set("url", &JsValue::from_str(REAL_MODEL_URL));
        }
    }
    let slot = slot.borrow();
    let Some(h) = slot.as_ref() else { return };
    dispatch.emit(PageAction::TrainStarted(Job::Real));
    if let Err(e) = h.worker.post_message_with_transfer(&message, &transfer) {
        fail(format!("{e:?}"));
    }
}

#[function_component(TeachPanel)]
pub fn teach_panel(props: &TeachPanelProps) -> Html {
    let handle: WorkerSlot = use_mut_ref(|| None);
    let picked: Rc<std::cell::RefCell<Option<web_sys::File>>> = use_mut_ref(|| None);
    let backend = use_state(|| TrainBackend::Cpu);
    let on_gpu = *backend == TrainBackend::WebGpu;
    let on_backend = {
        let backend = backend.clone();
        Callback::from(move |e: Event| {
            let select: HtmlSelectElement = e.target_unchecked_into();
            backend.set(match select.value().as_str() {
                "web_gpu" => TrainBackend::WebGpu,
                _ => TrainBackend::Cpu,
            });
        })
    };
    let has_webgpu = browser_has_webgpu();
    let run = &props.run;
    let running = run.status == RunStatus::Running;
    let request = props.lesson.request();
    let edit = |field: LessonField| {
        let dispatch = props.dispatch.clone();
        Callback::from(move |e: InputEvent| {
            let value = match field {
                LessonField::Pairs => e.target_unchecked_into::<HtmlTextAreaElement>().value(),
                _ => e.target_unchecked_into::<HtmlInputElement>().value(),
            };
            dispatch.emit(PageAction::EditLesson(field, value));
        })
    };
    let on_file = {
        let picked = picked.clone();
        Callback::from(move |e: Event| {
            let input: HtmlInputElement = e.target_unchecked_into();
            *picked.borrow_mut() = input.files().and_then(|f| f.get(0));
        })
    };
    let onclick = {
        let handle = handle.clone();
        let picked = picked.clone();
        let dispatch = props.dispatch.clone();
        let request = request.clone();
        let backend = *backend;
        Callback::from(move |_| {
            let Ok(request) = request.clone() else { return };
            let file = picked.borrow().clone();
            let (handle, dispatch) = (handle.clone(), dispatch.clone());
            match file {
                None => post_lesson(&handle, &dispatch, &request, backend, None),
                Some(file) => spawn_local(async move {
                    match JsFuture::from(file.array_buffer()).await {
                        Ok(buffer) => post_lesson(
                            &handle,
                            &dispatch,
                            &request,
                            backend,
                            Some((file.name(), buffer.into())),
                        ),
                        Err(e) => dispatch.emit(PageAction::WorkerError(
                            Job::Real,
                            format!("{}: could not be read: {e:?}", file.name()),
                        )),
                    }
                }),
            }
        })
    };
    let status = match &run.status {
        RunStatus::Idle => "not started".to_string(),
        RunStatus::Running if run.loaded.is_none() => match &run.download {
            Some(d) if d.arriving() => download_line(d),
            Some(d) if d.what == MODEL_DOWNLOAD && run.report.is_none() && !on_gpu => {
                "measuring one step of the real model…".into()
            }
            Some(d) if d.what == MODEL_DOWNLOAD => {
                "loading the model for training (NF4 + adapters)…".into()
            }
            _ => "starting…".into(),
        },
        RunStatus::Running if run.answers.is_empty() => "answering the question…".into(),
        RunStatus::Running if run.answers.len() == 1 && !run.losses.is_empty() => {
            format!("training: step {}", run.losses.len())
        }
        RunStatus::Running if run.answers.len() == 1 => "training: first step…".into(),
        RunStatus::Running => "answering again…".into(),
        RunStatus::Finished => format!("finished: {} steps", run.losses.len()),
        RunStatus::Failed(m) => format!("failed: {m}"),
        RunStatus::Stopped => format!("stopped after {} steps", run.losses.len()),
    };
    html! {
        <section class="panel" id="teach">
            <h2>{ "Teach a real model" }</h2>
            <p class="note">{ "SmolLM2-135M-Instruct (135 M parameters, its GGUF file from the sandbox's server, about 98 MB) is quantized to NF4 with double quantization in the worker and taught your pairs with LoRA r 8 on all seven block linears and gradient checkpointing, on the CPU (one thread) or on WebGPU. One step of the real model is measured against the prediction first. Nothing leaves this machine." }</p>
            <label for="lesson-pairs">{ "Pairs to learn (Q: then A:, a blank line between pairs)" }</label>
            <textarea id="lesson-pairs" rows="8" disabled={running} value={props.lesson.pairs.clone()} oninput={edit(LessonField::Pairs)} />
            <label for="lesson-question">{ "Question to ask before and after" }</label>
            <input id="lesson-question" type="text" disabled={running} value={props.lesson.question.clone()} oninput={edit(LessonField::Question)} />
            <label for="lesson-steps">{ "Steps" }</label>
            <input id="lesson-steps" type="number" min="1" max="200" disabled={running} value={props.lesson.steps.clone()} oninput={edit(LessonField::Steps)} />
            if let Err(message) = &request {
                <p id="lesson-error" class="error" role="alert">{ message.clone() }</p>
            }
            <label for="teach-device">{ "Train on " }
                <select id="teach-device" disabled={running} onchange={on_backend}>
                    <option value="cpu" selected={!on_gpu}>{ "the CPU (WebAssembly, one thread)" }</option>
                    <option value="web_gpu" selected={on_gpu} disabled={!has_webgpu}>
                        { if has_webgpu { "WebGPU (loads the WebGPU module: 32 MB, 3.2 MB compressed)" } else { "WebGPU (not offered by this browser)" } }
                    </option>
                </select>
            </label>
            if on_gpu {
                <p class="note">{ "On WebGPU the per-block measurement is skipped (it reads the worker's heap); what stays between steps is read from the GPU's memory pool. A software adapter (SwiftShader) is far slower than the CPU module: try one step first." }</p>
            }
            <label for="model-file">{ "The model file (leave empty to load it from the sandbox's server): " }
                <input id="model-file" type="file" accept=".gguf" disabled={running} onchange={on_file} />
            </label>
            <button id="teach-button" disabled={running || request.is_err()} {onclick}>{ "Teach" }</button>
            if running {
                { stop_button(&handle, Job::Real, &props.dispatch, "teach-stop") }
            }
            <p id="teach-status" role="status" aria-live="polite" data-status={status_name(&run.status)}>{ status }</p>
            if let Some(d) = run.download.as_ref().filter(|d| d.arriving() && running) {
                <progress id="model-download" aria-label={d.what.clone()} value={d.loaded.to_string()} max={d.total.map(|t| t.to_string())} />
            }
            if let Some(backend) = &run.backend {
                <p id="teach-backend">{ format!("Backend: {backend}") }</p>
            }
            if let Some(l) = run.loaded {
                <p id="teach-loaded" data-seconds={format!("{:.2}", l.seconds)}>{ format!("Loaded {} parameters from {} in {}", l.parameters, bytes(l.file_bytes as f64), seconds(l.seconds)) }</p>
            }
            if !run.answers.is_empty() {
                <table id="answers">
                    <caption>{ format!("“{}”", props.lesson.question.trim()) }</caption>
                    <thead><tr><th scope="col">{ "when" }</th><th scope="col">{ "answer" }</th><th scope="col">{ "seconds" }</th></tr></thead>
                    <tbody>
                        { for run.answers.iter().map(|a| {
                            let when = match a.stage { AnswerStage::Before => "before", AnswerStage::After => "after" };
                            html! {
                                <tr class={format!("answer-{when}")} data-taught-loss={a.taught_answer_loss.map(|l| format!("{l:.4}")).unwrap_or_default()}>
                                    <th scope="row">{ when }</th>
                                    <td class="answer-text">{ a.answer.clone() }</td>
                                    <td>{ format!("{:.1}", a.seconds) }</td>
                                </tr>
                            }
                        }) }
                    </tbody>
                </table>
            }
            if !run.losses.is_empty() {
                <LossChart id="teach-loss-chart" losses={run.losses.clone()} />
                <p id="teach-losses" data-losses={run.losses.iter().map(|l| format!("{l:.4}")).collect::<Vec<_>>().join(",")}>
                    { format!("loss {:.3} → {:.3}", run.losses[0], run.losses[run.losses.len() - 1]) }
                </p>
            }
            if let Some(tps) = run.tokens_per_second {
                <p id="teach-tokens-per-second" data-value={format!("{tps:.1}")}>{ format!("{tps:.1} answer tokens/s (the loss is on the answers only)") }</p>
            }
            if let Some(r) = run.resident {
                <p id="teach-resident" data-predicted={r.predicted.to_string()} data-measured={r.measured.to_string()}>
                    { format!("Kept between steps (embedding, NF4 codes and scales, adapters, AdamW's moments): predicted {}, measured {} ({:.3}×)", bytes(r.predicted as f64), bytes(r.measured as f64), r.measured as f64 / (r.predicted.max(1)) as f64) }
                </p>
            }
            if let Some(report) = &run.report {
                <div id="teach-measured">
                    <MeasuredTable report={Rc::new(report.clone())} />
                </div>
            }
        </section>
    }
}
