//! Gradient clipping on a GPU backend without a pass per tensor: the global norm is summed by
//! `kernels/gpu/sum_of_squares.rs` (six tensors a launch, one read) and the clipping factor is
//! applied inside AdamW's update (`Optimizer::step_scaled`), not by scaling every gradient
//! first.
//!
//! - The norm equals an f64 sum of the same values on the host within 1e-6 (relative), over
//!   tensors of odd lengths and one longer than a launch's 1,024 cubes of 1,024 values, in
//!   ⌈n / 6⌉ launches.
//! - A step with the factor folded in equals the step on gradients scaled first, within the
//!   few ulps that separate AdamW's GPU kernel from the CPU's (`adamw_kernel.rs`), and the CPU's
//!   folded step equals its scaled-first step bit for bit.

use burn::module::{Module, Param, ParamId};
use burn::tensor::{Device, Tensor, TensorData};
use napkin_core::device::cpu;
use napkin_core::kernels::gpu::sum_of_squares::{MEMBERS, launches};
use napkin_core::train::grads::ParamGrads;
use napkin_core::train::optimizer::{Optimizer, OptimizerConfig};

use super::{ONE_AT_A_TIME, wgpu_device};

/// Odd lengths, one past a launch's 1,024 × 1,024 values (its cubes then take a second chunk).
const LENGTHS: [usize; 9] = [1, 7, 64, 1000, 3, 10_007, 5, 1_100_003, 2];

/// Seeded values in [-scale, scale).
fn values(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    super::seeded_values(seed.wrapping_add(1), n, scale)
}

fn tensor(v: &[f32], device: &Device) -> Tensor<1> {
    Tensor::from_data(TensorData::new(v.to_vec(), [v.len()]), device)
}

fn host(t: Tensor<1>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().unwrap()
}

#[derive(Module, Debug)]
struct Tensors {
    tensors: Vec<Param<Tensor<1>>>,
}

fn model(device: &Device) -> Tensors {
    Tensors {
        tensors: LENGTHS
            .iter()
            .enumerate()
            .map(|(i, &n)| Param::from_tensor(tensor(&values(i as u64, n, 0.5), device)))
            .collect(),
    }
}

/// Step `step`'s gradients of `ids` (the lengths above) on `device`.
fn grads(ids: &[ParamId], step: u64, device: &Device) -> ParamGrads {
    let mut grads = ParamGrads::new();
    for (i, (&id, &n)) in ids.iter().zip(&LENGTHS).enumerate() {
        grads.insert(id, tensor(&values(100 * step + i as u64, n, 0.01), device));
    }
    grads
}

#[test]
fn the_global_norm_on_a_gpu_is_one_launch_per_six_tensors_and_exact_to_f32() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device();
    let ids: Vec<ParamId> = LENGTHS.iter().map(|_| ParamId::new()).collect();
    let grads = grads(&ids, 1, &device);
    let exact = LENGTHS
        .iter()
        .enumerate()
        .flat_map(|(i, &n)| values(100 + i as u64, n, 0.01))
        .map(|v| f64::from(v) * f64::from(v))
        .sum::<f64>()
        .sqrt();
    let before = launches();
    let norm = grads.global_norm();
    assert_eq!(
        launches() - before,
        LENGTHS.len().div_ceil(MEMBERS) as u64,
        "launches of the sum-of-squares kernel"
    );
    let gap = (norm - exact).abs() / exact;
    println!("GPU global norm {norm:.9}, f64 on the host {exact:.9}: relative gap {gap:.2e}");
    assert!(
        gap <= 1e-6,
        "the GPU's global norm is {gap:e} off the f64 sum"
    );
}

#[test]
fn clipping_inside_adamw_equals_clipping_the_gradients_first() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    const FACTOR: f64 = 0.37;
    for (name, device) in [("wgpu", wgpu_device()), ("cpu", cpu())] {
        let (mut folded, mut first) = (model(&device), model(&device));
        let ids: Vec<ParamId> = folded.tensors.iter().map(|p| p.id).collect();
        // The two models' parameters carry their own ids; each gets the same values.
        let first_ids: Vec<ParamId> = first.tensors.iter().map(|p| p.id).collect();
        let config = OptimizerConfig::default();
        let (mut a, mut b) = (Optimizer::new(&config), Optimizer::new(&config));
        for step in 1..=2u64 {
            folded = a.step_scaled(folded, &grads(&ids, step, &device), 1e-3, FACTOR);
            let mut scaled = grads(&first_ids, step, &device);
            scaled.scale(FACTOR);
            first = b.step(first, &scaled, 1e-3);
        }
        let mut worst = 0.0f32;
        for (i, (p, q)) in folded.tensors.iter().zip(&first.tensors).enumerate() {
            let (p, q) = (host(p.val()), host(q.val()));
            if name == "cpu" {
                assert_eq!(p, q, "cpu: parameter {i} differs from clipping first");
            }
            let gap = p
                .iter()
                .zip(&q)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max)
                / q.iter().map(|y| y.abs()).fold(f32::MIN_POSITIVE, f32::max);
            worst = worst.max(gap);
        }
        println!("{name}: folded against clipped first, worst relative gap {worst:.2e}");
        assert!(
            worst < 1e-6,
            "{name}: folding the factor moved a parameter by {worst:e}"
        );
    }
}
