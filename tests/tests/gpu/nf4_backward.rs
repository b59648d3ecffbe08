//! QLoRA's memory-true backward on a GPU backend: the NF4 product saves no float copy of its
//! weight for the backward (plain autodiff saves one per layer until the backward), and both
//! give the same `∂x`.

use std::sync::Arc;

use burn::tensor::Tensor;
use napkin_core::config::Nf4Config;
use napkin_core::memory::meter::{Meter, MeterMethod};
use napkin_core::model::nf4_matmul::{nf4_matmul, nf4_matmul_saving_weight};
use napkin_core::model::nf4_weight::Nf4Weight;
use napkin_core::quant::nf4::Nf4Tensor;

use super::{ONE_AT_A_TIME, wgpu_device};

type Product = dyn Fn(Tensor<2>, &Nf4Weight) -> Tensor<2>;

#[test]
fn nf4_backward_on_the_gpu_keeps_no_dequantized_weight_between_forward_and_backward() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (out, inp, layers, tokens) = (688, 256, 8, 32);
    let device = wgpu_device();
    let weights: Vec<Nf4Weight> = (0..layers)
        .map(|layer| {
            let values: Vec<f32> = (0..out * inp)
                .map(|i| (((i + 31 * layer) * 7919 % 2003) as f32 / 2003.0 - 0.5) * 0.04)
                .collect();
            let q = Nf4Tensor::quantize(&values, &[out, inp], &Nf4Config::default()).unwrap();
            Nf4Weight::new(Arc::new(q), &device)
        })
        .collect();
    let mut meter = Meter::for_device(&device).unwrap();
    assert_eq!(meter.method(), MeterMethod::DevicePool);
    let train = device.autodiff();
    let x_values: Vec<f32> = (0..tokens * inp)
        .map(|i| ((i * 37 % 101) as f32 / 101.0) - 0.5)
        .collect();

    // The device bytes the graph holds between the forward and the backward, and ∂x.
    let mut run = |op: &Product| -> (u64, Vec<f32>) {
        let x = Tensor::<2>::from_data(
            burn::tensor::TensorData::new(x_values.clone(), [tokens, inp]),
            &train,
        )
        .require_grad();
        let before = meter.live();
        let y = weights
            .iter()
            .map(|w| op(x.clone(), w))
            .reduce(|a, b| a + b)
            .unwrap();
        let held = meter.live().saturating_sub(before);
        let grads = y.sum().backward();
        let dx = x.grad(&grads).expect("a gradient for x");
        let dx = dx.into_data().try_to_vec::<f32>().unwrap();
        (held, dx)
    };
    run(&|x, w| nf4_matmul(x, w)); // warm-up: the pool's first slices
    let (custom, dx_custom) = run(&|x, w| nf4_matmul(x, w));
    let (naive, dx_naive) = run(&|x, w| nf4_matmul_saving_weight(x, w));

    let weight_f32 = (4 * out * inp) as u64;
    eprintln!(
        "{layers} NF4 products [{tokens}x{inp}]·[{inp}x{out}] on wgpu, device bytes held between \
         forward and backward: custom backward {custom}, plain autodiff {naive} (one f32 weight: \
         {weight_f32})"
    );
    // Plain autodiff keeps all eight float weights; the custom op none (only the outputs).
    assert!(
        naive >= custom + (layers as u64 - 1) * weight_f32,
        "plain autodiff held {naive} B, the custom backward {custom} B"
    );
    assert!(
        custom < weight_f32,
        "the custom backward held {custom} B on the device (one f32 weight is {weight_f32} B)"
    );
    let worst = dx_custom
        .iter()
        .zip(&dx_naive)
        .map(|(a, b)| (a - b).abs() / b.abs().max(1e-3))
        .fold(0f32, f32::max);
    assert!(worst < 1e-4, "∂x differs by {worst} (relative)");
}
