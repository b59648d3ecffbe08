//! The replay of PyTorch's CUDA caching allocator (`predict::pytorch::caching_allocator`)
//! against the allocator itself: each case of `measured-cuda.json` was measured in a process of
//! its own with the allocator's history recorded (`measure.py --fresh --traces`), and its every
//! allocation and free, in order, is replayed here. The replay must end holding the segments
//! PyTorch held when `memory_reserved()` was read, make the `cudaMalloc`s it made, and reach
//! the step's `max_memory_allocated()`.
//!
//! A trace covers the whole process: cuBLAS's warm-up, loading the model, then three forwards
//! — a warm-up under `no_grad`, the first pass with saved-tensor hooks (what autograd saves),
//! and the measured step (forward and backward). The harness that recorded these traces kept
//! its first pass's saved tensors allocated through the step (fixed in `measure.py` since);
//! the second test shows it from the traces and replays what a process without it holds.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use napkin_core::config::LlamaConfig;
use napkin_core::predict::pytorch::TorchDevice;
use napkin_core::predict::pytorch::device_process::{self, AllocationReplay, Workspaces};
use napkin_core::predict::pytorch::llama;
use napkin_core::predict::pytorch::loading::{LoadEvent, load_events};
use napkin_core::predict::pytorch::tape::Allocation;
use serde_json::Value;

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/pytorch_profile")
}

/// One line of a trace.
#[derive(Debug, Clone, Copy)]
enum Event<'a> {
    /// `a ID BYTES`: an allocation.
    Alloc(&'a str, u64),
    /// `f ID`: its free.
    Free(&'a str),
    /// `s BYTES`: a segment's `cudaMalloc`.
    Segment,
    /// `e`: `empty_cache()`.
    EmptyCache,
}

fn parse(trace: &str) -> Vec<Event<'_>> {
    trace
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|line| match line.split(' ').collect::<Vec<_>>()[..] {
            ["a", id, bytes] => Event::Alloc(id, bytes.parse().expect("allocation bytes")),
            ["f", id] => Event::Free(id),
            ["s", _] => Event::Segment,
            ["e"] => Event::EmptyCache,
            _ => panic!("unreadable trace line {line:?}"),
        })
        .collect()
}

/// Where the harness's three forwards begin (indices into the events): each opens with the
/// embedding's output `[B, T, D]` and, three allocations later, `B` int64s (HF's position
/// bookkeeping), after the last `empty_cache()` (cuBLAS's warm-up).
fn forward_starts(case: &Value, events: &[Event<'_>]) -> Vec<usize> {
    let batch = case["batch"].as_u64().unwrap();
    let element = if case["settings"]["dtype"] == "bf16" {
        2
    } else {
        4
    };
    let embedded = batch
        * case["seq"].as_u64().unwrap()
        * case["config"]["hidden_size"].as_u64().unwrap()
        * element;
    let loaded = events
        .iter()
        .rposition(|e| matches!(e, Event::EmptyCache))
        .unwrap_or(0);
    let allocs: Vec<(usize, u64)> = events
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match e {
            Event::Alloc(_, bytes) => Some((i, *bytes)),
            _ => None,
        })
        .collect();
    allocs
        .windows(4)
        .filter(|w| w[0].0 > loaded && w[0].1 == embedded && w[3].1 == 8 * batch)
        .map(|w| w[0].0)
        .collect()
}

/// What one trace's replay ends with.
struct Replayed {
    reserved: u64,
    /// The maximum allocated during the step (the peak counters reset where it begins, as the
    /// harness does).
    step_max_allocated: u64,
    segment_mallocs: usize,
    /// The `cudaMalloc`s PyTorch recorded.
    measured_segment_mallocs: usize,
}

/// Replays `events`; the step begins at `step`. `freed_at_step`: allocations to free just
/// before it (what a harness without the leftover would have released).
fn replay(events: &[Event<'_>], step: usize, freed_at_step: &[&str]) -> Replayed {
    let mut r = Replay::default();
    for (i, &event) in events.iter().enumerate() {
        if i == step {
            for id in freed_at_step {
                let address = r
                    .trace_blocks
                    .remove(*id)
                    .expect("allocated before the step");
                r.device.allocator.free(address);
            }
            r.device.allocator.reset_peak_stats();
        }
        r.event(event);
    }
    Replayed {
        reserved: r.device.allocator.reserved(),
        step_max_allocated: r.device.allocator.max_allocated(),
        segment_mallocs: r.device.allocator.segment_mallocs(),
        measured_segment_mallocs: r.recorded_segments,
    }
}

/// The allocator replay fed a trace's events, the profile's allocations or a predicted load.
#[derive(Default)]
struct Replay {
    /// The allocator, with the blocks handed out by the prediction's ids.
    device: AllocationReplay,
    /// Blocks by the trace's ids.
    trace_blocks: HashMap<String, u64>,
    /// The `cudaMalloc`s the trace recorded.
    recorded_segments: usize,
}

impl Replay {
    fn event(&mut self, event: Event<'_>) {
        match event {
            Event::Alloc(id, bytes) => {
                self.trace_blocks
                    .insert(id.to_string(), self.device.allocator.malloc(bytes));
            }
            Event::Free(id) => {
                let address = self.trace_blocks.remove(id).expect("freed once");
                self.device.allocator.free(address);
            }
            Event::Segment => self.recorded_segments += 1,
            Event::EmptyCache => self.device.allocator.empty_cache(),
        }
    }

    fn allocation(&mut self, allocation: Allocation) {
        self.device.apply(allocation);
    }

    fn load(&mut self, event: LoadEvent) {
        match event {
            LoadEvent::Block(allocation) => self.allocation(allocation),
            LoadEvent::EmptyCache => self.device.allocator.empty_cache(),
        }
    }
}

/// Allocations made in `from..to` and never freed in the trace, with their bytes.
fn left_from(events: &[Event<'_>], from: usize, to: usize) -> Vec<(String, u64)> {
    let mut alive: HashMap<&str, (usize, u64)> = HashMap::new();
    for (i, event) in events.iter().enumerate() {
        match *event {
            Event::Alloc(id, bytes) => {
                alive.insert(id, (i, bytes));
            }
            Event::Free(id) => {
                alive.remove(id);
            }
            _ => {}
        }
    }
    let mut left: Vec<(usize, String, u64)> = alive
        .into_iter()
        .filter(|(_, (i, _))| (from..to).contains(i))
        .map(|(id, (i, bytes))| (i, id.to_string(), bytes))
        .collect();
    left.sort();
    left.into_iter().map(|(_, id, bytes)| (id, bytes)).collect()
}

/// cuBLAS's two workspaces, as `measure.py` measured them.
fn cublas_workspace_bytes() -> u64 {
    let text = std::fs::read_to_string(corpus().join("measured-cuda.json")).unwrap();
    let measured: Value = serde_json::from_str(&text).unwrap();
    measured["cublas_workspace_bytes"].as_u64().unwrap()
}

/// Every case of `measured-cuda.json` with its trace and the three forwards' starts.
fn traced_cases() -> Vec<(Value, String, Vec<usize>)> {
    let text = std::fs::read_to_string(corpus().join("measured-cuda.json")).unwrap();
    let measured: Value = serde_json::from_str(&text).unwrap();
    let mut cases = vec![];
    for case in measured["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let path = corpus().join("allocator").join(format!("{name}.txt"));
        let trace = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{name}: its trace {}: {e}", path.display()));
        let starts = forward_starts(case, &parse(&trace));
        assert_eq!(starts.len(), 3, "{name}: forwards found at {starts:?}");
        cases.push((case.clone(), trace, starts));
    }
    assert!(!cases.is_empty(), "no case in measured-cuda.json");
    cases
}

#[test]
fn the_allocator_replay_holds_the_segments_pytorch_held() {
    let mut failures = vec![];
    for (case, trace, starts) in traced_cases() {
        let name = case["name"].as_str().unwrap();
        let r = replay(&parse(&trace), starts[2], &[]);
        let reserved = case["reserved"].as_u64().unwrap();
        let max_allocated = case["max_allocated"].as_u64().unwrap();
        let line = format!(
            "{name:<26} reserved {:>13} replayed {:>13} ({:.4}); cudaMallocs {} replayed {}; step's max allocated {max_allocated} replayed {}",
            reserved,
            r.reserved,
            r.reserved as f64 / reserved as f64,
            r.measured_segment_mallocs,
            r.segment_mallocs,
            r.step_max_allocated,
        );
        println!("{line}");
        if r.reserved != reserved
            || r.segment_mallocs != r.measured_segment_mallocs
            || r.step_max_allocated != max_allocated
        {
            failures.push(line);
        }
    }
    assert!(
        failures.is_empty(),
        "replay differs:\n{}",
        failures.join("\n")
    );
}

/// The traces' harness kept its first pass's saved tensors allocated through the step: its
/// saved-tensor hook returned each tensor itself, and an op that saves its own output then
/// holds a tensor whose `grad_fn` is that op — a cycle outside Python's collector, which kept
/// the whole first graph alive. What the first pass leaves allocated is, to within the token ids
/// the caller holds anyway, exactly what it recorded as saved. Replaying each trace with those
/// blocks freed before the step gives what a clean process reserves (printed; the docs quote it).
#[test]
fn the_old_harness_kept_its_first_pass_allocated_through_the_step() {
    let mut failures = vec![];
    for (case, trace, starts) in traced_cases() {
        let name = case["name"].as_str().unwrap();
        let events = parse(&trace);
        let left = left_from(&events, starts[1], starts[2]);
        let left_bytes: u64 = left.iter().map(|(_, b)| b).sum();
        // Nothing of the no_grad warm-up stays; of the step, only the `.grad`s.
        let warm_up_left: u64 = left_from(&events, starts[0], starts[1])
            .iter()
            .map(|(_, b)| b)
            .sum();
        let step_left: u64 = left_from(&events, starts[2], events.len())
            .iter()
            .map(|(_, b)| b)
            .sum();
        let trainable = case["trainable_bytes"].as_u64().unwrap();
        // Checkpointed cases do not record what is saved (the checkpoint's hooks hide it).
        let saved = case["saved_per_layer"].as_array().map(|layers| {
            layers.iter().map(|b| b.as_u64().unwrap()).sum::<u64>()
                + case["saved_outside"].as_u64().unwrap()
        });
        let ids: Vec<&str> = left.iter().map(|(id, _)| id.as_str()).collect();
        let clean = replay(&events, starts[2], &ids);
        let measured = case["reserved"].as_u64().unwrap();
        let line = format!(
            "{name:<26} first pass left {left_bytes:>10} (saved {saved:?}); reserved {measured:>11} → {:>11} without it, step's max allocated {:>11}, ratio {:.3}",
            clean.reserved,
            clean.step_max_allocated,
            clean.reserved as f64 / clean.step_max_allocated as f64,
        );
        println!("{line}");
        // The rest of `saved` is storage allocated before the pass (the token ids): ≤ 0.2 %.
        // (A trace recorded by the fixed harness leaves nothing.)
        let leak_is_the_saved_set = left_bytes == 0
            || saved.is_none_or(|saved| left_bytes <= saved && saved - left_bytes <= saved / 500);
        if !leak_is_the_saved_set || warm_up_left != 0 || step_left != trainable {
            failures.push(format!(
                "{line}; warm-up left {warm_up_left}, step left {step_left} (trainable {trainable})"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A process that loads the model and runs the step, no warm-up passes: the trace without
/// the allocations (and their frees) made from the first forward to the step. Requests do not
/// depend on where earlier blocks went, so this is what the allocator held in such a process.
fn load_then_step<'a>(events: &[Event<'a>], starts: &[usize]) -> (Vec<Event<'a>>, usize) {
    let dropped: std::collections::HashSet<&str> = events[starts[0]..starts[2]]
        .iter()
        .filter_map(|e| match e {
            Event::Alloc(id, _) => Some(*id),
            _ => None,
        })
        .collect();
    let kept: Vec<Event<'a>> = events[..starts[0]]
        .iter()
        .chain(&events[starts[2]..])
        .copied()
        .filter(|e| !matches!(e, Event::Free(id) if dropped.contains(id)))
        .collect();
    (kept, starts[0])
}

/// What a replay holds when the step begins and after it.
struct StepReplay {
    reserved: u64,
    max_allocated: u64,
    /// Allocated when the step begins: cuBLAS's workspaces, the weights, what the load left.
    allocated_before: u64,
}

impl StepReplay {
    /// The step's own peak: its maximum allocated above what it began with.
    fn step_bytes(&self) -> u64 {
        self.max_allocated - self.allocated_before
    }
}

/// Replays `events` up to `step`, resets the peaks there, then replays `step_events` (the
/// recorded rest, or the profile's step).
fn replay_with_step(
    events: &[Event<'_>],
    step: usize,
    step_events: impl IntoIterator<Item = Allocation>,
) -> StepReplay {
    let mut r = Replay::default();
    events[..step].iter().for_each(|&e| r.event(e));
    r.device.allocator.reset_peak_stats();
    let allocated_before = r.device.allocator.allocated();
    step_events.into_iter().for_each(|a| r.allocation(a));
    StepReplay {
        reserved: r.device.allocator.reserved(),
        max_allocated: r.device.allocator.max_allocated(),
        allocated_before,
    }
}

/// The recorded events from `step` on, as allocations (ids made unique by their line).
fn recorded_step(events: &[Event<'_>], step: usize) -> Vec<Allocation> {
    let mut ids = HashMap::new();
    let mut out = vec![];
    for (i, event) in events[step..].iter().enumerate() {
        match *event {
            Event::Alloc(id, bytes) => {
                ids.insert(id, i);
                out.push(Allocation::Malloc { id: i, bytes });
            }
            Event::Free(id) => {
                // Blocks from before the step are freed by their own id space.
                if let Some(i) = ids.remove(id) {
                    out.push(Allocation::Free { id: i, bytes: 0 });
                }
            }
            _ => {}
        }
    }
    out
}

/// The step's allocation order as the PyTorch profile tells it (`Tape::step_allocations`), in a
/// process that loads the model and runs one step: the recorded load, then the profile's step,
/// against the recorded load and the recorded step.
#[test]
fn the_profiles_step_order_leaves_what_pytorch_reserved() {
    let mut failures = vec![];
    for (case, trace, starts) in traced_cases() {
        let name = case["name"].as_str().unwrap();
        let config = LlamaConfig::from_hf_json(&case["config"], name).unwrap();
        let setup = super::pytorch_profile::setup(&case, TorchDevice::Cuda);
        let recorded = llama::record(&config, &setup);
        let (events, step) = load_then_step(&parse(&trace), &starts);
        let tail = recorded_step(&events, step);
        let measured = replay_with_step(&events[..step], step, tail);
        let predicted = replay_with_step(
            &events[..step],
            step,
            recorded.tape.step_allocations(recorded.loss).all(),
        );
        // cuBLAS's workspaces and the weights are most of both figures (more than 95 % of the
        // smaller cases'), so the tolerance is 5 % of the step's own bytes above them.
        let step_bytes = measured.step_bytes();
        let line = format!(
            "{name:<26} step's own peak {:>10} / {step_bytes:>10} = {:.3}; reserved {:>11} / {:>11}, off by {:.3} of the step",
            predicted.step_bytes(),
            predicted.step_bytes() as f64 / step_bytes as f64,
            predicted.reserved,
            measured.reserved,
            predicted.reserved.abs_diff(measured.reserved) as f64 / step_bytes as f64,
        );
        println!("{line}");
        if !within_step(predicted.max_allocated, measured.max_allocated, step_bytes)
            || !reserved_within(predicted.reserved, measured.reserved, step_bytes)
        {
            failures.push(line);
        }
    }
    assert!(
        failures.is_empty(),
        "the step's peak outside 5 % of its own bytes, or reserved outside `reserved_within`:\n{}",
        failures.join("\n")
    );
}

/// Reserved bytes within 5 % of the step's own bytes, but never finer than one of PyTorch's
/// 2 MiB small-block segments: on the tiny models a segment is a third of the step. Measured:
/// 14 of the 20 cases exact; qlora-nf4-eval, -dq-train, -ckpt and smollm2-qlora-eval one 2 MiB
/// segment short; TinyLlama's QLoRA 4 MiB over (1.1 % of its step) and bf16 LoRA one 20 MiB
/// segment short (1.8 %).
fn reserved_within(predicted: u64, measured: u64, step_bytes: u64) -> bool {
    predicted.abs_diff(measured) as f64 <= (0.05 * step_bytes as f64).max((2 << 20) as f64)
}

/// The profile's tolerance (`pytorch_profile.rs`: ±5 %), taken of the step's own bytes (its
/// peak above what it began with), not of totals that cuBLAS's workspaces dominate.
fn within_step(predicted: u64, measured: u64, step_bytes: u64) -> bool {
    predicted.abs_diff(measured) as f64 <= 0.05 * step_bytes as f64
}

/// The load as `loading.rs` tells it, against the recorded one: each trace up to cuBLAS's
/// warm-up (its `empty_cache()`), then the predicted or the recorded load, up to the first
/// forward. Then the whole process from the settings: cuBLAS's two workspaces, the predicted
/// load, the profile's step, against the recorded load and step.
#[test]
fn the_predicted_load_and_step_leave_what_pytorch_reserved() {
    let mut failures = vec![];
    for (case, trace, starts) in traced_cases() {
        let name = case["name"].as_str().unwrap();
        let config = LlamaConfig::from_hf_json(&case["config"], name).unwrap();
        let setup = super::pytorch_profile::setup(&case, TorchDevice::Cuda);
        let events = parse(&trace);
        let warmed = events
            .iter()
            .position(|e| matches!(e, Event::EmptyCache))
            .expect("cuBLAS's warm-up ends with empty_cache()");
        let loaded = load_events(&config, &setup);
        // After the load: recorded, predicted.
        let (mut recorded, mut predicted) = (Replay::default(), Replay::default());
        for &event in &events[..=warmed] {
            recorded.event(event);
            predicted.event(event);
        }
        events[warmed + 1..starts[0]]
            .iter()
            .for_each(|&e| recorded.event(e));
        loaded.iter().for_each(|&e| predicted.load(e));
        let (recorded, predicted) = (recorded.device.allocator, predicted.device.allocator);
        let loaded_reserved = predicted.reserved();
        let loaded_allocated = predicted.allocated();
        let workspace = cublas_workspace_bytes() / 2;
        let process = device_process::replay(&config, &setup, workspace, Workspaces::BeforeLoad);
        let (events, step_at) = load_then_step(&events, &starts);
        let tail = recorded_step(&events, step_at);
        let measured = replay_with_step(&events[..step_at], step_at, tail);
        let reserved = measured.reserved;
        let line = format!(
            "{name:<26} after the load: reserved {loaded_reserved:>11} / {:>11} = {:.3}, allocated {loaded_allocated:>11} / {:>11} = {:.4}; after the step: reserved {:>11} / {reserved:>11} = {:.3}",
            recorded.reserved(),
            loaded_reserved as f64 / recorded.reserved() as f64,
            recorded.allocated(),
            loaded_allocated as f64 / recorded.allocated() as f64,
            process.reserved,
            process.reserved as f64 / reserved as f64,
        );
        println!("{line}");
        // The load's segments exactly; its blocks but a few small tables and the token ids
        // (allocated before the first forward); the whole process's reserved bytes as the
        // step's (`reserved_within`).
        let allocated_off = loaded_allocated.abs_diff(recorded.allocated());
        if loaded_reserved != recorded.reserved()
            || allocated_off * 1000 > recorded.allocated()
            || !reserved_within(process.reserved, reserved, measured.step_bytes())
        {
            failures.push(line);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
