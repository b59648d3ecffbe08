//! The Web Worker's entry points: `worker.js` loads a module and calls [`train_in_worker`]
//! (the page's own module, burn Flex on the CPU) or `train_on_webgpu` (the second module, built
//! with the `webgpu` feature and fetched only when a learner picks WebGPU) with a JSON
//! [`TrainRequest`]; each [`TrainEvent`] goes back as JSON through the `post` callback (the
//! worker's `postMessage`). Both return a promise that settles when the run ends. The
//! real-model mode's entry points are `teach_in_worker` (the third module, `teach`: CPU) and
//! `teach_on_webgpu` (the WebGPU module, built with `webgpu` and `teach`).

use wasm_bindgen::prelude::*;

#[cfg(feature = "teach")]
use crate::real_model::{RealModelRequest, run_real_model};
use crate::training::{TrainBackend, TrainEvent, TrainRequest, run_training};

/// The CPU backend the browser build trains on, in words.
const CPU_BACKEND: &str = "burn Flex on the CPU (WebAssembly, one thread)";

/// Panics print to the browser console with their message (the default is "unreachable").
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        web_sys::console::error_1(&JsValue::from_str(&info.to_string()));
    }));
}

/// Sends each event as JSON through `post`.
fn emitter(post: &js_sys::Function) -> impl FnMut(TrainEvent) + '_ {
    move |event: TrainEvent| {
        let json = serde_json::to_string(&event).unwrap_or_else(|e| {
            format!(r#"{{"event":"failed","message":"unserialisable event: {e}"}}"#)
        });
        // A closed page cannot receive; nothing else to do with the error.
        let _ = post.call1(&JsValue::NULL, &JsValue::from_str(&json));
    }
}

/// The request in `json` (`what` names its kind in the message), or a `failed` event saying
/// why it is not one.
fn parse_request<T: serde::de::DeserializeOwned>(
    json: &str,
    what: &str,
    emit: &mut dyn FnMut(TrainEvent),
) -> Option<T> {
    match serde_json::from_str(json) {
        Ok(request) => Some(request),
        Err(e) => {
            emit(TrainEvent::Failed {
                message: format!("not a {what}: {e}"),
            });
            None
        }
    }
}

/// Runs one training request on the CPU; never throws for bad input (it reports `failed`).
#[wasm_bindgen]
pub async fn train_in_worker(request_json: String, post: js_sys::Function) {
    install_panic_hook();
    let mut emit = emitter(&post);
    let Some(mut request) =
        parse_request::<TrainRequest>(&request_json, "training request", &mut emit)
    else {
        return;
    };
    request.backend = TrainBackend::Cpu;
    let device = napkin_core::device::cpu();
    if let Err(e) = run_training(&request, &device, CPU_BACKEND, &mut emit).await {
        emit(TrainEvent::Failed {
            message: e.to_string(),
        });
    }
}

/// Runs the real-model mode on the GGUF file's `bytes` (fetched from the sandbox's server or
/// read from a file the learner picked; `name` stands for it in messages), on the CPU; never
/// throws for bad input (it reports `failed`). Only in the real-model module (`teach`).
#[cfg(all(feature = "teach", not(feature = "webgpu")))]
#[wasm_bindgen]
pub async fn teach_in_worker(
    request_json: String,
    name: String,
    bytes: Vec<u8>,
    post: js_sys::Function,
) {
    install_panic_hook();
    let mut emit = emitter(&post);
    let Some(request) =
        parse_request::<RealModelRequest>(&request_json, "real-model request", &mut emit)
    else {
        return;
    };
    let device = napkin_core::device::cpu();
    if let Err(e) = run_real_model(&request, &name, bytes, &device, CPU_BACKEND, &mut emit).await {
        emit(TrainEvent::Failed {
            message: e.to_string(),
        });
    }
}

/// The real-model mode on the browser's WebGPU (`adapter`: the adapter in words, as
/// `worker.js` read it). Only in the WebGPU module, which is built with `teach` too.
#[cfg(all(feature = "teach", feature = "webgpu"))]
#[wasm_bindgen]
pub async fn teach_on_webgpu(
    request_json: String,
    name: String,
    bytes: Vec<u8>,
    adapter: String,
    post: js_sys::Function,
) {
    install_panic_hook();
    let mut emit = emitter(&post);
    let Some(request) =
        parse_request::<RealModelRequest>(&request_json, "real-model request", &mut emit)
    else {
        return;
    };
    let Some(device) = webgpu_device(&mut emit).await else {
        return;
    };
    let backend = format!("burn wgpu on WebGPU (adapter: {adapter})");
    if let Err(e) = run_real_model(&request, &name, bytes, &device, &backend, &mut emit).await {
        emit(TrainEvent::Failed {
            message: e.to_string(),
        });
    }
}

/// The browser's WebGPU device, or a `failed` event that says it could not start.
#[cfg(feature = "webgpu")]
async fn webgpu_device(emit: &mut dyn FnMut(TrainEvent)) -> Option<burn::tensor::Device> {
    match burn::tensor::Device::wgpu_options().init_async().await {
        Ok(device) => Some(device),
        Err(e) => {
            emit(TrainEvent::Failed {
                message: format!("WebGPU could not start here ({e}); train on the CPU instead"),
            });
            None
        }
    }
}

/// Runs one training request on the browser's WebGPU (`adapter`: the adapter in words, as
/// `worker.js` read it); a browser without WebGPU gets a `failed` event that says so.
#[cfg(feature = "webgpu")]
#[wasm_bindgen]
pub async fn train_on_webgpu(request_json: String, adapter: String, post: js_sys::Function) {
    install_panic_hook();
    let mut emit = emitter(&post);
    let Some(mut request) =
        parse_request::<TrainRequest>(&request_json, "training request", &mut emit)
    else {
        return;
    };
    request.backend = TrainBackend::WebGpu;
    let Some(device) = webgpu_device(&mut emit).await else {
        return;
    };
    let backend = format!("burn wgpu on WebGPU (adapter: {adapter})");
    if let Err(e) = run_training(&request, &device, &backend, &mut emit).await {
        emit(TrainEvent::Failed {
            message: e.to_string(),
        });
    }
}
