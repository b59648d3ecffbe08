//! napkin-web: the browser sandbox. The state (`state.rs`: plain data, an action enum, a
//! reducer, the view model from napkin-core's predictor), the training job the page runs in a
//! Web Worker (`training.rs`) and the import of `napkin measure` JSON (`import.rs`) are plain
//! Rust, tested natively; the chart geometry is napkin-core's (`report::chart`, shared with
//! `napkin report`); the yew components (`app/`), the worker's entry point (`worker.rs`) and the
//! page's GEMM benchmark (`bench.rs`) exist only in the WebAssembly build.

pub mod import;
pub mod page;
pub mod real_model;
pub mod state;
pub mod training;

// The WebGPU and real-model modules only train (the page's own module renders), so they carry
// no components.
#[cfg(all(
    target_arch = "wasm32",
    not(feature = "webgpu"),
    not(feature = "teach")
))]
mod app;
#[cfg(all(
    target_arch = "wasm32",
    not(feature = "webgpu"),
    not(feature = "teach")
))]
mod bench;
#[cfg(target_arch = "wasm32")]
mod worker;

/// Memory is measured by counting every allocation, in the browser as in the native tests.
#[cfg(target_arch = "wasm32")]
#[global_allocator]
static ALLOCATOR: napkin_core::memory::CountingAllocator = napkin_core::memory::CountingAllocator;
