//! The host's cost of one GPU operation: a chain of small element-wise ops (`[64]` values, so
//! the device's own work is nothing), timed to a sync — without autodiff, and as a forward with
//! autodiff plus its backward. burn's cubecl backends launch one kernel per op, so a training
//! step of ~11,000 ops (SmolLM2 LoRA, counted on lavapipe) costs at least 11,000 times this,
//! whatever the GPU: the figure to set beside a step that takes as long at T = 512 as at 2048.

use std::time::Instant;

use anyhow::Result;
use burn::tensor::{Device, Tensor};

use super::spread;

/// Multiply-adds in the chain (two ops each).
const STEPS: usize = 500;

/// Microseconds per op: without autodiff, and per forward op of a chain run forward and
/// backward with autodiff (its backward ops included).
pub struct LaunchCost {
    pub plain_micros: f64,
    pub autodiff_micros: f64,
}

fn chain(x: Tensor<1>) -> Tensor<1> {
    (0..STEPS).fold(x, |x, _| x * 1.0001 + 0.5)
}

fn time_to_sync(device: &Device, work: impl FnOnce()) -> f64 {
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
    Ok(LaunchCost {
        plain_micros: micros(plain_s),
        autodiff_micros: micros(auto_s),
    })
}
