//! LoRA on the token embedding and the LM head against peft (`tests/corpus/head_lora`, by its
//! script: a tiny untied Llama, an adapter on q, v, `lm_head` and `embed_tokens` with every A and
//! B drawn, saved as peft saves it, base layers included): logits, loss and every adapter
//! gradient; the merged model; napkin's file; checkpointing; the quantized engine; and the
//! refusal on a tied model.

use std::path::{Path, PathBuf};

use napkin_core::config::{LlamaConfig, LoraConfig, LoraTarget};
use napkin_core::data::MicroBatch;
use napkin_core::device::DeviceKind;
use napkin_core::io::gguf::GgufFile;
use napkin_core::io::gguf::export::{GgufQuant, export_gguf};
use napkin_core::io::gguf::load_gguf_quantized;
use napkin_core::io::peft::{PEFT_PREFIX, load_lora_quantized, read_adapter_config};
use napkin_core::io::{SafetensorsCheckpoint, load_hf_llama, load_model};
use napkin_core::kernels::values::{scalar, to_f32_vec};
use napkin_core::model::quantized_llama::QuantizedKvCache;
use napkin_core::model::{Llama, TokenBatch, causal_lm_loss};
use napkin_core::train::{StepOptions, forward_backward};
use napkin_tests::{Reference, assert_close, input_batch, relative_gap};

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/head_lora")
}

fn model(autodiff: bool) -> Llama {
    let device = DeviceKind::Cpu.open().unwrap();
    let device = if autodiff { device.autodiff() } else { device };
    let base = load_hf_llama(&corpus().join("hf"), &device).unwrap();
    let (model, config) = base.load_lora(&corpus().join("lora")).unwrap();
    assert!(config.embedding && config.head);
    model
}

type Adapter2d = burn::module::Param<burn::tensor::Tensor<2>>;

/// Every adapter tensor with its peft key: the blocks', the head's, the embedding's.
fn adapter_tensors(model: &Llama) -> Vec<(String, &Adapter2d)> {
    let mut out = Vec::new();
    let linears = model
        .lora_adapters()
        .into_iter()
        .map(|(path, _, a)| (path, a))
        .chain(model.head_adapter().map(|(path, a)| (path.to_string(), a)));
    for (path, adapter) in linears {
        out.push((format!("{path}.lora_A.weight"), &adapter.lora_a));
        out.push((format!("{path}.lora_B.weight"), &adapter.lora_b));
    }
    let embedding = model.embed_lora.as_ref().expect("an embedding adapter");
    for (name, param) in [
        ("lora_embedding_A", &embedding.lora_a),
        ("lora_embedding_B", &embedding.lora_b),
    ] {
        out.push((format!("model.embed_tokens.{name}"), param));
    }
    out
}

#[test]
fn embedding_and_head_adapters_match_peft() {
    let reference = Reference::open_file(&corpus().join("reference.safetensors"));
    let (batch, labels) = input_batch(&reference);
    let model = model(true);
    let logits = model.forward(&batch);
    let worst_logits = assert_close(
        "logits",
        &to_f32_vec(logits.clone()),
        &reference.f32("logits").1,
        1e-5,
        0.0,
    );
    let loss = causal_lm_loss(logits, &labels).unwrap().mean();
    let (got, want) = (scalar(loss.clone().inner()), reference.scalar("loss"));
    assert!((got - want).abs() <= 1e-5, "loss {got} vs {want}");
    let grads = loss.backward();
    let tensors = adapter_tensors(&model);
    assert_eq!(tensors.len(), reference.names_with_prefix("grad.").len());
    let mut worst = 0f32;
    for (key, param) in &tensors {
        let grad = param
            .val()
            .grad(&grads)
            .unwrap_or_else(|| panic!("no gradient for {key}"));
        worst = worst.max(assert_close(
            &format!("grad {key}"),
            &to_f32_vec(grad),
            &reference.f32(&format!("grad.{PEFT_PREFIX}{key}")).1,
            1e-5,
            1e-4,
        ));
    }
    eprintln!(
        "LoRA on embed_tokens, lm_head, q, v: logits within {worst_logits:.1e} of peft's, loss \
         {got:.7} vs {want:.7}, worst adapter gradient gap {worst:.1e} ({} tensors)",
        tensors.len()
    );
}

#[test]
fn merged_saved_checkpointed_and_quantized_alike() {
    let reference = Reference::open_file(&corpus().join("reference.safetensors"));
    let (batch, labels) = input_batch(&reference);
    let plain = model(false);
    let unmerged = to_f32_vec(plain.forward(&batch));
    let (merged, _) = plain.clone().merge_lora();
    assert!(merged.embed_lora.is_none() && merged.head_adapter().is_none());
    let merged_logits = to_f32_vec(merged.forward(&batch));
    let vs_peft = assert_close(
        "merged vs peft's merge_and_unload",
        &merged_logits,
        &reference.f32("merged_logits").1,
        1e-5,
        0.0,
    );
    assert_close("merged vs unmerged", &merged_logits, &unmerged, 1e-5, 0.0);

    // napkin's file: peft's adapter tensors, bit for bit (peft's copies of the base layers are
    // not written: the base is the model's own).
    let out = std::env::temp_dir().join(format!("napkin-head-lora-{}", std::process::id()));
    let config = read_adapter_config(&corpus().join("lora")).unwrap();
    plain.save_lora(&config, &out).unwrap();
    let ours = SafetensorsCheckpoint::open(&out.join("adapter_model.safetensors")).unwrap();
    let peft =
        SafetensorsCheckpoint::open(&corpus().join("lora/adapter_model.safetensors")).unwrap();
    let names: Vec<&str> = ours.names().collect();
    let expected: Vec<&str> = peft
        .names()
        .filter(|n| !n.ends_with(".base_layer.weight"))
        .collect();
    assert_eq!(names, expected);
    for name in &names {
        let shape = peft.info(name).unwrap().expect("a tensor").shape;
        assert_eq!(
            ours.read_f32(name, &shape).unwrap(),
            peft.read_f32(name, &shape).unwrap(),
            "{name}"
        );
    }
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("adapter_config.json")).unwrap()).unwrap();
    let targets: Vec<&str> = written["target_modules"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(targets.contains(&"embed_tokens") && targets.contains(&"lm_head"));
    std::fs::remove_dir_all(&out).ok();

    // Checkpointing: the embedding adapter's gradient comes from its own backward after the
    // blocks'; every gradient equals the plain step's.
    let trained = model(true);
    let micro = [MicroBatch {
        batch: batch.clone(),
        labels,
    }];
    let step = |checkpointing: bool| {
        forward_backward(
            &trained,
            &micro,
            &StepOptions::default().with_checkpointing(checkpointing),
        )
        .unwrap()
        .read()
    };
    let (a, b) = (step(false), step(true));
    assert!((a.loss - b.loss).abs() <= 1e-6);
    let mut worst = 0f32;
    for (key, param) in adapter_tensors(&trained) {
        let (ga, gb) = (
            to_f32_vec(a.grads.get(param.id).unwrap().clone()),
            to_f32_vec(b.grads.get(param.id).unwrap().clone()),
        );
        worst = worst.max(assert_close(
            &format!("checkpointed {key}"),
            &gb,
            &ga,
            1e-6,
            1e-5,
        ));
    }

    // The quantized engine: an F16 GGUF of the base with the adapter on top.
    let device = DeviceKind::Cpu.open().unwrap();
    let base = load_hf_llama(&corpus().join("hf"), &device).unwrap();
    let path = std::env::temp_dir().join(format!("napkin-head-lora-{}.gguf", std::process::id()));
    export_gguf(&base, Vec::new(), &path, GgufQuant::F16, false, "fixture").unwrap();
    let mut quantized = load_gguf_quantized(&GgufFile::open(&path).unwrap()).unwrap();
    load_lora_quantized(&mut quantized, &corpus().join("lora")).unwrap();
    let (float, _) = load_model(&path, &device)
        .unwrap()
        .load_lora(&corpus().join("lora"))
        .unwrap();
    std::fs::remove_file(&path).ok();
    let ids: Vec<u32> = (0..12).map(|i| (i * 37 + 5) % 256).collect();
    let got = quantized
        .every_token_logits(&ids, &mut QuantizedKvCache::default())
        .unwrap();
    let want =
        to_f32_vec(float.forward(&TokenBatch::from_rows(std::slice::from_ref(&ids)).unwrap()));
    let engine = relative_gap(&got, &want);
    assert!(engine <= 1e-5, "quantized engine {engine:e}");
    eprintln!(
        "merged: {vs_peft:.1e} of peft's merge; checkpointed gradients within {worst:.1e}; \
         the quantized engine {engine:.1e} of the scale"
    );
}

#[test]
fn outer_adapters_on_a_tied_model_are_refused_by_name() {
    let device = DeviceKind::Cpu.open().unwrap();
    let tied = Llama::init(&LlamaConfig::tiny_smol(), &device);
    for (embedding, head) in [(true, false), (false, true)] {
        let error = tied
            .clone()
            .with_lora(&LoraConfig {
                r: 4,
                targets: vec![LoraTarget::QProj],
                embedding,
                head,
                ..LoraConfig::default()
            })
            .unwrap_err()
            .to_string();
        assert!(error.contains("tied"), "{error}");
    }
}
