//! napkin's side of a case: build everything once, then a closure that does one timed run.

use std::sync::Arc;

use anyhow::{Context, Result};
use burn::tensor::{Device, Distribution, Tensor, TensorData};
use napkin_core::measure::{random_model, synthetic_micro_batches};
use napkin_core::model::Llama;
use napkin_core::model::generate::{KvCache, Sampling, choose};
use napkin_core::model::matmul_wt::matmul_wt;
use napkin_core::model::nf4_matmul::nf4_matmul;
use napkin_core::model::nf4_weight::Nf4Weight;
use napkin_core::predict::inventory::Scenario;
use napkin_core::quant::nf4::Nf4Tensor;
use napkin_core::rng::SplitMix64;
use napkin_core::train::{Optimizer, OptimizerConfig, StepOptions, forward_backward};

use super::cases::{Case, LEARNING_RATE, NF4, Work};

/// One run of a prepared case.
pub type Run = Box<dyn FnMut() -> Result<()>>;

/// Builds the case's model or data on `device` (the plain device; training opens its
/// autodiff twin) and returns the run.
pub fn prepare(case: &Case, device: &Device) -> Result<Run> {
    let sync = device.clone();
    let repeats = case.repeats();
    match &case.work {
        Work::Train(s) => {
            let train_device = device.clone().autodiff();
            train_device.seed(7);
            let mut model = Some(random_model(s, &train_device)?);
            let micro = synthetic_micro_batches(s)?;
            let mut optimizer = Optimizer::new(&OptimizerConfig {
                kind: s.optimizer,
                ..OptimizerConfig::default()
            });
            let checkpointing = s.checkpointing;
            Ok(Box::new(move || {
                let current: Llama = model.take().context("the previous step failed")?;
                let out = forward_backward(
                    &current,
                    &micro,
                    &StepOptions::default().with_checkpointing(checkpointing),
                )?
                .read();
                model = Some(optimizer.step(current, &out.grads, LEARNING_RATE));
                let _ = train_device.sync();
                Ok(())
            }))
        }
        Work::Forward(s) => {
            device.seed(7);
            let model = random_model(s, device)?;
            let micro = synthetic_micro_batches(s)?;
            Ok(Box::new(move || {
                for m in &micro {
                    drop(model.forward(&m.batch));
                }
                let _ = sync.sync();
                Ok(())
            }))
        }
        Work::Generate {
            config,
            prompt,
            new_tokens,
        } => {
            device.seed(7);
            let model = Llama::init(config, device);
            // The first synthetic row of a 1 × prompt scenario (the reference uses the same).
            let prompt = synthetic_micro_batches(&Scenario::new(config.clone(), 1, *prompt))?
                .swap_remove(0)
                .batch
                .input_ids;
            let new_tokens = *new_tokens;
            Ok(Box::new(move || {
                let mut cache = KvCache::default();
                let mut rng = SplitMix64(0);
                let greedy = Sampling::default();
                let mut logits = model.next_token_logits(&prompt, &mut cache)?;
                for _ in 0..new_tokens {
                    let next = choose(&logits, &greedy, &mut rng);
                    logits = model.next_token_logits(&[next], &mut cache)?;
                }
                Ok(())
            }))
        }
        Work::Nf4Quantize { rows, cols } => {
            let values = normal_values(*rows, *cols, device)?;
            let shape = [*rows, *cols];
            Ok(Box::new(move || {
                for _ in 0..repeats {
                    drop(Nf4Tensor::quantize(&values, &shape, &NF4)?);
                }
                Ok(())
            }))
        }
        Work::Nf4Dequantize { rows, cols } => {
            let q = quantized_weight(*rows, *cols, device)?;
            let mut out = vec![0.0f32; rows * cols];
            Ok(Box::new(move || {
                for _ in 0..repeats {
                    q.dequantize_into(&mut out);
                }
                Ok(())
            }))
        }
        Work::Nf4Matmul { tokens, rows, cols } => {
            let w = Nf4Weight::new(Arc::new(quantized_weight(*rows, *cols, device)?), device);
            let x: Tensor<2> =
                Tensor::random([*tokens, *cols], Distribution::Normal(0.0, 1.0), device);
            Ok(Box::new(move || {
                for _ in 0..repeats {
                    drop(nf4_matmul(x.clone(), &w));
                }
                let _ = sync.sync();
                Ok(())
            }))
        }
        Work::Matmul { n } => {
            let a: Tensor<2> = Tensor::random([*n, *n], Distribution::Normal(0.0, 1.0), device);
            let b: Tensor<2> = Tensor::random([*n, *n], Distribution::Normal(0.0, 1.0), device);
            Ok(Box::new(move || {
                // The product napkin's linear layers use (`x·Wᵀ`): on NdArray burn's own
                // 2-D matmul runs on one thread (kernels/cpu/gemm.rs).
                drop(matmul_wt(a.clone(), b.clone()));
                let _ = sync.sync();
                Ok(())
            }))
        }
    }
}

/// A `[rows, cols]` weight of [`normal_values`], NF4-quantized with the suite's settings.
fn quantized_weight(rows: usize, cols: usize, device: &Device) -> Result<Nf4Tensor> {
    Ok(Nf4Tensor::quantize(
        &normal_values(rows, cols, device)?,
        &[rows, cols],
        &NF4,
    )?)
}

/// `rows × cols` weights drawn like an initialised linear layer's (N(0, 0.02²)).
fn normal_values(rows: usize, cols: usize, device: &Device) -> Result<Vec<f32>> {
    let t: Tensor<2> = Tensor::random([rows, cols], Distribution::Normal(0.0, 0.02), device);
    let data: TensorData = t.into_data();
    data.try_to_vec::<f32>()
        .map_err(|e| anyhow::anyhow!("reading random weights back: {e:?}"))
}
