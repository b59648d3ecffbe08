//! Qwen2 (a Llama with biases on q, k and v) against the Python stack
//! (`tests/corpus/qwen2`, by its script): transformers' logits over 256 positions from the HF
//! folder and from the GGUF llama.cpp's own converter writes (float model and quantized
//! engine); napkin's GGUF export equal to that file, tensor by tensor and key by key; three
//! QLoRA steps (NF4 with double quantization, peft's adapter, AdamW) whose losses follow
//! bitsandbytes + peft. The fixture model `nk-qwen2` runs the whole suite besides.

use std::path::{Path, PathBuf};

use napkin_core::config::{AttentionKind, Nf4Config};
use napkin_core::data::MicroBatch;
use napkin_core::device::DeviceKind;
use napkin_core::io::gguf::export::{GgufQuant, export_gguf};
use napkin_core::io::gguf::{GgufFile, load_gguf_llama, load_gguf_quantized};
use napkin_core::io::load_hf_llama;
use napkin_core::kernels::values::to_f32_vec;
use napkin_core::model::TokenBatch;
use napkin_core::model::quantized_llama::QuantizedKvCache;
use napkin_core::train::{AdamW, AdamWConfig, StepOptions, forward_backward};
use napkin_tests::{Reference, relative_gap};

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/qwen2")
}

fn ids(reference: &Reference, name: &str) -> Vec<Vec<u32>> {
    let (shape, ids) = reference.i64(name);
    ids.chunks(shape[1])
        .map(|row| row.iter().map(|&i| i as u32).collect())
        .collect()
}

#[test]
fn a_qwen2_gives_transformers_logits_from_its_folder_and_from_llama_cpps_gguf() {
    let reference = Reference::open_file(&corpus().join("reference.safetensors"));
    let rows = ids(&reference, "input_ids");
    let (_, want) = reference.f32("logits");
    let batch = TokenBatch::from_rows(&rows).unwrap();
    let device = DeviceKind::Cpu.open().unwrap();
    let mut model = load_hf_llama(&corpus().join("hf"), &device).unwrap();
    assert!(model.config.qkv_bias && model.config.sliding_window.is_none());
    let eager = relative_gap(&to_f32_vec(model.forward(&batch)), &want);
    model.attention = AttentionKind::Efficient;
    let efficient = relative_gap(&to_f32_vec(model.forward(&batch)), &want);
    let mut unbiased = model.clone();
    for layer in &mut unbiased.layers {
        let a = &mut layer.self_attn;
        for linear in [&mut a.q_proj, &mut a.k_proj, &mut a.v_proj] {
            linear.bias = None;
        }
    }
    let without = relative_gap(&to_f32_vec(unbiased.forward(&batch)), &want);

    let gguf = GgufFile::open(&corpus().join("model.f32.gguf")).unwrap();
    let from_gguf = load_gguf_llama(&gguf, &device).unwrap();
    assert_eq!(from_gguf.config.head_dim, 16);
    let gguf_gap = relative_gap(&to_f32_vec(from_gguf.forward(&batch)), &want);
    let engine = load_gguf_quantized(&gguf).unwrap();
    let mut cache = QuantizedKvCache::default();
    let engine_logits = engine.every_token_logits(&rows[0], &mut cache).unwrap();
    let engine_gap = relative_gap(&engine_logits, &want);
    eprintln!(
        "256 positions, logits off transformers' (of their scale): folder eager {eager:.1e}, \
         efficient {efficient:.1e}; llama.cpp's GGUF {gguf_gap:.1e}, on the quantized engine \
         {engine_gap:.1e}; without the biases {without:.1e}"
    );
    // The GGUF is f32, which the quantized engine keeps as f32 rows.
    for (what, found) in [
        ("eager", eager),
        ("efficient", efficient),
        ("gguf", gguf_gap),
        ("quantized engine", engine_gap),
    ] {
        assert!(found <= 1e-5, "{what}: {found:e}");
    }
    assert!(without > 1e-2, "the biases change the logits: {without:e}");
}

/// napkin writes a Qwen2 as llama.cpp's converter does: the same tensors (names, shapes and
/// f32 values, Q and K rows unpermuted, the biases), the same `qwen2.*` keys and values.
#[test]
fn napkins_qwen2_gguf_is_the_converters() {
    let device = DeviceKind::Cpu.open().unwrap();
    let model = load_hf_llama(&corpus().join("hf"), &device).unwrap();
    let theirs = GgufFile::open(&corpus().join("model.f32.gguf")).unwrap();
    let path = std::env::temp_dir().join(format!("napkin-qwen2-{}.gguf", std::process::id()));
    export_gguf(&model, Vec::new(), &path, GgufQuant::F32, false, "qwen2").unwrap();
    let ours = GgufFile::open(&path).unwrap();
    assert_eq!(
        ours.tensors.keys().collect::<Vec<_>>(),
        theirs.tensors.keys().collect::<Vec<_>>()
    );
    for (name, info) in &theirs.tensors {
        assert_eq!(ours.tensors[name].shape(), info.shape(), "{name}");
        assert_eq!(
            ours.read_f32(name).unwrap(),
            theirs.read_f32(name).unwrap(),
            "{name}"
        );
    }
    let mut compared = 0;
    for (key, value) in &theirs.metadata {
        if key.starts_with("qwen2.") || key == "general.architecture" {
            let mine = ours.metadata.get(key);
            assert_eq!(
                mine.map(|v| format!("{v:?}")),
                Some(format!("{value:?}")),
                "{key}"
            );
            compared += 1;
        }
    }
    assert!(compared >= 10, "{compared} keys");
    std::fs::remove_file(&path).ok();
}

#[test]
fn three_qlora_steps_follow_bitsandbytes_and_peft() {
    let reference = Reference::open_file(&corpus().join("reference.safetensors"));
    let (_, want) = reference.f32("qlora.losses");
    let rows = ids(&reference, "qlora.input_ids");
    let batch = TokenBatch::from_rows(&rows).unwrap();
    let labels: Vec<i64> = rows.iter().flatten().map(|&i| i64::from(i)).collect();
    let micro = MicroBatch { batch, labels };
    let device = DeviceKind::Cpu.open().unwrap().autodiff();
    let nf4 = Nf4Config {
        block_size: 64,
        double_quant: true,
    };
    let (mut model, _) = load_hf_llama(&corpus().join("hf"), &device)
        .unwrap()
        .quantize_nf4(&nf4)
        .unwrap()
        .load_lora(&corpus().join("lora"))
        .unwrap();
    let mut adamw = AdamW::new(AdamWConfig {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
    });
    let loss_and_grads = |model: &napkin_core::model::Llama| {
        forward_backward(model, std::slice::from_ref(&micro), &StepOptions::default())
            .unwrap()
            .read()
    };
    let mut losses = Vec::new();
    for _ in 0..3 {
        let step = loss_and_grads(&model);
        losses.push(step.loss);
        model = adamw.step(model, &step.grads, 1e-2);
    }
    losses.push(loss_and_grads(&model).loss);
    let worst = losses
        .iter()
        .zip(&want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    eprintln!("QLoRA losses {losses:?}, bitsandbytes + peft {want:?}: worst {worst:.1e}");
    assert!(worst <= 1e-5, "{worst:e}");
}
