//! The Web Worker's entry point: `worker.js` loads this same module and calls
//! [`train_in_worker`] with a JSON [`TrainRequest`]; each [`TrainEvent`] goes back as JSON
//! through the `post` callback (the worker's `postMessage`).

use wasm_bindgen::prelude::*;

use crate::training::{TrainEvent, TrainRequest, run_training};

/// The backend the browser build trains on, in words.
const BACKEND: &str = "burn Flex on the CPU (WebAssembly, one thread)";

/// Panics print to the browser console with their message (the default is "unreachable").
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        web_sys::console::error_1(&JsValue::from_str(&info.to_string()));
    }));
}

/// Runs one training request; never throws for bad input (it reports `failed`).
#[wasm_bindgen]
pub fn train_in_worker(request_json: &str, post: &js_sys::Function) {
    install_panic_hook();
    let mut emit = |event: TrainEvent| {
        let json = serde_json::to_string(&event).unwrap_or_else(|e| {
            format!(r#"{{"event":"failed","message":"unserialisable event: {e}"}}"#)
        });
        // A closed page cannot receive; nothing else to do with the error.
        let _ = post.call1(&JsValue::NULL, &JsValue::from_str(&json));
    };
    let request: TrainRequest = match serde_json::from_str(request_json) {
        Ok(r) => r,
        Err(e) => {
            emit(TrainEvent::Failed {
                message: format!("not a training request: {e}"),
            });
            return;
        }
    };
    let device = napkin_core::device::cpu();
    if let Err(e) = run_training(&request, &device, BACKEND, &mut emit) {
        emit(TrainEvent::Failed {
            message: e.to_string(),
        });
    }
}
