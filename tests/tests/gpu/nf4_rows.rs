//! Generation's NF4 products on the GPU: a few rows times the weight read straight from the
//! resident codes (`kernels/gpu/nf4_row_product.rs`), with no dequantized weight. The values are
//! the product with the CPU's dequantized weights (against an f64 sum), also with a LoRA
//! adapter's path added in the same launch; the pool never holds the f32 weight (read at the
//! product, where it would be), and a QLoRA model's KV-cached generation gives the logits and
//! the tokens of the dequantizing path.

use std::sync::Arc;

use burn::module::Param;
use burn::tensor::{Distribution, Tensor, TensorData};
use napkin_core::config::{LlamaConfig, LoraConfig, Nf4Config};
use napkin_core::kernels::gpu::resident_nf4::{LoraPath, ResidentNf4};
use napkin_core::measure::random_model;
use napkin_core::memory::inner_marks::InnerMarks;
use napkin_core::memory::meter::Meter;
use napkin_core::model::generate::{KvCache, NextToken, Sampling};
use napkin_core::model::nf4_matmul::{dequantizing_every_product, nf4_matmul_saving_weight};
use napkin_core::model::nf4_weight::Nf4Weight;
use napkin_core::predict::inventory::Scenario;

use super::nf4_device::quantize;
use super::{ONE_AT_A_TIME, wgpu_device};

/// `rows × in` inputs of both signs.
fn rows_of(rows: usize, inp: usize, seed: usize) -> Vec<f32> {
    (0..rows * inp)
        .map(|i| (((i * 31 + seed * 7) % 113) as f32 / 113.0) - 0.5)
        .collect()
}

/// Plain and double-quantized, blocks of 64 and 128, blocks that straddle rows (in = 200),
/// more than 256 blocks (several second-level scales), one row and several.
#[test]
fn rows_times_an_nf4_weight_from_its_codes_equal_the_dequantized_product() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device();
    let cases = [
        ([96, 64], 64),
        ([130, 200], 64),
        ([33, 256], 128),
        ([576, 1536], 64),
        ([1536, 576], 64),
    ];
    let mut worst_seen = 0f64;
    for (shape, block_size) in cases {
        let [out, inp] = shape;
        for double_quant in [false, true] {
            let q = quantize(shape, block_size, double_quant, out + block_size);
            let w = q.dequantize();
            let resident = ResidentNf4::upload(&q, &device).expect("wgpu is a GPU device");
            for rows in [1, 3] {
                let xs = rows_of(rows, inp, out);
                let x = Tensor::<2>::from_data(TensorData::new(xs.clone(), [rows, inp]), &device);
                let y = resident
                    .rows_times_transposed(&x, None)
                    .expect("in and the block size are multiples of 8")
                    .into_data()
                    .try_to_vec::<f32>()
                    .unwrap();
                assert_eq!(y.len(), rows * out);
                for r in 0..rows {
                    for o in 0..out {
                        let terms =
                            (0..inp).map(|i| xs[r * inp + i] as f64 * w[o * inp + i] as f64);
                        let exact: f64 = terms.clone().sum();
                        let magnitude: f64 = terms.map(f64::abs).sum();
                        let error = (y[r * out + o] as f64 - exact).abs() / magnitude.max(1e-30);
                        worst_seen = worst_seen.max(error);
                        assert!(
                            error < 1e-5,
                            "{shape:?} block {block_size} dq {double_quant} row {r} feature {o}: \
                             {} against {exact} (error {error:.1e} of Σ|x·w| = {magnitude})",
                            y[r * out + o]
                        );
                    }
                }
            }
        }
    }
    eprintln!("rows × NF4 codes: worst error {worst_seen:.2e} of Σ|x·w| (bound 1e-5)");
    // Shapes the kernel does not take: the caller dequantizes instead.
    let odd = quantize([16, 36], 64, false, 1);
    let resident = ResidentNf4::upload(&odd, &device).expect("wgpu is a GPU device");
    let x = Tensor::<2>::ones([1, 36], &device);
    assert!(
        resident.rows_times_transposed(&x, None).is_none(),
        "in = 36"
    );
    let odd_block = quantize([16, 64], 6, false, 1);
    let resident = ResidentNf4::upload(&odd_block, &device).expect("wgpu is a GPU device");
    let x = Tensor::<2>::ones([1, 64], &device);
    assert!(
        resident.rows_times_transposed(&x, None).is_none(),
        "block 6"
    );
}

/// With a LoRA adapter the row product adds `s · (x · Aᵀ) · Bᵀ` in its own launch: against an
/// f64 sum of the dequantized base product and the adapter's path (the adapter's `x · Aᵀ`
/// read back from the device), ranks that are and are not multiples of the kernel's eight
/// lanes, one row and several; an adapter whose shapes do not fit is refused.
#[test]
fn rows_times_codes_plus_an_adapter_equal_the_two_products_summed() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device();
    let mut worst_seen = 0f64;
    for (shape, rank) in [([130, 200], 5), ([1536, 576], 16), ([576, 1536], 20)] {
        let [out, inp] = shape;
        let q = quantize(shape, 64, true, out + rank);
        let w = q.dequantize();
        let resident = ResidentNf4::upload(&q, &device).expect("wgpu is a GPU device");
        let a = rows_of(rank, inp, 3);
        let b = rows_of(out, rank, 4);
        let scaling = 32.0 / rank as f64;
        let a_device = Tensor::<2>::from_data(TensorData::new(a, [rank, inp]), &device);
        let b_device = Tensor::<2>::from_data(TensorData::new(b.clone(), [out, rank]), &device);
        for rows in [1, 4] {
            let xs = rows_of(rows, inp, out);
            let x = Tensor::<2>::from_data(TensorData::new(xs.clone(), [rows, inp]), &device);
            let down = x.clone().matmul(a_device.clone().transpose()); // [rows, r]
            let d = down.clone().into_data().try_to_vec::<f32>().unwrap();
            let path = LoraPath {
                down,
                lora_b: b_device.clone(),
                scaling,
            };
            let y = resident
                .rows_times_transposed(&x, Some(path))
                .expect("in and the block size are multiples of 8")
                .into_data()
                .try_to_vec::<f32>()
                .unwrap();
            for r in 0..rows {
                for o in 0..out {
                    let base = (0..inp).map(|i| xs[r * inp + i] as f64 * w[o * inp + i] as f64);
                    let adapter = (0..rank)
                        .map(|j| scaling * d[r * rank + j] as f64 * b[o * rank + j] as f64);
                    let exact: f64 = base.clone().sum::<f64>() + adapter.clone().sum::<f64>();
                    let magnitude: f64 =
                        base.map(f64::abs).sum::<f64>() + adapter.map(f64::abs).sum::<f64>();
                    let error = (y[r * out + o] as f64 - exact).abs() / magnitude.max(1e-30);
                    worst_seen = worst_seen.max(error);
                    assert!(
                        error < 1e-5,
                        "{shape:?} r {rank} row {r} feature {o}: {} against {exact} \
                         (error {error:.1e} of the terms' Σ|·| = {magnitude})",
                        y[r * out + o]
                    );
                }
            }
        }
        // B with a row too few: refused, not read out of bounds.
        let x = Tensor::<2>::ones([1, inp], &device);
        let short_b = LoraPath {
            down: Tensor::<2>::ones([1, rank], &device),
            lora_b: Tensor::<2>::ones([out - 1, rank], &device),
            scaling,
        };
        assert!(resident.rows_times_transposed(&x, Some(short_b)).is_none());
    }
    eprintln!(
        "rows × NF4 codes + adapter: worst error {worst_seen:.2e} of the terms' Σ|·| (bound 1e-5)"
    );
}

/// One row times a [2048 × 2048] NF4 weight: from the codes the pool never holds the 16 MiB
/// f32 weight; dequantizing first it does, at the product. Read at the product by the inner
/// marks (the pool has no high-water mark).
#[test]
fn a_row_product_from_the_codes_holds_no_dequantized_weight() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device();
    let shape = [2048, 2048];
    let weight = Nf4Weight::new(Arc::new(quantize(shape, 64, true, 9)), &device);
    let x = Tensor::<2>::from_data(
        TensorData::new(rows_of(1, shape[1], 2), [1, shape[1]]),
        &device,
    );
    let mut meter = Meter::for_device(&device).expect("wgpu has a pool");
    let mut held = |product: &dyn Fn() -> Tensor<2>| {
        drop(product()); // compiled, the pool's slices made
        let before = meter.live();
        let marks = InnerMarks::arm(&device).expect("wgpu has a pool");
        let y = product();
        let largest = marks.largest();
        drop(marks);
        drop(y);
        largest.saturating_sub(before)
    };
    let from_codes = held(&|| nf4_matmul_saving_weight(x.clone(), &weight));
    let dequantizing =
        held(&|| dequantizing_every_product(|| nf4_matmul_saving_weight(x.clone(), &weight)));
    let f32_weight = (4 * shape[0] * shape[1]) as u64;
    eprintln!(
        "one row × NF4 [2048×2048] + DQ, held at the product: from the codes {from_codes} B, \
         dequantizing first {dequantizing} B (the f32 weight is {f32_weight} B)"
    );
    assert!(
        dequantizing >= f32_weight,
        "the dequantizing path held {dequantizing} B"
    );
    // At least the product's [1, 2048] f32 result: a reading was taken at the product.
    assert!(
        (4 * shape[0] as u64..=f32_weight / 256).contains(&from_codes),
        "the product from the codes held {from_codes} B"
    );
}

/// KV-cached generation with a QLoRA tiny model on wgpu: the products from the codes (each
/// with its adapter's path in the same launch) give the dequantizing path's logits (prompt and
/// each new token, the base and the adapter apart) and the same sampled tokens.
#[test]
fn qlora_generation_from_the_codes_follows_the_dequantizing_path() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device();
    let s = Scenario {
        lora: Some(LoraConfig {
            r: 8,
            ..LoraConfig::default()
        }),
        nf4: Some(Nf4Config {
            block_size: 64,
            double_quant: true,
        }),
        ..Scenario::new(LlamaConfig::tiny_smol(), 1, 32)
    };
    device.seed(11);
    let mut model = random_model(&s, &device).expect("a QLoRA model");
    // peft starts B at zero, which would hide the adapter's path: give every B values of the
    // size a few training steps leave.
    for named in model.block_linears_mut() {
        let adapter = named.linear.lora.as_mut().expect("every linear adapted");
        let shape = adapter.lora_b.shape();
        adapter.lora_b = Param::from_tensor(Tensor::random(
            shape,
            Distribution::Uniform(-0.05, 0.05),
            &device,
        ));
    }
    let prompt: Vec<u32> = (0..12).map(|i| (i * 37 + 5) % 256).collect();
    let logits = |fed: &[u32]| -> Vec<Vec<f32>> {
        let mut cache = KvCache::default();
        let mut out = vec![model.next_token_logits(&prompt, &mut cache).unwrap()];
        for &id in fed {
            out.push(model.next_token_logits(&[id], &mut cache).unwrap());
        }
        out
    };
    let sampling = Sampling {
        temperature: 1.0,
        seed: 5,
        ..Sampling::default()
    };
    let tokens = model.generate(&prompt, 8, &sampling, &[], |_| {}).unwrap();
    let tokens_dequantizing =
        dequantizing_every_product(|| model.generate(&prompt, 8, &sampling, &[], |_| {}).unwrap());
    let from_codes = logits(&tokens);
    let dequantizing = dequantizing_every_product(|| logits(&tokens));
    let mut worst = 0f32;
    for (a, b) in from_codes.iter().zip(&dequantizing) {
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (x, y) in a.iter().zip(b) {
            worst = worst.max((x - y).abs() / scale);
        }
    }
    eprintln!(
        "QLoRA generation, from the codes vs dequantizing: worst logit difference {worst:.2e} of the largest; tokens {tokens:?}"
    );
    assert!(worst < 1e-4, "logits differ by {worst} of the largest");
    assert_eq!(tokens, tokens_dequantizing);
}
