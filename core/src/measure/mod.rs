//! `napkin measure`'s engine: runs real training steps of a scenario and puts each measured
//! number beside the predictor's — the resident parameters, the activations each block keeps,
//! the gradients, the optimizer state, the step's peak and its time — with a timeline of
//! events that exports as Chrome Trace Event JSON (open it in Perfetto or chrome://tracing).
//!
//! The JSON of [`MeasurementReport`] is the shape the browser app reads.
//!
//! - `run.rs`: [`measure`] in its phases (resident parameters, kept activations per block,
//!   the training steps, the comparisons);
//! - `inputs.rs`: the random model and the synthetic micro-batches it runs;
//! - `machine.rs`: this machine's GEMM rate and bandwidth for the roofline;
//! - `gemm_rate.rs`: one product shape's GEMM throughput (the native and in-page benchmarks);
//! - `trace.rs`: the Chrome trace it records.

mod gemm_rate;
mod inputs;
mod machine;
mod run;
mod trace;

use serde::{Deserialize, Serialize};

pub use gemm_rate::{
    GemmFigure, GemmShape, PAGE_GEMM_SHAPES, Product, gemm_gflops, page_gemm_figures,
};
pub use inputs::{micro_batches_of, random_model, synthetic_micro_batches};
pub use machine::{MachineProbe, this_machine};
pub use run::{measure, measure_with};

use crate::device::link::LinkBytes;
use crate::memory::meter::MeterMethod;
use crate::predict::time::{DevicePreset, RooflineTime};

/// A predicted number beside the measured one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// What (a kind, a block, the peak).
    pub name: String,
    /// Predicted bytes.
    pub predicted: u64,
    /// Measured bytes.
    pub measured: u64,
    /// measured / predicted.
    pub ratio: f64,
}

impl Comparison {
    fn new(name: impl Into<String>, predicted: u64, measured: u64) -> Self {
        Comparison {
            name: name.into(),
            predicted,
            measured,
            ratio: measured as f64 / predicted.max(1) as f64,
        }
    }
}

/// One Chrome Trace Event: a span (`ph: "X"`) or a counter sample (`ph: "C"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceEvent {
    /// Span or counter name.
    pub name: String,
    /// `X` (complete span) or `C` (counter).
    pub ph: String,
    /// Start, microseconds since the measurement began.
    pub ts: f64,
    /// Duration in microseconds (spans).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dur: Option<f64>,
    /// Process id (always 1).
    pub pid: u32,
    /// Thread id (always 1).
    pub tid: u32,
    /// Counter values (`bytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<serde_json::Value>,
}

/// Step time: the roofline bound on this machine against the measured median.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimeComparison {
    /// The roofline on this machine's measured GEMM rate and bandwidth.
    pub predicted: RooflineTime,
    /// Measured step seconds, in order (the first includes one-time allocations).
    pub measured_seconds: Vec<f64>,
    /// The median of the measured steps after the first (or the only one).
    pub measured_median_seconds: f64,
    /// predicted / measured: the fraction of the roofline bound the engine reaches.
    pub efficiency: f64,
}

/// Everything `napkin measure` reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasurementReport {
    /// How memory was measured.
    pub method: MeterMethod,
    /// The method in words.
    pub method_description: String,
    /// Per kind: resident parameters, gradients, optimizer state, saved activations.
    pub kinds: Vec<Comparison>,
    /// Activations each block keeps for the backward (one plain forward with its graph).
    pub layers: Vec<Comparison>,
    /// The step's peak above the memory held between steps.
    pub step_peak: Comparison,
    /// Where the predictor puts the peak.
    pub predicted_peak_at: String,
    /// Step time.
    pub time: TimeComparison,
    /// This machine as measured for the roofline.
    pub this_machine: DevicePreset,
    /// The timeline (Chrome Trace Event JSON's `traceEvents`).
    pub trace: Vec<TraceEvent>,
    /// With the optimizer offloaded: host memory and link traffic, predicted and measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offload: Option<OffloadMeasurement>,
    /// On a GPU: the bytes the last step moved over the host link, counted at each transfer
    /// (`device::link`); not the recording step's (it also uploads the graph's kept input
    /// buffers, once for the run), the step before it then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_per_step: Option<LinkBytes>,
    /// On a GPU: the host → device bytes of the last step beside `predict::link`'s (when it
    /// predicts them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_up: Option<Comparison>,
    /// Steps replayed from a device graph recorded once (`measure_with`'s capture; 0: every
    /// step op by op).
    #[serde(default)]
    pub replayed_steps: usize,
    /// Why the steps ran op by op though a capture was asked for on a GPU (a preference
    /// objective, LoRA dropout, an offloaded optimizer, …; `train/captured.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_captured: Option<String>,
    /// On a device pool, with replayed steps: the bytes in use after the last replay above
    /// those before the recording, beside [`crate::predict::link::held_by_recorded_step`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_by_graph: Option<Comparison>,
}

/// Optimizer offload as measured: the host's bytes (counting allocator) and the bytes copied
/// across the link (counted at each copy), beside the predictor's
/// ([`crate::predict::offload::host_transfer`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OffloadMeasurement {
    /// How the host bytes were measured.
    pub host_method: MeterMethod,
    /// Optimizer state and f32 master weights, held in host memory between steps.
    pub host: Comparison,
    /// Device → host bytes per optimizer step (gradients).
    pub to_host: Comparison,
    /// Host → device bytes per optimizer step (updated parameters).
    pub to_device: Comparison,
}

impl MeasurementReport {
    /// The Chrome Trace Event JSON document.
    pub fn chrome_trace(&self) -> serde_json::Value {
        serde_json::json!({ "traceEvents": self.trace, "displayTimeUnit": "ms" })
    }
}
