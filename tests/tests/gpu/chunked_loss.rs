//! The chunked loss (`model/chunked_loss.rs`) on wgpu: the head's products and the fused loss
//! kernels a chunk of rows at a time give the whole-logits step's loss and adapter gradients,
//! with chunks that straddle the rows' boundary and an ignored label, with and without
//! checkpointing (loss within 1e-5 relative, each adapter's gradient within 1e-4 of its
//! largest value; 1.2e-6 seen).

use napkin_core::config::{LlamaConfig, LoraConfig};
use napkin_core::data::MicroBatch;
use napkin_core::kernels::values::to_f32_vec;
use napkin_core::model::{IGNORE_INDEX, Llama, TokenBatch};
use napkin_core::train::{StepOptions, forward_backward};

use super::{ONE_AT_A_TIME, wgpu_device};

/// The adapters' gradients (A, then B, each adapter), in the model's order.
fn adapter_grads(model: &Llama, grads: &napkin_core::train::ParamGrads) -> Vec<Vec<f32>> {
    let mut out = Vec::new();
    for (_, _, a) in model.lora_adapters() {
        for p in [&a.lora_a, &a.lora_b] {
            out.push(to_f32_vec(
                grads.get(p.id).expect("an adapter gradient").clone(),
            ));
        }
    }
    out
}

#[test]
fn chunked_loss_on_wgpu_gives_the_whole_logits_step() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device().autodiff();
    device.seed(11);
    let config = LlamaConfig::tiny_gqa();
    let lora = LoraConfig {
        r: 4,
        alpha: 8.0,
        ..Default::default()
    };
    let model = Llama::init(&config, &device).with_lora(&lora).unwrap();
    let (b, t) = (2, 37);
    let rows: Vec<Vec<u32>> = (0..b)
        .map(|row| {
            (0..t)
                .map(|i| ((i * 13 + row * 7) % config.vocab_size) as u32)
                .collect()
        })
        .collect();
    let mut micro = MicroBatch::causal(TokenBatch::from_rows(&rows).unwrap());
    micro.labels[5] = IGNORE_INDEX;
    let micro = vec![micro];
    for checkpointing in [false, true] {
        let options = StepOptions::default().with_checkpointing(checkpointing);
        let whole = forward_backward(&model, &micro, &options).unwrap().read();
        let want = adapter_grads(&model, &whole.grads);
        for chunk in [5, 36, 100] {
            let chunked =
                forward_backward(&model, &micro, &options.with_loss_chunk_rows(Some(chunk)))
                    .unwrap()
                    .read();
            let what = format!("chunks of {chunk}, checkpointing {checkpointing}");
            assert!(
                (chunked.loss - whole.loss).abs() <= 1e-5 * whole.loss.abs(),
                "{what}: loss {} against {}",
                chunked.loss,
                whole.loss
            );
            let got = adapter_grads(&model, &chunked.grads);
            let mut worst = 0.0f32;
            for (g, w) in got.iter().zip(&want) {
                // lora_A's gradient is 0 at peft's init (B = 0): both sides must be.
                let scale = w.iter().fold(0f32, |m, v| m.max(v.abs()));
                let diff = g.iter().zip(w).fold(0f32, |m, (a, e)| m.max((a - e).abs()));
                worst = worst.max(if scale == 0.0 { diff } else { diff / scale });
            }
            eprintln!("{what}: adapters' gradients within {worst:.1e} of the largest");
            assert!(worst < 1e-4, "{what}: gradients {worst:.1e} apart");
        }
    }
}
