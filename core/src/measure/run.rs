//! [`measure`] in its phases: the resident parameters as the model is built, the activations
//! each block keeps, the training steps (peak, gradients, optimizer state, time, link), then
//! each measured number put beside the predictor's.

use web_time::Instant;

use burn::tensor::Device;

use super::inputs::synthetic_micro_batches;
use super::machine::{MachineProbe, this_machine};
use super::trace::Recorder;
use super::{Comparison, MeasurementReport, OffloadMeasurement, TimeComparison};
use crate::data::MicroBatch;
use crate::device::link::{self, LinkBytes};
use crate::device::{memory_alignment, row_layout_on};
use crate::error::{Error, Result};
use crate::kernels::cpu::fused::kernels_on;
use crate::memory::inner_marks::InnerMarks;
use crate::memory::meter::{Meter, MeterMethod};
use crate::model::autocast::{autocast, half_dtype};
use crate::model::chunked_loss::chunked_lm_loss;
use crate::model::{Llama, causal_lm_loss};
use crate::predict::inventory::{Kind, Scenario, inventory, kept_by_layer, totals_by_kind};
use crate::predict::link::{held_by_recorded_step, step_link};
use crate::predict::offload::host_transfer;
use crate::predict::sharding::Offload;
use crate::predict::time::{roofline, step_work};
use crate::predict::timeline::step_timeline;
use crate::train::captured::{Capturing, RunFacts, Update};
use crate::train::step::recomputes_blocks;
use crate::train::{
    LinkTraffic, Optimizer, OptimizerConfig, StepOptions, forward_backward, forward_backward_marked,
};

/// Builds the model with `build` (its resident bytes are measured; it opens the autodiff
/// device itself), then runs `steps` optimizer steps of `s` on synthetic tokens and compares
/// every number with the predictor. `device` is the plain (non-autodiff) device; `probe` sizes
/// the machine measurement behind the roofline. With `offload_to`, the optimizer keeps its
/// state and master weights on that host device, whose bytes the counting allocator measures
/// (it must be the global allocator, and `device` must not be a CPU backend). The prediction
/// replays the element-wise layers as `device` runs them ([`kernels_on`]) and lays rows out as
/// its allocator does ([`row_layout_on`]).
pub fn measure(
    s: &Scenario,
    device: &Device,
    steps: usize,
    probe: MachineProbe,
    offload_to: Option<Device>,
    build: impl FnOnce() -> Result<Llama>,
) -> Result<MeasurementReport> {
    measure_with(s, device, steps, probe, offload_to, false, build)
}

/// [`measure`], with the steps after the first replayed from a device graph when `capture`
/// is set and the scenario allows it on this device (`train/captured.rs`, as `napkin train`
/// runs them): the first step, op by op, is the one whose memory is metered; the later ones
/// give the step time. The report says how many steps were replayed.
pub fn measure_with(
    s: &Scenario,
    device: &Device,
    steps: usize,
    probe: MachineProbe,
    offload_to: Option<Device>,
    capture: bool,
    build: impl FnOnce() -> Result<Llama>,
) -> Result<MeasurementReport> {
    let s = &Scenario {
        kernels: kernels_on(device),
        rows: row_layout_on(device),
        ..s.clone()
    };
    let mut meter = Meter::for_device(device)?;
    // Mixed precision: every forward and backward below (recomputations included) runs its
    // linear layers (and on a GPU the attention) in 16 bits, as the trainer's do.
    let precision = autocast(s.half_compute.then(|| half_dtype(device)));
    if offload_to.is_some() && meter.method() != MeterMethod::DevicePool {
        return Err(Error::Input(
            "offload needs a device with its own memory (wgpu or cuda): on a CPU backend the \
             optimizer state is in host memory already"
                .into(),
        ));
    }
    let mut rec = Recorder::new();
    let predicted = totals_by_kind(&inventory(s));
    let kind = |k: Kind| predicted.get(&k).copied().unwrap_or(0);
    let timeline = step_timeline(s);

    let (model, resident) = resident_parameters(&mut meter, &mut rec, build)?;
    let micro = synthetic_micro_batches(s)?;
    // One unmeasured forward and backward first: the backends' one-time buffers (GEMM packing
    // workspaces, thread pools) are allocated then and held for good, not per block.
    drop(forward_backward(&model, &micro[..1], &StepOptions::default())?.read());
    let (mut layers, all) = kept_per_block(s, &model, &micro[0], &mut meter, &mut rec)?;
    // The loss keeps the logits for its backward: they count in the forward's total (the
    // inventory lists them as their own kind).
    layers.push(Comparison::new(
        "all (incl. head, logits and loss)",
        kind(Kind::SavedActivations) + kind(Kind::Logits),
        all,
    ));
    let run = training_steps(
        s, model, &micro, device, steps, offload_to, capture, &mut meter, &mut rec,
    )?;

    let parameters = kind(Kind::Weights)
        + kind(Kind::QuantCodes)
        + kind(Kind::QuantScales)
        + kind(Kind::Adapters);
    let mut kinds = vec![
        Comparison::new(
            "parameters (weights, NF4 codes and scales, adapters)",
            parameters,
            resident,
        ),
        Comparison::new("gradients", kind(Kind::Gradients), run.grads_held),
        if run.offload.is_some() {
            Comparison::new(
                "optimizer state on the device (offloaded)",
                0,
                run.optimizer_state,
            )
        } else {
            Comparison::new(
                "optimizer state",
                kind(Kind::OptimizerState),
                run.optimizer_state,
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
    let median = median_after_first(&run.seconds);
    Ok(MeasurementReport {
        method: meter.method(),
        method_description: format!(
            "{}; the prediction replays {}",
            meter.method().describe(),
            s.kernels.describe()
        ),
        kinds,
        layers,
        step_peak: Comparison::new(
            "step peak (forward + backward)",
            timeline.peak.bytes - timeline.persistent,
            run.step_peak,
        ),
        predicted_peak_at: timeline.peak.label,
        time: TimeComparison {
            efficiency: predicted_time.step_seconds / median,
            predicted: predicted_time,
            measured_seconds: run.seconds,
            measured_median_seconds: median,
        },
        this_machine: machine,
        trace: rec.events,
        offload: run.offload,
        link_up: run
            .link_per_step
            .zip(step_link(s))
            .map(|(measured, predicted)| {
                Comparison::new(
                    "host → device per step (batch; weights resident)",
                    predicted.up(),
                    // Optimizer offload's traffic is compared on its own (`offload`).
                    measured.weights_up + measured.data_up,
                )
            }),
        link_per_step: run.link_per_step,
        replayed_steps: run.replayed_steps,
        not_captured: run.not_captured,
        held_by_graph: run.held_by_graph.map(|held| {
            Comparison::new(
                "held while replaying (gradients, the kept inputs, AdamW's scalars)",
                kind(Kind::Gradients)
                    + held_by_recorded_step(s, memory_alignment(device).unwrap_or(1)).unwrap_or(0),
                held,
            )
        }),
    })
}

/// Phase 1: the bytes the model holds once `build` has made it.
fn resident_parameters(
    meter: &mut Meter,
    rec: &mut Recorder,
    build: impl FnOnce() -> Result<Llama>,
) -> Result<(Llama, u64)> {
    let before = meter.live();
    rec.counter(before);
    let t = rec.now_us();
    let model = build()?;
    let resident = meter.live().saturating_sub(before);
    rec.span("load model".into(), t);
    rec.counter(resident + before);
    Ok((model, resident))
}

/// Phase 2: the activations each block keeps, from one plain forward with its graph read
/// block by block, and the bytes the whole forward kept (head, logits and loss included).
fn kept_per_block(
    s: &Scenario,
    model: &Llama,
    micro: &MicroBatch,
    meter: &mut Meter,
    rec: &mut Recorder,
) -> Result<(Vec<Comparison>, u64)> {
    let kept = kept_by_layer(&inventory(s));
    let mut layers = Vec::new();
    let batch = &micro.batch;
    let start = meter.live();
    let t = rec.now_us();
    let ctx = model.context(batch);
    let mut x = model.embed(batch);
    let mut last = meter.live();
    for (l, block) in model.layers.iter().enumerate() {
        let tl = rec.now_us();
        // The block's input stays held until its bytes are read: where nothing keeps it (block
        // 0's, under LoRA, comes from the frozen embedding) the forward would free it, and
        // the block's growth would come out one `[B, T, D]` short of what the block keeps.
        let input = x.clone();
        x = block.forward(x, &ctx.rope, &ctx.mask);
        let now = meter.live();
        rec.span(format!("forward.layers.{l}"), tl);
        rec.counter(now);
        layers.push(Comparison::new(
            format!("layers.{l}"),
            kept.get(&Some(l)).copied().unwrap_or(0),
            now.saturating_sub(last),
        ));
        drop(input);
        last = meter.live();
    }
    let loss = match s.loss_chunk_rows() {
        Some(rows) => chunked_lm_loss(model, x, &micro.labels, rows)?.0,
        None => causal_lm_loss(model.head(x), &micro.labels)?.sum,
    };
    drop(ctx);
    let all = meter.live().saturating_sub(start);
    rec.span("forward (graph kept, measured per block)".into(), t);
    rec.counter(all + start);
    // Dropping the loss leaves burn's graph registered until some backward cleans it: run
    // this one's backward so the steps that follow start clean.
    drop(loss.backward());
    Ok((layers, all))
}

/// The learning rate of `measure`'s steps (their updates are timed, not trained for).
const LEARNING_RATE: f64 = 1e-4;

/// What phase 3 measured.
struct StepsMeasured {
    /// The largest step peak above the memory held between steps.
    step_peak: u64,
    /// Gradients held after the first step's backward.
    grads_held: u64,
    /// The optimizer state the first update allocated on the device.
    optimizer_state: u64,
    /// Each step's seconds (forward, backward, update).
    seconds: Vec<f64>,
    /// On a GPU: the last step's host-link bytes.
    link_per_step: Option<LinkBytes>,
    /// With offload: host bytes and link traffic beside the prediction.
    offload: Option<OffloadMeasurement>,
    /// Steps replayed from a recorded device graph.
    replayed_steps: usize,
    /// Why a capture asked for on a GPU did not happen.
    not_captured: Option<String>,
    /// On a device pool, with replayed steps: the bytes in use after the last replay above
    /// those in use before the recording (the recording's kept inputs and the step's buffers
    /// its graph holds).
    held_by_graph: Option<u64>,
}

/// Phase 3: `steps` optimizer steps (at least one), each forward and backward metered where
/// it holds the most, then the update.
#[allow(clippy::too_many_arguments)]
fn training_steps(
    s: &Scenario,
    mut model: Llama,
    micro: &[MicroBatch],
    device: &Device,
    steps: usize,
    offload_to: Option<Device>,
    capture: bool,
    meter: &mut Meter,
    rec: &mut Recorder,
) -> Result<StepsMeasured> {
    let mut host_meter = match offload_to {
        Some(_) => Some(Meter::host()?),
        None => None,
    };
    let optimizer_config = OptimizerConfig {
        kind: s.optimizer,
        ..OptimizerConfig::default()
    };
    let mut optimizer = match offload_to {
        Some(host) => Optimizer::offloaded(&optimizer_config, host),
        None => Optimizer::new(&optimizer_config),
    };
    let mut host_held = 0u64;
    let mut traffic_after_first = LinkTraffic::default();
    let mut out = StepsMeasured {
        step_peak: 0,
        grads_held: 0,
        optimizer_state: 0,
        seconds: Vec::new(),
        link_per_step: None,
        offload: None,
        replayed_steps: 0,
        not_captured: None,
        held_by_graph: None,
    };
    let mut before_recording = None;
    let mut capturing = Capturing::plan(&RunFacts {
        model: &model,
        on_gpu: crate::device::is_gpu(device),
        wanted: capture,
        supervised: true,
        lora_dropout: s.lora.as_ref().map_or(0.0, |l| l.dropout),
        efficient_attention: s.attention == crate::config::AttentionKind::Efficient,
        loss_chunk_rows: s.loss_chunk_rows(),
        loss_scaling: false,
        adamw_on_device: s.optimizer == crate::config::OptimizerKind::AdamW
            && optimizer.offload().is_none(),
    });
    let recomputes = recomputes_blocks(&model, s.checkpointing);
    for step in 0..steps.max(1) {
        // From the second step on, a replay of the step recorded once (forward, backward and
        // AdamW's update; measure's learning rate, no clipping), timed as a whole.
        let clock = Instant::now();
        let link_before = link::counted();
        let mut update = Update {
            optimizer: &mut optimizer,
            lr: LEARNING_RATE,
            max_grad_norm: 0.0,
        };
        let recording = capturing.will_record();
        if recording && meter.method() == MeterMethod::DevicePool {
            before_recording = Some(meter.live());
        }
        if let Some(replayed) = capturing.step(&model, &mut update, micro, recomputes, 1)? {
            if !replayed.loss.is_finite() {
                return Err(Error::Input(format!(
                    "step {step}: the loss is {}",
                    replayed.loss
                )));
            }
            let _ = device.sync();
            out.seconds.push(clock.elapsed().as_secs_f64());
            // The recording's step also uploads the buffers the graph keeps its inputs in,
            // once for the run: a step's traffic is a later replay's, or the op-by-op one's.
            if !recording {
                out.link_per_step =
                    link::is_across_link(device).then(|| link::counted().since(&link_before));
            }
            out.replayed_steps += 1;
            out.held_by_graph = before_recording.map(|b| meter.live().saturating_sub(b));
            continue;
        }
        let between = meter.live();
        let host_between = host_meter.as_mut().map_or(0, Meter::live);
        let t0 = rec.now_us();
        let start = meter.start_peak();
        // A device pool is read between operations only: mark it where the step holds most,
        // after each forward that keeps a graph and, in the first step, inside the backward
        // (each NF4 product, each attention score block). Every mark waits for the device, so
        // the steps whose times make the median (all but the first) take the few outer ones
        // only; the first step's forward and backward hold what the others do (the optimizer
        // state it adds afterwards is part of the later steps' starting bytes).
        let pooled = meter.method() == MeterMethod::DevicePool;
        let inner = (pooled && step == 0)
            .then(|| InnerMarks::arm(device))
            .flatten();
        let grads = forward_backward_marked(
            &model,
            micro,
            &StepOptions::default()
                .with_checkpointing(s.checkpointing)
                .with_loss_chunk_rows(s.loss_chunk_rows()),
            &mut || {
                if pooled {
                    meter.live();
                }
            },
        )?
        .read();
        if let Some(inner) = inner {
            meter.include_mark(inner.largest());
        }
        if !grads.loss.is_finite() {
            return Err(Error::Input(format!(
                "step {step}: the loss is {}",
                grads.loss
            )));
        }
        out.step_peak = out.step_peak.max(meter.peak().saturating_sub(start));
        if step == 0 {
            out.grads_held = meter.live().saturating_sub(start);
        }
        rec.span(format!("step {step}: forward + backward"), t0);
        rec.counter(meter.live());
        let t1 = rec.now_us();
        model = optimizer.step(model, &grads.grads, LEARNING_RATE);
        drop(grads);
        let _ = device.sync(); // the optimizer's kernels are queued, not done, on a GPU
        out.seconds.push(clock.elapsed().as_secs_f64());
        out.link_per_step =
            link::is_across_link(device).then(|| link::counted().since(&link_before));
        rec.span(format!("step {step}: optimizer"), t1);
        let after = meter.live();
        rec.counter(after);
        if step == 0 {
            out.optimizer_state = after.saturating_sub(between);
            if let (Some(host), Some(offload)) = (host_meter.as_mut(), optimizer.offload()) {
                host_held = host.live().saturating_sub(host_between);
                traffic_after_first = offload.traffic();
            }
        }
    }
    // The plan's reason, or a later one (recording failed); a replayed run's note only says
    // that it was captured.
    let note = capturing.take_note();
    if out.replayed_steps == 0 {
        out.not_captured = note;
    }
    out.offload = optimizer.offload().map(|o| {
        let predicted = host_transfer(s, &inventory(s), Offload::OPTIMIZER);
        let total = o.traffic();
        // Per step: the steps after the first (which also copied each parameter to the host
        // once to start its master copy); with one step, that step less the master copies.
        let later = out.seconds.len().saturating_sub(1) as u64;
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
    Ok(out)
}

/// The median step time after the first (which includes one-time allocations), or the only
/// step's.
fn median_after_first(seconds: &[f64]) -> f64 {
    let mut sorted: Vec<f64> = seconds
        .iter()
        .skip(usize::from(seconds.len() > 1))
        .copied()
        .collect();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len().is_multiple_of(2) {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    } else {
        sorted[mid]
    }
}
