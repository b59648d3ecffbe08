//! "Train in this tab": starts the training run in a Web Worker (the page never freezes),
//! shows its backend, losses, tokens per second and memory; the measured per-layer numbers
//! go to the memory chart.

use std::cell::RefCell;
use std::rc::Rc;

use napkin_core::memory::meter::MeterMethod;
use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;
use web_sys::{HtmlSelectElement, MessageEvent, Worker, WorkerOptions, WorkerType};
use yew::prelude::*;

use super::charts::LossChart;
use super::format::bytes;
use crate::page::{Download, Job, PageAction, Run, RunStatus};
use crate::state::SandboxState;
use crate::training::{TRAINABLE_PRESETS, TrainBackend, TrainEvent, TrainRequest};

#[derive(Properties, PartialEq)]
pub struct TrainPanelProps {
    pub state: SandboxState,
    pub backend: TrainBackend,
    pub run: Rc<Run>,
    pub dispatch: Callback<PageAction>,
}

/// The panel's worker, started if there is none; a `failed` action if it cannot be.
pub(super) fn worker_in(slot: &WorkerSlot, job: Job, dispatch: &Callback<PageAction>) -> bool {
    let mut slot = slot.borrow_mut();
    if slot.is_none() {
        match spawn_worker(job, dispatch.clone()) {
            Ok(h) => *slot = Some(h),
            Err(message) => {
                dispatch.emit(PageAction::WorkerError(job, message));
                return false;
            }
        }
    }
    true
}

/// "Stop": ends the worker at once (the run's memory goes with it) and leaves the page usable;
/// the next run starts a fresh worker.
pub(super) fn stop_button(
    slot: &WorkerSlot,
    job: Job,
    dispatch: &Callback<PageAction>,
    id: &'static str,
) -> Html {
    let onclick = {
        let slot = slot.clone();
        let dispatch = dispatch.clone();
        Callback::from(move |_| {
            if let Some(h) = slot.borrow_mut().take() {
                h.worker.terminate();
            }
            dispatch.emit(PageAction::Stopped(job));
        })
    };
    html! { <button {id} class="stop" {onclick}>{ "Stop" }</button> }
}

/// A download in progress, in words.
pub(super) fn download_line(d: &Download) -> String {
    match d.total {
        Some(total) => format!(
            "downloading {}: {} of {}",
            d.what,
            bytes(d.loaded as f64),
            bytes(total as f64)
        ),
        None => format!("downloading {}: {}", d.what, bytes(d.loaded as f64)),
    }
}

/// The status line's `data-status`: the status's name in lower case.
pub(super) fn status_name(status: &RunStatus) -> String {
    format!("{status:?}")
        .split('(')
        .next()
        .unwrap_or("")
        .to_lowercase()
}

/// Whether this browser offers WebGPU at all (`navigator.gpu`); the adapter is asked for when
/// a run starts.
pub(super) fn browser_has_webgpu() -> bool {
    web_sys::window()
        .map(|w| js_sys::Reflect::has(&w.navigator(), &JsValue::from_str("gpu")).unwrap_or(false))
        .unwrap_or(false)
}

/// The worker and the closure that receives its messages (kept alive together).
pub(super) struct WorkerHandle {
    pub(super) worker: Worker,
    _on_message: Closure<dyn FnMut(MessageEvent)>,
}

/// The slot a panel keeps its worker in (started on the first run, ended by "stop").
pub(super) type WorkerSlot = Rc<RefCell<Option<WorkerHandle>>>;

/// A worker whose messages become `job`'s actions.
pub(super) fn spawn_worker(
    job: Job,
    dispatch: Callback<PageAction>,
) -> Result<WorkerHandle, String> {
    let options = WorkerOptions::new();
    options.set_type(WorkerType::Module);
    let worker = Worker::new_with_options("./worker.js", &options)
        .map_err(|e| format!("could not start the training worker: {e:?}"))?;
    let on_message = Closure::<dyn FnMut(MessageEvent)>::new(move |e: MessageEvent| {
        let action = match e.data().as_string() {
            Some(json) => match serde_json::from_str::<TrainEvent>(&json) {
                Ok(event) => PageAction::Train(job, event),
                Err(err) => {
                    PageAction::WorkerError(job, format!("unreadable worker message: {err}"))
                }
            },
            None => PageAction::WorkerError(job, "the worker sent a non-text message".into()),
        };
        dispatch.emit(action);
    });
    worker.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    Ok(WorkerHandle {
        worker,
        _on_message: on_message,
    })
}

#[function_component(TrainPanel)]
pub fn train_panel(props: &TrainPanelProps) -> Html {
    let handle: WorkerSlot = use_mut_ref(|| None);
    let trainable = TRAINABLE_PRESETS.contains(&props.state.preset.as_str());
    let running = props.run.status == RunStatus::Running;
    let onclick = {
        let handle = handle.clone();
        let dispatch = props.dispatch.clone();
        let state = props.state.clone();
        let backend = props.backend;
        Callback::from(move |_| {
            if !worker_in(&handle, Job::Tiny, &dispatch) {
                return;
            }
            let slot = handle.borrow();
            let Some(h) = slot.as_ref() else { return };
            let request = TrainRequest {
                backend,
                ..TrainRequest::new(state.clone())
            };
            match serde_json::to_string(&request) {
                Ok(json) => {
                    dispatch.emit(PageAction::TrainStarted(Job::Tiny));
                    if let Err(e) = h.worker.post_message(&JsValue::from_str(&json)) {
                        dispatch.emit(PageAction::WorkerError(Job::Tiny, format!("{e:?}")));
                    }
                }
                Err(e) => dispatch.emit(PageAction::WorkerError(Job::Tiny, e.to_string())),
            }
        })
    };
    let on_backend = {
        let dispatch = props.dispatch.clone();
        Callback::from(move |e: Event| {
            let select: HtmlSelectElement = e.target_unchecked_into();
            let backend = match select.value().as_str() {
                "web_gpu" => TrainBackend::WebGpu,
                _ => TrainBackend::Cpu,
            };
            dispatch.emit(PageAction::SelectBackend(backend));
        })
    };
    let has_webgpu = browser_has_webgpu();
    let run = &props.run;
    let status = match &run.status {
        RunStatus::Idle => "not started".to_string(),
        RunStatus::Running if run.losses.is_empty() && run.backend.is_none() => {
            "starting…".to_string()
        }
        RunStatus::Running if run.losses.is_empty() && props.backend == TrainBackend::Cpu => {
            "measuring one step…".to_string()
        }
        RunStatus::Running if run.download.as_ref().is_some_and(|d| d.arriving()) => {
            run.download.as_ref().map(download_line).unwrap_or_default()
        }
        RunStatus::Running if run.losses.is_empty() => "building the model…".to_string(),
        RunStatus::Running => format!("training: step {}", run.losses.len()),
        RunStatus::Finished => format!("finished: {} steps", run.losses.len()),
        RunStatus::Failed(m) => format!("failed: {m}"),
        RunStatus::Stopped => format!("stopped after {} steps", run.losses.len()),
    };
    html! {
        <section class="panel" id="train">
            <h2>{ "Train in this tab" }</h2>
            if trainable {
                <p class="note">{ format!("Measures one step with these settings (T capped at {}), then trains 20 steps on a repeating token cycle, in a Web Worker.", crate::training::MAX_TRAIN_SEQ_LEN) }</p>
            } else {
                <p class="note">{ format!("{} is predict-only here; pick {} to train in the page.", props.state.preset, TRAINABLE_PRESETS.join(", ")) }</p>
            }
            <label for="train-backend">{ "Train on " }
                <select id="train-backend" disabled={running} onchange={on_backend}>
                    <option value="cpu" selected={props.backend == TrainBackend::Cpu}>{ "the CPU (WebAssembly)" }</option>
                    <option value="web_gpu" selected={props.backend == TrainBackend::WebGpu} disabled={!has_webgpu}>
                        { if has_webgpu { "WebGPU (loads a second, larger module)" } else { "WebGPU (not offered by this browser)" } }
                    </option>
                </select>
            </label>
            if props.backend == TrainBackend::WebGpu {
                <p class="note">{ "On WebGPU the per-block measurement is skipped (it reads the worker's heap); the GPU's memory pool is read after each step instead. 8-bit AdamW and offload read back every step and are CPU-only here." }</p>
            }
            <button id="train-button" disabled={!trainable || running} onclick={onclick}>{ "Measure and train" }</button>
            if running {
                { stop_button(&handle, Job::Tiny, &props.dispatch, "train-stop") }
            }
            <p id="train-status" role="status" aria-live="polite" data-status={status_name(&run.status)}>{ status }</p>
            if let Some(backend) = &run.backend {
                <p id="backend">{ format!("Backend: {backend}") }</p>
            }
            if !run.losses.is_empty() {
                <LossChart losses={run.losses.clone()} />
                <p id="losses" data-losses={run.losses.iter().map(|l| format!("{l:.4}")).collect::<Vec<_>>().join(",")}>
                    { format!("loss {:.3} → {:.3}", run.losses[0], run.losses[run.losses.len() - 1]) }
                </p>
            }
            if let Some(tps) = run.tokens_per_second {
                <p id="tokens-per-second" data-value={format!("{tps:.1}")}>{ format!("{tps:.0} tokens/s") }</p>
            }
            if let Some(live) = run.live_bytes {
                <p class="note" id="live-bytes" data-value={live.to_string()}>{ format!("{} after the last step: {}", memory_name(run.memory_method), bytes(live as f64)) }</p>
            }
            if let Some(r) = run.resident {
                <p id="resident" data-predicted={r.predicted.to_string()} data-measured={r.measured.to_string()} data-host-side={r.host_side.to_string()}>
                    { format!("Kept between steps (weights, adapters, optimizer state): predicted {}, measured {} ({:.3}×)", bytes(r.predicted as f64), bytes(r.measured as f64), r.measured as f64 / (r.predicted.max(1)) as f64) }
                    if r.host_side > 0 {
                        { format!("; NF4 codes and scales on the GPU, dequantized there; a host copy for saving: {}", bytes(r.host_side as f64)) }
                    }
                </p>
            }
        </section>
    }
}

/// What the live figure measures, in words.
fn memory_name(method: Option<MeterMethod>) -> &'static str {
    match method {
        Some(MeterMethod::DevicePool) => "GPU memory pool in use",
        _ => "Worker heap",
    }
}
