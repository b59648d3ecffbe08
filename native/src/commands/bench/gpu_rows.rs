//! Generation's NF4 products on the GPU, two ways, for `model/nf4_matmul.rs::ROWS_FROM_CODES`:
//! a few rows times the weight read straight from the resident codes
//! (`kernels/gpu/nf4_row_product.rs`, one launch, no transient) against dequantizing the weight on
//! the device and multiplying (two launches and an f32 `[out, in]` transient). First one
//! weight at 1 to 16 rows; then a QLoRA model's KV-cached decoding, tokens/s both ways.
//!
//! The two ways alternate within each round (so a slow spell of the machine falls on both),
//! each timed to a device sync; the figures are medians with the min–max over the rounds.

use std::sync::Arc;

use anyhow::{Context, Result};
use burn::tensor::{Device, Tensor, TensorData};
use napkin_core::config::{LlamaConfig, LoraConfig, Nf4Config};
use napkin_core::measure::random_model;
use napkin_core::model::generate::{NextToken, Sampling};
use napkin_core::model::nf4_matmul::{
    ROWS_FROM_CODES, dequantizing_every_product, nf4_matmul_saving_weight,
};
use napkin_core::model::nf4_weight::Nf4Weight;
use napkin_core::predict::inventory::Scenario;
use napkin_core::quant::nf4::Nf4Tensor;
use serde::Serialize;

use super::gpu_launch::time_to_sync;
use super::spread;

/// Products per timed call (one sync for all of them, as in a forward pass).
const PRODUCTS_PER_CALL: usize = 10;

/// One way's time: median and the min–max over the rounds, in seconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Timing {
    median: f64,
    min: f64,
    max: f64,
}

impl Timing {
    fn of(times: &[f64]) -> Self {
        let (median, min, max) = spread(times).unwrap_or((f64::NAN, f64::NAN, f64::NAN));
        Timing { median, min, max }
    }

    /// Every figure times `factor`.
    fn scaled(self, factor: f64) -> Self {
        Timing {
            median: factor * self.median,
            min: factor * self.min,
            max: factor * self.max,
        }
    }
}

/// Rows × one weight, both ways.
#[derive(Debug, Serialize)]
pub struct RowProduct {
    rows: usize,
    from_codes_ms: Timing,
    dequantizing_ms: Timing,
    /// Dequantizing's median over the codes' median.
    speedup: f64,
}

/// KV-cached decoding, both ways.
#[derive(Debug, Serialize)]
pub struct Decoding {
    model: String,
    new_tokens: usize,
    from_codes_tokens_per_second: Timing,
    dequantizing_tokens_per_second: Timing,
    /// The codes' median tokens/s over dequantizing's.
    speedup: f64,
    same_tokens: bool,
}

/// What `--json` gets.
#[derive(Debug, Serialize)]
pub struct RowFigures {
    weight: [usize; 2],
    rows_from_codes: usize,
    products: Vec<RowProduct>,
    decoding: Decoding,
}

impl RowFigures {
    /// Whether decoding from the codes gave the dequantizing path's tokens.
    pub fn same_tokens(&self) -> bool {
        self.decoding.same_tokens
    }
}

/// Times `ways` alternately over `rounds` rounds (after one untimed call each).
fn alternate<const N: usize>(
    device: &Device,
    rounds: usize,
    ways: [&dyn Fn(); N],
) -> [Vec<f64>; N] {
    for way in ways {
        way();
    }
    let _ = device.sync();
    let mut times: [Vec<f64>; N] = std::array::from_fn(|_| Vec::new());
    for _ in 0..rounds {
        for (way, t) in ways.iter().zip(times.iter_mut()) {
            t.push(time_to_sync(device, way));
        }
    }
    times
}

fn nf4_dq() -> Nf4Config {
    Nf4Config {
        block_size: 64,
        double_quant: true,
    }
}

pub fn run(device: &Device, rounds: usize, smoke: bool) -> Result<RowFigures> {
    // A TinyLlama MLP weight (gate/up, [5632, 2048]); SmolLM2's for the smoke run.
    let shape = if smoke { [1536, 576] } else { [5632, 2048] };
    let n = shape[0] * shape[1];
    let values: Vec<f32> = (0..n)
        .map(|i| ((i * 7919 % 10_007) as f32 / 10_007.0 - 0.5) * 0.04)
        .collect();
    let weight = Nf4Weight::new(
        Arc::new(Nf4Tensor::quantize(&values, &shape, &nf4_dq())?),
        device,
    );
    println!(
        "\nNF4 + DQ [{}×{}] times a few rows (generation), ms a product ({PRODUCTS_PER_CALL} per timed \
         call), median (min–max) of {rounds} alternating rounds; rows up to {ROWS_FROM_CODES} read the codes",
        shape[0], shape[1]
    );
    println!(
        "  {:>4} {:>22} {:>22} {:>8}",
        "rows", "from the codes, ms", "dequantizing, ms", "speedup"
    );
    let mut products = Vec::new();
    for rows in [1, 2, 4, 8, 16] {
        let x: Tensor<2> = Tensor::from_data(
            TensorData::new(
                (0..rows * shape[1])
                    .map(|i| (i % 13) as f32 / 13.0 - 0.5)
                    .collect::<Vec<f32>>(),
                [rows, shape[1]],
            ),
            device,
        );
        let from_codes = || {
            // Past ROWS_FROM_CODES the product dequantizes anyway; the kernel is called
            // directly here to see where it stops paying.
            let resident = weight.resident_on(device).expect("a GPU device");
            for _ in 0..PRODUCTS_PER_CALL {
                drop(
                    resident
                        .rows_times_transposed(&x, None)
                        .expect("shapes the kernel takes"),
                );
            }
        };
        let dequantizing = || {
            dequantizing_every_product(|| {
                for _ in 0..PRODUCTS_PER_CALL {
                    drop(nf4_matmul_saving_weight(x.clone(), &weight));
                }
            })
        };
        let [codes, dequant] = alternate(device, rounds, [&from_codes, &dequantizing]);
        let ms_a_product = 1e3 / PRODUCTS_PER_CALL as f64;
        let codes = Timing::of(&codes).scaled(ms_a_product);
        let dequant = Timing::of(&dequant).scaled(ms_a_product);
        let speedup = dequant.median / codes.median;
        let show = |t: Timing| format!("{:.3} ({:.3}–{:.3})", t.median, t.min, t.max);
        println!(
            "  {rows:>4} {:>22} {:>22} {speedup:>7.2}×",
            show(codes),
            show(dequant)
        );
        products.push(RowProduct {
            rows,
            from_codes_ms: codes,
            dequantizing_ms: dequant,
            speedup,
        });
    }
    let decoding = decoding(device, rounds, smoke)?;
    Ok(RowFigures {
        weight: shape,
        rows_from_codes: ROWS_FROM_CODES,
        products,
        decoding,
    })
}

/// Greedy KV-cached decoding with a QLoRA model (random weights from the preset), both ways.
fn decoding(device: &Device, rounds: usize, smoke: bool) -> Result<Decoding> {
    let (name, config, new_tokens) = if smoke {
        ("tiny-smol", LlamaConfig::tiny_smol(), 16)
    } else {
        ("SmolLM2-135M", LlamaConfig::smollm2_135m(), 32)
    };
    let s = Scenario {
        lora: Some(LoraConfig::default()),
        nf4: Some(nf4_dq()),
        ..Scenario::new(config, 1, 64)
    };
    device.seed(7);
    let model = random_model(&s, device).with_context(|| format!("a {name} QLoRA model"))?;
    let prompt: Vec<u32> = (0..16).map(|i| (i * 37 + 5) % 256).collect();
    let greedy = Sampling::default();
    let decode = || {
        model
            .generate(&prompt, new_tokens, &greedy, &[], |_| {})
            .expect("ids within the vocabulary")
    };
    let same_tokens = decode() == dequantizing_every_product(decode);
    let from_codes = || drop(decode());
    let dequantizing = || dequantizing_every_product(|| drop(decode()));
    let [codes, dequant] = alternate(device, rounds, [&from_codes, &dequantizing]);
    // The prompt's pass is in each time (a few percent of it at 16 prompt tokens).
    let per_second = |t: &[f64]| -> Vec<f64> { t.iter().map(|s| new_tokens as f64 / s).collect() };
    let (codes, dequant) = (
        Timing::of(&per_second(&codes)),
        Timing::of(&per_second(&dequant)),
    );
    let speedup = codes.median / dequant.median;
    println!(
        "\n{name} QLoRA r16 NF4 + DQ, greedy KV-cached decoding of {new_tokens} tokens after a \
         16-token prompt (prompt included), {rounds} alternating rounds:"
    );
    println!(
        "  from the codes {:.1} tokens/s ({:.1}–{:.1}), dequantizing {:.1} ({:.1}–{:.1}): {speedup:.2}×; same tokens: {same_tokens}",
        codes.median, codes.min, codes.max, dequant.median, dequant.min, dequant.max
    );
    Ok(Decoding {
        model: name.to_string(),
        new_tokens,
        from_codes_tokens_per_second: codes,
        dequantizing_tokens_per_second: dequant,
        speedup,
        same_tokens,
    })
}
