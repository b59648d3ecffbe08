//! DoRA against peft (`tests/corpus/dora`, by its script: a tiny Llama, a DoRA adapter on q, v,
//! o and down with A, B and the magnitudes drawn away from their initial values, peft's
//! outputs on a float base and on bitsandbytes' NF4 base): logits, loss and every A, B and
//! magnitude gradient; the merged model; the peft format round trip; the quantized generation
//! engine; a fresh DoRA adapter starting at the base's outputs; and dropout under
//! checkpointing drawing the first forward's masks.

use std::path::{Path, PathBuf};

use burn::tensor::Tensor;
use napkin_core::config::{LoraConfig, LoraTarget, Nf4Config};
use napkin_core::data::MicroBatch;
use napkin_core::device::DeviceKind;
use napkin_core::io::gguf::GgufFile;
use napkin_core::io::gguf::export::{GgufQuant, export_gguf};
use napkin_core::io::gguf::load_gguf_quantized;
use napkin_core::io::load_hf_llama;
use napkin_core::io::peft::{MAGNITUDE, PEFT_PREFIX, load_lora_quantized};
use napkin_core::io::{SafetensorsCheckpoint, load_model};
use napkin_core::kernels::values::{scalar, to_f32_vec};
use napkin_core::model::quantized_llama::{QuantizedKvCache, QuantizedLlama};
use napkin_core::model::{Llama, TokenBatch, causal_lm_loss};
use napkin_core::train::{StepOptions, forward_backward};
use napkin_tests::{Reference, assert_close, input_batch, relative_gap};

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/dora")
}

fn reference() -> Reference {
    Reference::open_file(&corpus().join("reference.safetensors"))
}

/// The corpus model (NF4 as bitsandbytes quantized it: blocks of 64, no double quantization)
/// with the corpus adapter, on the CPU.
fn dora_model(nf4: bool, autodiff: bool) -> Llama {
    let device = DeviceKind::Cpu.open().unwrap();
    let device = if autodiff { device.autodiff() } else { device };
    let base = load_hf_llama(&corpus().join("hf"), &device).unwrap();
    let base = match nf4 {
        true => base
            .quantize_nf4(&Nf4Config {
                block_size: 64,
                double_quant: false,
            })
            .unwrap(),
        false => base,
    };
    let (model, config) = base.load_lora(&corpus().join("lora")).unwrap();
    assert!(config.use_dora);
    model
}

#[test]
fn dora_logits_loss_and_gradients_match_peft_on_a_float_and_an_nf4_base() {
    let reference = reference();
    let (batch, labels) = input_batch(&reference);
    for (prefix, nf4) in [("f32", false), ("nf4", true)] {
        let model = dora_model(nf4, true);
        let logits = model.forward(&batch);
        let worst_logits = assert_close(
            &format!("{prefix}: logits"),
            &to_f32_vec(logits.clone()),
            &reference.f32(&format!("{prefix}.logits")).1,
            1e-5,
            0.0,
        );
        let loss = causal_lm_loss(logits, &labels).unwrap().mean();
        let want = reference.scalar(&format!("{prefix}.loss"));
        let got = scalar(loss.clone().inner());
        assert!((got - want).abs() <= 1e-5, "{prefix}: loss {got} vs {want}");
        let grads = loss.backward();
        let adapters = model.lora_adapters();
        assert_eq!(
            3 * adapters.len(),
            reference
                .names_with_prefix(&format!("{prefix}.grad."))
                .len(),
            "one gradient per A, B and magnitude"
        );
        let mut worst = 0f32;
        for (path, _, adapter) in &adapters {
            let magnitude = adapter.magnitude.as_ref().expect("a DoRA magnitude");
            let parts: [(String, Tensor<2>); 2] = [
                (format!("{path}.lora_A.weight"), adapter.lora_a.val()),
                (format!("{path}.lora_B.weight"), adapter.lora_b.val()),
            ];
            let mut check = |key: String, grad: Vec<f32>| {
                worst = worst.max(assert_close(
                    &format!("{prefix}: grad {key}"),
                    &grad,
                    &reference
                        .f32(&format!("{prefix}.grad.{PEFT_PREFIX}{key}"))
                        .1,
                    1e-5,
                    1e-4,
                ));
            };
            for (key, value) in parts {
                check(key, to_f32_vec(value.grad(&grads).expect("∂A, ∂B")));
            }
            check(
                format!("{path}{MAGNITUDE}"),
                to_f32_vec(magnitude.val().grad(&grads).expect("∂m")),
            );
        }
        eprintln!(
            "DoRA on the {prefix} base: logits within {worst_logits:.1e} of peft's, loss \
             {got:.7} vs {want:.7}, worst A/B/m gradient gap {worst:.1e}"
        );
    }
}

#[test]
fn a_merged_dora_adapter_gives_peft_merged_logits_and_the_format_round_trips() {
    let reference = reference();
    let (batch, _) = input_batch(&reference);
    let model = dora_model(false, false);
    let unmerged = to_f32_vec(model.forward(&batch));
    let (merged, adapters) = model.clone().merge_lora();
    let merged_logits = to_f32_vec(merged.forward(&batch));
    let vs_peft = assert_close(
        "merged vs peft's merge_and_unload",
        &merged_logits,
        &reference.f32("f32.merged_logits").1,
        1e-5,
        0.0,
    );
    let vs_unmerged = assert_close("merged vs unmerged", &merged_logits, &unmerged, 1e-5, 0.0);
    // The row norms of the unmerged weight are not in the merged one: refused, not guessed.
    let error = merged.unmerge_lora(adapters).unwrap_err().to_string();
    assert!(error.contains("DoRA"), "{error}");

    // napkin's file holds peft's keys and values, bit for bit.
    let out = std::env::temp_dir().join(format!("napkin-dora-{}", std::process::id()));
    let config = napkin_core::io::peft::read_adapter_config(&corpus().join("lora")).unwrap();
    model.save_lora(&config, &out).unwrap();
    let ours = SafetensorsCheckpoint::open(&out.join("adapter_model.safetensors")).unwrap();
    let peft =
        SafetensorsCheckpoint::open(&corpus().join("lora/adapter_model.safetensors")).unwrap();
    let mut names: Vec<&str> = ours.names().collect();
    let mut expected: Vec<&str> = peft.names().collect();
    names.sort_unstable();
    expected.sort_unstable();
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
    assert_eq!(written["use_dora"], true);
    std::fs::remove_dir_all(&out).ok();
    eprintln!(
        "merged DoRA: logits within {vs_peft:.1e} of peft's merge, {vs_unmerged:.1e} of the \
         unmerged model; {} tensors round-trip bit for bit",
        names.len()
    );
}

#[test]
fn the_quantized_engine_runs_a_dora_adapter_as_the_float_model_does() {
    let device = DeviceKind::Cpu.open().unwrap();
    let base = load_hf_llama(&corpus().join("hf"), &device).unwrap();
    let path = std::env::temp_dir().join(format!("napkin-dora-{}.gguf", std::process::id()));
    export_gguf(&base, Vec::new(), &path, GgufQuant::F16, false, "fixture").unwrap();
    let mut quantized: QuantizedLlama =
        load_gguf_quantized(&GgufFile::open(&path).unwrap()).unwrap();
    let config = load_lora_quantized(&mut quantized, &corpus().join("lora")).unwrap();
    assert!(config.use_dora);
    let (float, _) = load_model(&path, &device)
        .unwrap()
        .load_lora(&corpus().join("lora"))
        .unwrap();
    std::fs::remove_file(&path).ok();
    let ids: Vec<u32> = (0..12).map(|i| (i * 37 + 5) % 256).collect();
    let got = quantized
        .every_token_logits(&ids, &mut QuantizedKvCache::default())
        .unwrap();
    let batch = TokenBatch::from_rows(std::slice::from_ref(&ids)).unwrap();
    let want = to_f32_vec(float.forward(&batch));
    let gap = relative_gap(&got, &want);
    eprintln!("the quantized engine with the DoRA adapter: {gap:.1e} of the scale");
    assert!(gap <= 1e-5, "{gap:e}");
}

#[test]
fn a_fresh_dora_adapter_starts_at_the_base_and_its_dropout_recomputes_alike() {
    let reference = reference();
    let (batch, labels) = input_batch(&reference);
    let device = DeviceKind::Cpu.open().unwrap().autodiff();
    device.seed(5);
    let base = load_hf_llama(&corpus().join("hf"), &device).unwrap();
    let lora = LoraConfig {
        r: 4,
        alpha: 8.0,
        dropout: 0.1,
        targets: vec![LoraTarget::QProj, LoraTarget::UpProj, LoraTarget::DownProj],
        use_dora: true,
        ..LoraConfig::default()
    };
    let model = base.clone().with_lora(&lora).unwrap();
    // m = ‖W‖ and B = 0: the model is the base (no dropout outside a training step here: a
    // graph-free forward).
    use burn::module::Module;
    let fresh = to_f32_vec(model.valid().forward(&batch));
    let plain = to_f32_vec(base.valid().forward(&batch));
    let gap = assert_close("fresh DoRA vs base", &fresh, &plain, 1e-6, 0.0);
    assert_eq!(
        model.trainable_parameters(),
        lora.trainable_parameters(&model.config)
    );

    // B away from zero, then one step with dropout, plain and checkpointed.
    let mut model = model;
    for named in model.block_linears_mut() {
        if let Some(adapter) = &mut named.linear.lora {
            let b = adapter.lora_b.val();
            let drawn = Tensor::random(
                b.dims(),
                burn::tensor::Distribution::Normal(0.0, 0.05),
                &b.device(),
            );
            adapter.lora_b = burn::module::Param::from_tensor(drawn);
        }
    }
    let micro = [MicroBatch {
        batch: batch.clone(),
        labels: labels.clone(),
    }];
    let step = |checkpointing: bool| {
        forward_backward(
            &model,
            &micro,
            &StepOptions::default()
                .with_checkpointing(checkpointing)
                .with_dropout_key(17),
        )
        .unwrap()
        .read()
    };
    let (plain, ckpt) = (step(false), step(true));
    assert!((plain.loss - ckpt.loss).abs() <= 1e-6);
    let mut worst = 0f32;
    for (_, _, adapter) in model.lora_adapters() {
        let magnitude = adapter.magnitude.as_ref().unwrap();
        for id in [adapter.lora_a.id, adapter.lora_b.id, magnitude.id] {
            let a = to_f32_vec(plain.grads.get(id).unwrap().clone());
            let b = to_f32_vec(ckpt.grads.get(id).unwrap().clone());
            worst = worst.max(assert_close(
                "DoRA dropout, checkpointed",
                &b,
                &a,
                1e-6,
                1e-5,
            ));
        }
    }
    // The masks matter: another stream moves the gradients.
    let other = forward_backward(&model, &micro, &StepOptions::default().with_dropout_key(18))
        .unwrap()
        .read();
    assert!((other.loss - plain.loss).abs() > 1e-6);
    eprintln!(
        "fresh DoRA: {gap:.1e} from the base; dropout 0.1 checkpointed: worst gradient gap \
         {worst:.1e}"
    );
}
