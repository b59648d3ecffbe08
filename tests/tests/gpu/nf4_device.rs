//! NF4 resident on the GPU: the codes and scales are uploaded once, a cubecl kernel
//! dequantizes them on the device bit for bit as the CPU does, the gradients through an NF4
//! layer equal the CPU's, and a QLoRA step moves no weight byte over the link (counted where
//! napkin crosses it, `device::link`).

use std::sync::Arc;

use burn::tensor::{FloatDType, Tensor, TensorData};
use napkin_core::config::{LlamaConfig, LoraConfig, Nf4Config};
use napkin_core::device::link;
use napkin_core::kernels::gpu::resident_nf4::ResidentNf4;
use napkin_core::measure::{random_model, synthetic_micro_batches};
use napkin_core::model::nf4_matmul::nf4_matmul;
use napkin_core::model::nf4_weight::Nf4Weight;
use napkin_core::predict::inventory::Scenario;
use napkin_core::quant::nf4::Nf4Tensor;
use napkin_core::train::{Optimizer, OptimizerConfig, StepOptions, forward_backward};

use super::{ONE_AT_A_TIME, wgpu_device};

/// Deterministic weights with the spread of an initialised layer and a few outliers, so blocks
/// have different absmax values (and the double-quantized scales differ).
pub(super) fn weights(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let u = ((i * 7919 + seed * 104_729) % 10_007) as f32 / 10_007.0 - 0.5;
            if (i + seed).is_multiple_of(97) {
                u * 0.9
            } else {
                u * 0.05
            }
        })
        .collect()
}

pub(super) fn quantize(
    shape: [usize; 2],
    block_size: usize,
    double_quant: bool,
    seed: usize,
) -> Nf4Tensor {
    let config = Nf4Config {
        block_size,
        double_quant,
    };
    Nf4Tensor::quantize(&weights(shape[0] * shape[1], seed), &shape, &config).unwrap()
}

/// Plain and double-quantized, blocks of 64 and 128, odd shapes (a partial last block and an
/// odd count of codes), and more than 256 blocks (several second-level scales).
#[test]
fn device_dequantization_equals_the_cpu_bit_for_bit() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device();
    let cases = [
        ([1, 7], 64),
        ([37, 61], 64),
        ([37, 61], 128),
        ([300, 130], 64),
        ([129, 257], 128),
        ([576, 1536], 64),
    ];
    for (shape, block_size) in cases {
        for double_quant in [false, true] {
            let q = quantize(shape, block_size, double_quant, shape[0] + block_size);
            let cpu = q.dequantize();
            let resident = ResidentNf4::upload(&q, &device).expect("wgpu is a GPU device");
            let gpu = resident
                .dequantize(FloatDType::F32)
                .into_data()
                .try_to_vec::<f32>()
                .unwrap();
            assert_eq!(gpu.len(), cpu.len());
            let differing = cpu
                .iter()
                .zip(&gpu)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            let first = cpu
                .iter()
                .zip(&gpu)
                .position(|(a, b)| a.to_bits() != b.to_bits());
            assert_eq!(
                differing,
                0,
                "{shape:?} block {block_size} double quant {double_quant}: {differing} of {} \
                 values differ (first at {first:?}: cpu {:?}, gpu {:?})",
                cpu.len(),
                first.map(|i| cpu[i]),
                first.map(|i| gpu[i]),
            );
            // What the weight holds on the device: the host format's bytes, rounded up to
            // whole u32 words (codes; double-quantized absmax codes).
            let host = q.bytes();
            let offset = if double_quant { 4 } else { 0 };
            let words = |bytes: u64| bytes.div_ceil(4) * 4;
            let expected = words(host.codes)
                + if double_quant {
                    let blocks = (shape[0] * shape[1]).div_ceil(block_size) as u64;
                    words(blocks) + (host.scales - offset - blocks)
                } else {
                    host.scales
                };
            assert_eq!(resident.device_bytes(), expected, "{shape:?}");
        }
    }
}

/// ∂x through an NF4 product (forward and backward dequantized on the device) equals the
/// CPU's.
#[test]
fn gradients_of_an_nf4_layer_on_wgpu_equal_the_cpus() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (tokens, out, inp) = (24, 96, 160);
    let q = Arc::new(quantize([out, inp], 64, true, 3));
    let x_values: Vec<f32> = (0..tokens * inp)
        .map(|i| ((i * 37 % 101) as f32 / 101.0) - 0.5)
        .collect();
    let c_values: Vec<f32> = (0..tokens * out)
        .map(|i| ((i * 13 % 29) as f32 / 29.0) - 0.5)
        .collect();
    let run = |device: burn::tensor::Device| -> (Vec<f32>, Vec<f32>) {
        let train = device.clone().autodiff();
        let w = Nf4Weight::new(q.clone(), &train);
        let x = Tensor::<2>::from_data(TensorData::new(x_values.clone(), [tokens, inp]), &train)
            .require_grad();
        let c = Tensor::<2>::from_data(TensorData::new(c_values.clone(), [tokens, out]), &train);
        let y = nf4_matmul(x.clone(), &w);
        let grads = (y.clone() * c).sum().backward();
        let dx = x.grad(&grads).expect("a gradient for x");
        (
            y.into_data().try_to_vec::<f32>().unwrap(),
            dx.into_data().try_to_vec::<f32>().unwrap(),
        )
    };
    let (y_gpu, dx_gpu) = run(wgpu_device());
    let (y_cpu, dx_cpu) = run(napkin_core::device::cpu());
    let worst = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(a, b)| (a - b).abs() / b.abs().max(1e-2))
            .fold(0f32, f32::max)
    };
    let (wy, wdx) = (worst(&y_gpu, &y_cpu), worst(&dx_gpu, &dx_cpu));
    eprintln!("NF4 product on wgpu vs CPU: y worst relative {wy:.2e}, ∂x {wdx:.2e}");
    assert!(wy < 1e-4, "y differs by {wy} (relative)");
    assert!(wdx < 1e-4, "∂x differs by {wdx} (relative)");
}

/// A product from resident codes uploads nothing; the host path (the codes not on the device)
/// uploads the f32 weight for the forward and again for the backward.
#[test]
fn nf4_products_from_resident_codes_upload_no_weight_bytes() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device();
    let train = device.clone().autodiff();
    let (tokens, out, inp) = (16, 128, 256);
    let q = Arc::new(quantize([out, inp], 64, true, 5));
    let before = link::counted();
    let resident = Nf4Weight::new(q.clone(), &train);
    let uploaded_once = link::counted().since(&before).weights_up;
    let host_side = Nf4Weight {
        quantized: q.clone(),
        resident: None,
    };
    let x = Tensor::<2>::ones([tokens, inp], &train).require_grad();
    let traffic = |w: &Nf4Weight| {
        let before = link::counted();
        let grads = nf4_matmul(x.clone(), w).sum().backward();
        drop(x.grad(&grads));
        link::counted().since(&before)
    };
    let from_resident = traffic(&resident);
    let from_host = traffic(&host_side);
    let f32_weight = (4 * out * inp) as u64;
    eprintln!(
        "NF4 [{out}x{inp}] + DQ: uploaded once {uploaded_once} B; one forward + backward: \
         resident {} B of weights, host path {} B (f32 weight {f32_weight} B)",
        from_resident.weights_up, from_host.weights_up
    );
    assert!(
        uploaded_once >= q.bytes().total() - 4 && uploaded_once < f32_weight / 4,
        "uploaded {uploaded_once} B for {:?}",
        q.bytes()
    );
    assert_eq!(from_resident.weights_up, 0);
    assert_eq!(from_host.weights_up, 2 * f32_weight);
}

/// Training steps of a QLoRA tiny model on wgpu: after the model is built, no weight byte is
/// uploaded; each step uploads its token ids, labels and RoPE tables only.
#[test]
fn a_qlora_step_on_wgpu_uploads_no_weights() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device();
    let train = device.clone().autodiff();
    let s = Scenario {
        lora: Some(LoraConfig {
            r: 8,
            ..LoraConfig::default()
        }),
        nf4: Some(Nf4Config {
            block_size: 64,
            double_quant: true,
        }),
        checkpointing: true,
        ..Scenario::new(LlamaConfig::tiny_smol(), 1, 64)
    };
    train.seed(7);
    let mut model = random_model(&s, &train).expect("a QLoRA model");
    let micro = synthetic_micro_batches(&s).unwrap();
    let mut optimizer = Optimizer::new(&OptimizerConfig::default());
    let mut per_step = Vec::new();
    for _ in 0..3 {
        let before = link::counted();
        let step = forward_backward(
            &model,
            &micro,
            &StepOptions::default().with_checkpointing(s.checkpointing),
        )
        .expect("a step")
        .read();
        model = optimizer.step(model, &step.grads, 1e-3);
        let _ = device.sync();
        per_step.push(link::counted().since(&before));
    }
    let predicted = napkin_core::predict::link::step_link(&s).expect("an unpacked batch");
    eprintln!("link per QLoRA step on wgpu: {per_step:?}; predicted {predicted:?}");
    for (i, t) in per_step.iter().enumerate() {
        assert_eq!(t.weights_up, 0, "step {i} uploaded weights: {t:?}");
        assert_eq!(t.data_up, predicted.up(), "step {i}: the batch's bytes");
        assert_eq!(t.read_back, predicted.read_back, "step {i}: the loss");
    }
}

/// The efficient attention's causal tile masks are made once per batch and shared by every
/// layer and pass: a step at T = 300 (two full diagonal tiles and a partial one, four layers,
/// forward + recompute + backward) uploads one full tile and one partial tile, as predicted.
#[test]
fn efficient_attention_uploads_each_distinct_tile_mask_once() {
    use napkin_core::config::AttentionKind;
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device();
    let train = device.clone().autodiff();
    let s = Scenario {
        lora: Some(LoraConfig {
            r: 4,
            ..LoraConfig::default()
        }),
        attention: AttentionKind::Efficient,
        checkpointing: true,
        ..Scenario::new(LlamaConfig::tiny_smol(), 2, 300)
    };
    train.seed(7);
    let model = random_model(&s, &train).expect("a LoRA model");
    let micro = synthetic_micro_batches(&s).unwrap();
    let before = link::counted();
    drop(
        forward_backward(
            &model,
            &micro,
            &StepOptions::default().with_checkpointing(s.checkpointing),
        )
        .expect("a step")
        .read(),
    );
    let moved = link::counted().since(&before);
    let predicted = napkin_core::predict::link::step_link(&s).expect("an unpacked batch");
    eprintln!("efficient attention, T = 300: moved {moved:?}, predicted {predicted:?}");
    assert_eq!(moved.weights_up, 0);
    assert_eq!(moved.data_up, predicted.up());
}

/// QLoRA in 16 bits on the device (bitsandbytes' `compute_dtype`): under autocast the kernel
/// dequantizes straight to bf16 (f16 where the adapter has no bf16, as lavapipe) and the NF4
/// products run there; ten steps of tiny-smol follow the f32 run's losses within 1e-2 (the bound; a loss
/// is ~5 there).
#[test]
fn qlora_in_16_bits_on_wgpu_follows_the_f32_losses() {
    use burn::tensor::DType;
    use napkin_core::model::autocast::autocast;
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device();
    let half = if device.supports_dtype(DType::BF16) {
        FloatDType::BF16
    } else {
        assert!(
            device.supports_dtype(DType::F16),
            "the adapter has neither bf16 nor f16"
        );
        FloatDType::F16
    };
    let train = device.clone().autodiff();
    let s = Scenario {
        lora: Some(LoraConfig {
            r: 8,
            ..LoraConfig::default()
        }),
        nf4: Some(Nf4Config {
            block_size: 64,
            double_quant: true,
        }),
        ..Scenario::new(LlamaConfig::tiny_smol(), 1, 64)
    };
    let micro = synthetic_micro_batches(&s).unwrap();
    let losses = |compute: Option<FloatDType>| -> Vec<f32> {
        train.seed(7);
        let mut model = random_model(&s, &train).expect("a QLoRA model");
        let mut optimizer = Optimizer::new(&OptimizerConfig::default());
        (0..10)
            .map(|_| {
                let step = {
                    let _precision = autocast(compute);
                    forward_backward(&model, &micro, &StepOptions::default())
                        .expect("a step")
                        .read()
                };
                model = optimizer.step(model.clone(), &step.grads, 2e-3);
                step.loss
            })
            .collect()
    };
    // One product: under autocast the layer dequantizes to the 16-bit dtype and multiplies
    // there (the same values as doing it by hand), not in f32.
    let w = Nf4Weight::new(Arc::new(quantize([96, 160], 64, true, 9)), &train);
    let x =
        Tensor::<2>::random([24, 160], burn::tensor::Distribution::Default, &train).require_grad();
    let by_layer = {
        let _precision = autocast(Some(half));
        nf4_matmul(x.clone(), &w)
    };
    let by_hand =
        napkin_core::model::matmul_wt::matmul_wt(x.clone().cast(half), w.dequantized(&train, half))
            .cast(FloatDType::F32);
    let in_f32 = nf4_matmul(x, &w);
    let read = |t: Tensor<2>| t.into_data().try_to_vec::<f32>().unwrap();
    let (by_layer, by_hand, in_f32) = (read(by_layer), read(by_hand), read(in_f32));
    assert_eq!(by_layer, by_hand, "the layer's {half:?} product");
    assert_ne!(
        by_layer, in_f32,
        "a {half:?} product differs from the f32 one"
    );

    let full = losses(None);
    let low = losses(Some(half));
    eprintln!("QLoRA on wgpu, f32: {full:?}\n{half:?}: {low:?}");
    assert!(full[9] < full[0] - 0.1, "the f32 run learns: {full:?}");
    for (i, (a, b)) in full.iter().zip(&low).enumerate() {
        assert!(
            (a - b).abs() <= 1e-2,
            "step {i}: {half:?} loss {b} vs f32 {a}"
        );
    }
    assert_ne!(full, low, "the 16-bit run computed in 16 bits");
}
