//! `napkin measure`'s engine: runs real training steps of a scenario and puts each measured
//! number beside the predictor's — the resident parameters, the activations each block keeps,
//! the gradients, the optimizer state, the step's peak and its time — with a timeline of
//! events that exports as Chrome Trace Event JSON (open it in Perfetto or chrome://tracing).
//!
//! The JSON of [`MeasurementReport`] is the shape the browser app reads.

use web_time::Instant;

use burn::tensor::{Device, Distribution, Tensor};
use serde::{Deserialize, Serialize};

use crate::data::MicroBatch;
use crate::device::link::{self, LinkBytes};
use crate::error::{Error, Result};
use crate::kernels::fused::kernels_on;
use crate::memory::meter::{Meter, MeterMethod};
use crate::model::autocast::{autocast, half_dtype, linear_matmul};
use crate::model::{Llama, TokenBatch, causal_lm_loss};
use crate::predict::inventory::{Kind, Scenario, inventory, kept_by_layer, totals_by_kind};
use crate::predict::link::step_link;
use crate::predict::offload::host_transfer;
use crate::predict::sharding::Offload;
use crate::predict::time::{DevicePreset, RooflineTime, roofline, step_work};
use crate::predict::timeline::step_timeline;
use crate::train::{
    Optimizer, OptimizerConfig, StepOptions, forward_backward, forward_backward_marked,
};

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
    /// (`device::link`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_per_step: Option<LinkBytes>,
    /// On a GPU: the host → device bytes of the last step beside `predict::link`'s (when it
    /// predicts them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_up: Option<Comparison>,
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

/// The timeline being recorded.
struct Recorder {
    start: Instant,
    events: Vec<TraceEvent>,
}

impl Recorder {
    fn now_us(&self) -> f64 {
        self.start.elapsed().as_secs_f64() * 1e6
    }

    fn counter(&mut self, bytes: u64) {
        let ts = self.now_us();
        self.events.push(TraceEvent {
            name: "memory".into(),
            ph: "C".into(),
            ts,
            dur: None,
            pid: 1,
            tid: 1,
            args: Some(serde_json::json!({ "bytes": bytes })),
        });
    }

    fn span(&mut self, name: String, from_us: f64) {
        let ts = self.now_us();
        self.events.push(TraceEvent {
            name,
            ph: "X".into(),
            ts: from_us,
            dur: Some(ts - from_us),
            pid: 1,
            tid: 1,
            args: None,
        });
    }
}

/// How hard to probe this machine for the roofline: the GEMM's size and the copy's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MachineProbe {
    /// n of the n×n×n f32 GEMM.
    pub gemm_n: usize,
    /// Bytes copied to measure the memory bandwidth.
    pub copy_bytes: usize,
}

impl MachineProbe {
    /// A native machine: 1024³ GEMM, 256 MiB copy.
    pub const NATIVE: MachineProbe = MachineProbe {
        gemm_n: 1024,
        copy_bytes: 256 << 20,
    };
    /// A browser tab (one thread, a 32-bit address space): 256³ GEMM, 16 MiB copy.
    pub const BROWSER: MachineProbe = MachineProbe {
        gemm_n: 256,
        copy_bytes: 16 << 20,
    };
}

/// Measures this machine's attainable f32 GEMM rate (best of 4) on `device` and its memory
/// bandwidth (a copy, best of 3), for the roofline.
pub fn this_machine(device: &Device, probe: MachineProbe) -> DevicePreset {
    let n = probe.gemm_n;
    let a: Tensor<2> = Tensor::random([n, n], Distribution::Default, device);
    let b: Tensor<2> = Tensor::random([n, n], Distribution::Default, device);
    let mut best_gemm = f64::INFINITY;
    for _ in 0..4 {
        let t = Instant::now();
        let c = linear_matmul(a.clone(), b.clone());
        // `into_data` does not wait on the GPU backends (the bytes are read when first
        // touched): a sync does.
        let _ = device.sync();
        drop(c);
        best_gemm = best_gemm.min(t.elapsed().as_secs_f64());
    }
    let flops = 2.0 * (n * n * n) as f64 / best_gemm;
    let src = vec![1u8; probe.copy_bytes];
    let mut dst = vec![0u8; probe.copy_bytes];
    let mut best_copy = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&dst);
        best_copy = best_copy.min(t.elapsed().as_secs_f64());
    }
    let bandwidth = 2.0 * src.len() as f64 / best_copy; // read + write
    DevicePreset {
        id: "this-machine".into(),
        name: "this machine (measured)".into(),
        f32_flops: flops,
        half_flops: flops,
        bandwidth,
        memory: f64::INFINITY,
        link_bytes_per_second: None,
    }
}

/// A randomly initialised model of `s` with its tricks applied as training sees them (the NF4
/// base, then the LoRA adapters), on the autodiff `device`: what the sandbox trains and what
/// `napkin measure --preset` measures.
pub fn random_model(s: &Scenario, device: &Device) -> Result<Llama> {
    // An NF4 base is quantized block by block as it is made: no f32 copy of the whole model.
    let mut model = match &s.nf4 {
        Some(nf4) => Llama::init_nf4(&s.config, device, nf4)?,
        None => Llama::init(&s.config, device),
    };
    model.attention = s.attention;
    if let Some(lora) = &s.lora {
        model = model.with_lora(lora)?;
    }
    if s.half_base() {
        model = model.cast_frozen_base(half_dtype(device));
    }
    Ok(model)
}

/// Deterministic token rows for `micro` (ids spread over the vocabulary; memory and time do
/// not depend on the text).
pub fn synthetic_micro_batches(s: &Scenario) -> Result<Vec<MicroBatch>> {
    let v = s.config.vocab_size;
    micro_batches_of(s, |m, r, i| ((i * 31 + r * 101 + m * 7 + 1) % v) as u32)
}

/// The scenario's micro-batches (accumulation × B × T) with `token(micro, row, position)`.
pub fn micro_batches_of(
    s: &Scenario,
    token: impl Fn(usize, usize, usize) -> u32,
) -> Result<Vec<MicroBatch>> {
    (0..s.accumulation.max(1))
        .map(|m| {
            let rows: Vec<Vec<u32>> = (0..s.micro_batch)
                .map(|r| (0..s.seq_len).map(|i| token(m, r, i)).collect())
                .collect();
            Ok(MicroBatch::causal(TokenBatch::from_rows(&rows)?))
        })
        .collect()
}

/// Builds the model with `build` (its resident bytes are measured; it opens the autodiff
/// device itself), then runs `steps` optimizer steps of `s` on synthetic tokens and compares
/// every number with the predictor. `device` is the plain (non-autodiff) device; `probe` sizes
/// the machine measurement behind the roofline. With `offload_to`, the optimizer keeps its
/// state and master weights on that host device, whose bytes the counting allocator measures
/// (it must be the global allocator, and `device` must not be a CPU backend). The prediction
/// replays the element-wise layers as `device` runs them ([`kernels_on`]).
pub fn measure(
    s: &Scenario,
    device: &Device,
    steps: usize,
    probe: MachineProbe,
    offload_to: Option<Device>,
    build: impl FnOnce() -> Result<Llama>,
) -> Result<MeasurementReport> {
    let s = &Scenario {
        kernels: kernels_on(device),
        ..s.clone()
    };
    let mut meter = Meter::for_device(device)?;
    // Mixed precision: every forward and backward below (recomputations included) runs its
    // linear layers in 16 bits, as the trainer's do.
    let precision = autocast(s.half_compute.then(|| half_dtype(device)));
    if offload_to.is_some() && meter.method() != MeterMethod::DevicePool {
        return Err(Error::Input(
            "offload needs a device with its own memory (wgpu or cuda): on a CPU backend the \
             optimizer state is in host memory already"
                .into(),
        ));
    }
    let mut host_meter = match offload_to {
        Some(_) => Some(Meter::host()?),
        None => None,
    };
    let mut rec = Recorder {
        start: Instant::now(),
        events: Vec::new(),
    };
    let predicted = totals_by_kind(&inventory(s));
    let kind = |k: Kind| predicted.get(&k).copied().unwrap_or(0);
    let timeline = step_timeline(s);

    // Resident parameters.
    let before = meter.live();
    rec.counter(before);
    let t = rec.now_us();
    let mut model = build()?;
    let resident = meter.live().saturating_sub(before);
    rec.span("load model".into(), t);
    rec.counter(resident + before);
    let micro = synthetic_micro_batches(s)?;

    // One unmeasured forward and backward first: the backends' one-time buffers (GEMM packing
    // workspaces, thread pools) are allocated then and held for good, not per block.
    drop(forward_backward(&model, &micro[..1], &StepOptions::default())?.read());

    // Activations each block keeps: one plain forward with its graph, block by block.
    let kept = kept_by_layer(&inventory(s));
    let mut layers = Vec::new();
    {
        let batch = &micro[0].batch;
        let start = meter.live();
        let t = rec.now_us();
        let ctx = model.context(batch);
        let mut x = model.embed(batch);
        let mut last = meter.live();
        for (l, block) in model.layers.iter().enumerate() {
            let tl = rec.now_us();
            x = block.forward(x, &ctx.rope, &ctx.mask);
            let now = meter.live();
            rec.span(format!("forward.layers.{l}"), tl);
            rec.counter(now);
            layers.push(Comparison::new(
                format!("layers.{l}"),
                kept.get(&Some(l)).copied().unwrap_or(0),
                now.saturating_sub(last),
            ));
            last = now;
        }
        let loss = causal_lm_loss(model.head(x), &micro[0].labels)?;
        drop(ctx);
        let all = meter.live().saturating_sub(start);
        rec.span("forward (graph kept, measured per block)".into(), t);
        rec.counter(all + start);
        // Dropping the loss leaves burn's graph registered until some backward cleans it:
        // run this one's backward so the steps below start clean.
        drop(loss.sum.backward());
        // The loss keeps the logits for its backward: they count here (the inventory lists
        // them as their own kind).
        layers.push(Comparison::new(
            "all (incl. head, logits and loss)",
            kind(Kind::SavedActivations) + kind(Kind::Logits),
            all,
        ));
    }

    // Training steps.
    let optimizer_config = OptimizerConfig {
        kind: s.optimizer,
        ..OptimizerConfig::default()
    };
    let mut optimizer = match offload_to {
        Some(host) => Optimizer::offloaded(&optimizer_config, host),
        None => Optimizer::new(&optimizer_config),
    };
    let mut host_held = 0u64;
    let mut traffic_after_first = Default::default();
    let mut step_peak = 0u64;
    let mut grads_held = 0u64;
    let mut optimizer_state = 0u64;
    let mut seconds = Vec::new();
    let mut link_per_step = None;
    for step in 0..steps.max(1) {
        let link_before = link::counted();
        let between = meter.live();
        let host_between = host_meter.as_mut().map_or(0, Meter::live);
        let t0 = rec.now_us();
        let clock = Instant::now();
        let start = meter.start_peak();
        // A device pool is read between operations only: mark it where the step holds most.
        let pooled = meter.method() == MeterMethod::DevicePool;
        let out = forward_backward_marked(
            &model,
            &micro,
            &StepOptions::default().with_checkpointing(s.checkpointing),
            &mut || {
                if pooled {
                    meter.live();
                }
            },
        )?
        .read();
        if !out.loss.is_finite() {
            return Err(Error::Input(format!(
                "step {step}: the loss is {}",
                out.loss
            )));
        }
        step_peak = step_peak.max(meter.peak().saturating_sub(start));
        if step == 0 {
            grads_held = meter.live().saturating_sub(start);
        }
        rec.span(format!("step {step}: forward + backward"), t0);
        rec.counter(meter.live());
        let t1 = rec.now_us();
        model = optimizer.step(model, &out.grads, 1e-4);
        drop(out);
        let _ = device.sync(); // the optimizer's kernels are queued, not done, on a GPU
        seconds.push(clock.elapsed().as_secs_f64());
        link_per_step = link::is_across_link(device).then(|| link::counted().since(&link_before));
        rec.span(format!("step {step}: optimizer"), t1);
        let after = meter.live();
        rec.counter(after);
        if step == 0 {
            optimizer_state = after.saturating_sub(between);
            if let (Some(host), Some(offload)) = (host_meter.as_mut(), optimizer.offload()) {
                host_held = host.live().saturating_sub(host_between);
                traffic_after_first = offload.traffic();
            }
        }
    }
    let offload = optimizer.offload().map(|o| {
        let predicted = host_transfer(s, &inventory(s), Offload::OPTIMIZER);
        let total = o.traffic();
        // Per step: the steps after the first (which also copied each parameter to the host
        // once to start its master copy); with one step, that step less the master copies.
        let later = seconds.len().saturating_sub(1) as u64;
        let (to_host, to_device) = match later {
            0 => (total.to_host - o.master_bytes(), total.to_device),
            later => (
                (total.to_host - traffic_after_first.to_host) / later,
                (total.to_device - traffic_after_first.to_device) / later,
            ),
        };
        OffloadMeasurement {
            host_method: MeterMethod::CountingAllocator,
            host: Comparison::new(
                "host: optimizer state + f32 master weights",
                predicted.host_bytes,
                host_held,
            ),
            to_host: Comparison::new(
                "link per step, device → host (gradients)",
                predicted.to_host,
                to_host,
            ),
            to_device: Comparison::new(
                "link per step, host → device (updated weights)",
                predicted.to_device,
                to_device,
            ),
        }
    });

    let mut kinds = vec![
        Comparison::new(
            "parameters (weights, NF4 codes and scales, adapters)",
            kind(Kind::Weights)
                + kind(Kind::QuantCodes)
                + kind(Kind::QuantScales)
                + kind(Kind::Adapters),
            resident,
        ),
        Comparison::new("gradients", kind(Kind::Gradients), grads_held),
        if offload.is_some() {
            Comparison::new(
                "optimizer state on the device (offloaded)",
                0,
                optimizer_state,
            )
        } else {
            Comparison::new(
                "optimizer state",
                kind(Kind::OptimizerState),
                optimizer_state,
            )
        },
    ];
    if let Some(all) = layers.last() {
        kinds.push(Comparison::new(
            "saved activations",
            all.predicted,
            all.measured,
        ));
    }
    drop(precision);
    let machine = this_machine(device, probe);
    let predicted_time = roofline(
        &step_work(s),
        (s.tokens() * s.accumulation.max(1) as u64) as f64,
        &machine,
        false,
    );
    let mut sorted: Vec<f64> = seconds
        .iter()
        .skip(usize::from(seconds.len() > 1))
        .copied()
        .collect();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    let median = if sorted.len().is_multiple_of(2) {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    } else {
        sorted[mid]
    };
    Ok(MeasurementReport {
        method: meter.method(),
        method_description: format!(
            "{}; the prediction replays {}",
            meter.method().describe(),
            s.kernels
        ),
        kinds,
        layers,
        step_peak: Comparison::new(
            "step peak (forward + backward)",
            timeline.peak.bytes - timeline.persistent,
            step_peak,
        ),
        predicted_peak_at: timeline.peak.label,
        time: TimeComparison {
            efficiency: predicted_time.step_seconds / median,
            predicted: predicted_time,
            measured_seconds: seconds,
            measured_median_seconds: median,
        },
        this_machine: machine,
        trace: rec.events,
        offload,
        link_up: link_per_step
            .zip(step_link(s))
            .map(|(measured, predicted)| {
                Comparison::new(
                    "host → device per step (batch; weights resident)",
                    predicted.up(),
                    // Optimizer offload's traffic is compared on its own (`offload`).
                    measured.weights_up + measured.data_up,
                )
            }),
        link_per_step,
    })
}
