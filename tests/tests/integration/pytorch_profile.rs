//! The predictor's PyTorch profile against PyTorch itself: saved-tensor bytes per layer, what
//! the forward leaves allocated and the step's peak, measured on the CPU for a grid of Hugging
//! Face Llamas (full fine-tuning, peft LoRA, bitsandbytes QLoRA, eager and sdpa attention,
//! dropout, eval mode, both kinds of checkpointing, f32 and bf16 models, B = 1 and 2, a
//! SmolLM2-sized slice) by
//! `tests/corpus/pytorch_profile/measure.py` (its header says how); and the same grid plus two
//! TinyLlama-1.1B-shaped cases (QLoRA + DQ + checkpointing at T = 512, bf16 LoRA at B = 2,
//! T = 256: held out at scale) measured on a CUDA GPU (`measured-cuda.json`: an H200, torch 2.11,
//! transformers 5.17, peft 0.21, bitsandbytes 0.50).

use std::path::Path;

use napkin_core::config::{LlamaConfig, LoraConfig, LoraTarget};
use napkin_core::predict::pytorch::{
    Attention, Checkpointing, Method, ModuleMode, PyTorchSetup, PyTorchStep, Quant4bit, Stack,
    TorchDevice, TorchDtype, predict,
};
use serde_json::Value;

/// Every figure within this much of PyTorch's.
const TOLERANCE: f64 = 0.05;

pub(crate) fn corpus(file: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus/pytorch_profile")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The setup `measure.py` builds for one case on `device`.
pub(crate) fn setup(case: &Value, device: TorchDevice) -> PyTorchSetup {
    let s = &case["settings"];
    let mode = case["mode"].as_str().unwrap();
    let ckpt = s["ckpt"].as_str().map(|k| match k {
        "reentrant" => Checkpointing::Reentrant,
        _ => Checkpointing::NonReentrant,
    });
    let lora = (mode != "full").then(|| LoraConfig {
        r: s["r"].as_u64().unwrap() as usize,
        alpha: 2.0 * s["r"].as_f64().unwrap(),
        dropout: s["dropout"].as_f64().unwrap(),
        targets: match s["targets"].as_str() {
            Some("all-linear") => LoraTarget::ALL.to_vec(),
            _ => PyTorchSetup::peft_default_targets(),
        },
        ..LoraConfig::default()
    });
    let method = match mode {
        "full" => Method::Full,
        "lora" => Method::Lora,
        _ => Method::QLora {
            quant: match s["quant"].as_str().unwrap() {
                "nf4" => Quant4bit::Nf4,
                _ => Quant4bit::Fp4,
            },
            double_quant: s["double_quant"].as_bool().unwrap_or(false),
            block_size: 64,
        },
    };
    let qlora = mode == "qlora";
    PyTorchSetup {
        batch: case["batch"].as_u64().unwrap() as usize,
        seq: case["seq"].as_u64().unwrap() as usize,
        method,
        lora,
        dtype: match s["dtype"].as_str() {
            Some("bf16") => TorchDtype::Bf16,
            _ => TorchDtype::F32,
        },
        compute_dtype: TorchDtype::Bf16,
        mode: match s["mode"].as_str() {
            Some("eval") => ModuleMode::Eval,
            Some("as-loaded") => ModuleMode::AsLoaded,
            _ => ModuleMode::Train,
        },
        checkpointing: ckpt,
        // measure.py checkpoints non-k-bit models as HF does for a peft model.
        input_require_grads: PyTorchSetup::input_hooked(mode != "full", qlora, ckpt),
        attention: match s["attn"].as_str().unwrap() {
            "eager" => Attention::Eager,
            _ => Attention::Sdpa,
        },
        device,
        stack: Stack::MEASURED,
        dpo: None,
    }
}

pub(crate) fn within(predicted: u64, measured: u64) -> bool {
    (predicted as f64 / measured as f64 - 1.0).abs() <= TOLERANCE
}

pub(crate) fn ratio(predicted: u64, measured: u64) -> String {
    format!(
        "{predicted} / {measured} = {:.3}",
        predicted as f64 / measured as f64
    )
}

#[test]
fn the_pytorch_profile_matches_pytorch_measured_on_the_cpu() {
    check_against(&corpus("measured.json"), TorchDevice::Cpu, 0);
}

/// Every figure of every case in `corpus` within ±5 % of the profile's for `device`, and the
/// saved tensors (per layer and outside the layers) within `saved_slack` bytes: 0 on the CPU;
/// on CUDA the two bf16 LoRA cases save 16 B a layer more than the profile (the rest to the
/// byte), which it does not explain.
/// The figures every PyTorch-profile corpus records for a case, predicted beside measured:
/// trainable bytes, what is alive after the forward, the peak, and (where the case recorded
/// them) the saved bytes of each layer and outside the layers.
pub(crate) fn measured_figures(step: &PyTorchStep, case: &Value) -> Vec<(&'static str, u64, u64)> {
    let mut figures = vec![
        (
            "trainable",
            step.trainable,
            case["trainable_bytes"].as_u64().unwrap(),
        ),
        (
            "alive after forward",
            step.alive_after_forward,
            case["alive_after_forward"].as_u64().unwrap(),
        ),
        (
            "peak",
            step.peak_above_weights,
            case["peak"].as_u64().unwrap(),
        ),
    ];
    if let Some(per_layer) = case["saved_per_layer"].as_array() {
        for (layer, measured) in per_layer.iter().enumerate() {
            figures.push((
                "saved in a layer",
                step.saved_per_layer[layer],
                measured.as_u64().unwrap(),
            ));
        }
        figures.push((
            "saved outside",
            step.saved_outside,
            case["saved_outside"].as_u64().unwrap(),
        ));
    }
    figures
}

fn check_against(corpus: &Value, device: TorchDevice, saved_slack: u64) {
    let mut failures = vec![];
    for case in corpus["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let config = LlamaConfig::from_hf_json(&case["config"], name).unwrap();
        let step: PyTorchStep = predict(&config, &setup(case, device));
        let mut figures = vec![(
            "weights",
            step.weights,
            case["weight_bytes"].as_u64().unwrap(),
        )];
        figures.extend(measured_figures(&step, case));
        for (what, predicted, measured) in figures {
            let line = format!("{name}: {what} {}", ratio(predicted, measured));
            println!("{line}");
            let saved = what.starts_with("saved");
            if (saved && predicted.abs_diff(measured) > saved_slack) || !within(predicted, measured)
            {
                failures.push(line);
            }
        }
    }
    assert!(
        failures.is_empty(),
        "outside ±5 % (saved tensors: beyond {saved_slack} B):\n{}",
        failures.join("\n")
    );
}

#[test]
fn the_pytorch_profile_matches_pytorch_measured_on_cuda() {
    check_against(&corpus("measured-cuda.json"), TorchDevice::Cuda, 16);
}
