//! The host's cost of one GPU operation: a chain of small element-wise ops (`[64]` values, so
//! the device's own work is nothing), timed to a sync — without autodiff, and as a forward with
//! autodiff plus its backward. burn's cubecl backends launch one kernel per op, so a training
//! step of ~11,000 ops (SmolLM2 LoRA, counted on lavapipe) costs at least 11,000 times this,
//! whatever the GPU: the figure to set beside a step that takes as long at T = 512 as at 2048.
//! The chain is also captured once as a device graph (`burn::tensor::capture`: a CUDA graph on
//! CUDA, recorded pipelines and bindings on wgpu) and replayed: what a captured training step
//! would cost an op.

use std::time::Instant;

use anyhow::Result;
use burn::tensor::{Device, Tensor, capture};

use super::spread;

/// Multiply-adds in the chain (two ops each).
const STEPS: usize = 500;

/// Microseconds per op: without autodiff, and per forward op of a chain run forward and
/// backward with autodiff (its backward ops included).
pub struct LaunchCost {
    pub plain_micros: f64,
    pub autodiff_micros: f64,
    /// Per op of the captured chain's replay; None when the backend recorded no graph (the
    /// replay then re-runs the ops, which the plain figure already says).
    pub replayed_micros: Option<f64>,
    /// Whether the replayed chain's output equals the eager chain's.
    pub replay_matches: bool,
}

fn chain(x: Tensor<1>) -> Tensor<1> {
    (0..STEPS).fold(x, |x, _| x * 1.0001 + 0.5)
}

/// Seconds from a synced device through `work` to the device's next sync.
pub(super) fn time_to_sync(device: &Device, work: impl FnOnce()) -> f64 {
    let _ = device.sync();
    let start = Instant::now();
    work();
    let _ = device.sync();
    start.elapsed().as_secs_f64()
}

pub fn run(device: &Device, runs: usize) -> Result<LaunchCost> {
    let ops = (2 * STEPS) as f64;
    let plain = |_| {
        let x = Tensor::<1>::ones([64], device);
        time_to_sync(device, || drop(chain(x)))
    };
    let train = device.clone().autodiff();
    let autodiff = |_| {
        let x = Tensor::<1>::ones([64], &train).require_grad();
        time_to_sync(device, || {
            let grads = chain(x.clone()).sum().backward();
            drop(x.grad(&grads));
        })
    };
    // The first round compiles each kernel once; it is not counted.
    let plain: Vec<f64> = (0..=runs).map(plain).skip(1).collect();
    let autodiff: Vec<f64> = (0..=runs).map(autodiff).skip(1).collect();
    // The input lives in the closure and the output in the graph, so every buffer the recorded
    // ops touch outlives the replays below, and nothing else runs on this device meanwhile:
    // the contract of `Graph::replay`.
    let input = Tensor::<1>::ones([64], device);
    let mut graph = capture(device, move || chain(input.clone()));
    let recorded = graph.is_hardware();
    let replayed: Vec<f64> = (0..=runs)
        .map(|_| {
            time_to_sync(device, || {
                // SAFETY: see above; the sync in `time_to_sync` ends each replay's work.
                unsafe {
                    graph.replay();
                }
            })
        })
        .skip(1)
        .collect();
    let expected = chain(Tensor::<1>::ones([64], device)).into_data();
    let replay_matches = graph.output().to_data() == expected;
    let (plain_s, plain_lo, plain_hi) = spread(&plain).unwrap_or_default();
    let (auto_s, auto_lo, auto_hi) = spread(&autodiff).unwrap_or_default();
    let micros = |s: f64| 1e6 * s / ops;
    println!(
        "\nHost cost of one small GPU op ([64] values; {} ops, median of {runs}):",
        2 * STEPS
    );
    println!(
        "  without autodiff: {:.1} µs an op ({:.1}–{:.1})",
        micros(plain_s),
        micros(plain_lo),
        micros(plain_hi)
    );
    println!(
        "  forward with autodiff and its backward: {:.1} µs per forward op ({:.1}–{:.1})",
        micros(auto_s),
        micros(auto_lo),
        micros(auto_hi)
    );
    let (replay_s, replay_lo, replay_hi) = spread(&replayed).unwrap_or_default();
    if recorded {
        println!(
            "  the chain captured as a device graph and replayed: {:.2} µs an op ({:.2}–{:.2}; \
             {:.2}× the op-by-op time; output equal to the eager chain's: {replay_matches})",
            micros(replay_s),
            micros(replay_lo),
            micros(replay_hi),
            replay_s / plain_s
        );
    } else {
        println!(
            "  the chain captured as a device graph: this backend recorded none (replays re-run the ops)"
        );
    }
    Ok(LaunchCost {
        plain_micros: micros(plain_s),
        autodiff_micros: micros(auto_s),
        replayed_micros: recorded.then(|| micros(replay_s)),
        replay_matches,
    })
}
