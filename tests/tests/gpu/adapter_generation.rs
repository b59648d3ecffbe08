//! Generation on wgpu with each fixture's peft adapter (on all seven projections, or on a
//! subset: q and v for `nk-gqa4-qv`, peft's default) over an NF4 base: the prompt's pass
//! (burn's ops over every token) and KV-cached decoding (one row: the NF4 row product with the
//! adapter's path in its launch, where the widths allow) give the CPU's logits. Measured on
//! lavapipe: at most 6.9e-7 of the largest logit over the six fixture models.

use napkin_core::config::Nf4Config;
use napkin_core::device::DeviceKind;
use napkin_core::io::load_hf_llama;
use napkin_core::model::Llama;
use napkin_core::model::generate::KvCache;
use napkin_tests::model_dirs;

use super::{ONE_AT_A_TIME, wgpu_device};

/// The fixture's base quantized to NF4 (blocks of 64, double quantization) with its adapter.
fn qlora(dir: &std::path::Path, device: &burn::tensor::Device) -> Llama {
    let nf4 = Nf4Config {
        block_size: 64,
        double_quant: true,
    };
    let (model, _) = load_hf_llama(dir, device)
        .unwrap()
        .quantize_nf4(&nf4)
        .unwrap()
        .load_lora(&dir.join("lora"))
        .unwrap();
    model
}

/// The prompt's last logits, then each decoded token's.
fn logits(model: &Llama, prompt: &[u32], fed: &[u32]) -> Vec<Vec<f32>> {
    let mut cache = KvCache::default();
    let mut out = vec![model.next_token_logits(prompt, &mut cache).unwrap()];
    for &id in fed {
        out.push(model.next_token_logits(&[id], &mut cache).unwrap());
    }
    out
}

#[test]
fn adapters_on_any_projections_generate_the_cpus_logits_on_wgpu() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (gpu, cpu) = (wgpu_device(), DeviceKind::Cpu.open().unwrap());
    let mut report = Vec::new();
    for dir in model_dirs() {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let (on_gpu, on_cpu) = (qlora(&dir, &gpu), qlora(&dir, &cpu));
        let vocab = on_cpu.config.vocab_size;
        let prompt: Vec<u32> = (0..12).map(|i| ((i * 37 + 5) % vocab) as u32).collect();
        let fed: Vec<u32> = (0..6).map(|i| ((i * 53 + 11) % vocab) as u32).collect();
        let (got, want) = (
            logits(&on_gpu, &prompt, &fed),
            logits(&on_cpu, &prompt, &fed),
        );
        let mut worst = 0f32;
        for (step, (g, w)) in got.iter().zip(&want).enumerate() {
            let scale = w.iter().fold(0f32, |m, v| m.max(v.abs()));
            let gap = g.iter().zip(w).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale;
            // f32 on both sides in other summation orders: float precision, not a model's figure.
            assert!(
                gap < 1e-4,
                "{name} step {step}: {gap:e} of the largest logit"
            );
            worst = worst.max(gap);
        }
        report.push(format!("{name} {worst:.1e}"));
    }
    eprintln!(
        "wgpu vs CPU generation logits, worst over the largest: {}",
        report.join(", ")
    );
}
