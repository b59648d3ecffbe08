//! The quantized (generation) engine with a peft adapter gives the float model's logits: the
//! fixture's own adapter, and that adapter cut to subsets of its projections (peft's default
//! q,v leaves k between two adapted projections), on every fixture model (MHA, GQA, MQA). Both
//! of the engine's passes are checked: the prompt's (every token at once) and KV-cached
//! decoding (one token at a time).

use std::path::{Path, PathBuf};

use napkin_core::device::DeviceKind;
use napkin_core::io::gguf::GgufFile;
use napkin_core::io::gguf::export::{GgufQuant, export_gguf};
use napkin_core::io::gguf::load_gguf_quantized;
use napkin_core::io::peft::{load_lora_quantized, read_adapter_config};
use napkin_core::io::{load_hf_llama, load_model};
use napkin_core::kernels::values::to_f32_vec;
use napkin_core::model::TokenBatch;
use napkin_core::model::generate::{KvCache, NextToken};
use napkin_core::model::quantized_llama::{QuantizedKvCache, QuantizedLlama};
use napkin_tests::{model_dirs, relative_gap};

fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("napkin-qadapters-{}-{name}", std::process::id()))
}

/// F16 blocks are held as f32 with f32 activations: nothing rounds but f16 itself, so the two
/// engines agree to float precision with the same adapter on either side.
const TOLERANCE: f32 = 1e-5;

/// The adapter's own targets, then each alone, then every other one from the first and from
/// the second: subsets with unadapted projections before, between and after adapted ones.
fn subsets(targets: &[String]) -> Vec<Vec<String>> {
    let mut out = vec![targets.to_vec()];
    if targets.len() > 1 {
        out.extend(targets.iter().map(|t| vec![t.clone()]));
    }
    for start in [0, 1] {
        let every_other: Vec<String> = targets.iter().skip(start).step_by(2).cloned().collect();
        if !every_other.is_empty() && !out.contains(&every_other) {
            out.push(every_other);
        }
    }
    out
}

/// `lora/` cut to `keep`: its config with those target modules, its tensors on those only. An
/// adapter made as peft makes it (every `B = 0`) changes no logit, which would leave nothing to
/// compare: its `B` values are then drawn (a fixed sine pattern of size 0.05), since both sides
/// here are napkin's (the float model's adapter is checked against peft's elsewhere).
fn adapter_on(lora: &Path, keep: &[String], out: &Path) {
    std::fs::create_dir_all(out).unwrap();
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(lora.join("adapter_config.json")).unwrap()).unwrap();
    config["target_modules"] = serde_json::json!(keep);
    std::fs::write(out.join("adapter_config.json"), config.to_string()).unwrap();
    let bytes = std::fs::read(lora.join("adapter_model.safetensors")).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .tensors()
        .into_iter()
        .filter(|(name, _)| keep.iter().any(|t| name.contains(&format!(".{t}."))))
        .collect();
    assert!(!kept.is_empty(), "no tensors for {keep:?}");
    let all_b_zero = kept
        .iter()
        .filter(|(name, _)| name.contains("lora_B"))
        .all(|(_, view)| {
            // ±0.0: a zero draw scaled by a negative number is −0.0.
            view.data()
                .chunks_exact(4)
                .all(|v| f32::from_le_bytes([v[0], v[1], v[2], v[3]]) == 0.0)
        });
    let drawn: Vec<(String, Vec<u8>, safetensors::Dtype, Vec<usize>)> = kept
        .iter()
        .map(|(name, view)| {
            let mut data = view.data().to_vec();
            if all_b_zero && name.contains("lora_B") {
                assert_eq!(view.dtype(), safetensors::Dtype::F32, "{name}");
                data = (0..data.len() / 4)
                    .flat_map(|i| (0.05 * (i as f32 * 0.7 + 0.3).sin()).to_le_bytes())
                    .collect();
            }
            (name.clone(), data, view.dtype(), view.shape().to_vec())
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = drawn
        .iter()
        .map(|(name, data, dtype, shape)| {
            let view = safetensors::tensor::TensorView::new(*dtype, shape.clone(), data).unwrap();
            (name.clone(), view)
        })
        .collect();
    safetensors::serialize_to_file(views, None, &out.join("adapter_model.safetensors")).unwrap();
}

#[test]
fn an_adapter_on_any_subset_of_the_projections_gives_the_float_models_logits() {
    let device = DeviceKind::Cpu.open().unwrap();
    let mut checked = Vec::new();
    for dir in model_dirs() {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let base = load_hf_llama(&dir, &device).unwrap();
        let path = scratch(&format!("{name}.gguf"));
        export_gguf(&base, Vec::new(), &path, GgufQuant::F16, false, "fixture").unwrap();
        let plain = load_gguf_quantized(&GgufFile::open(&path).unwrap()).unwrap();
        let vocab = plain.config.vocab_size;
        let ids: Vec<u32> = (0..12).map(|i| ((i * 37 + 5) % vocab) as u32).collect();
        let targets: Vec<String> = read_adapter_config(&dir.join("lora"))
            .unwrap()
            .targets
            .iter()
            .map(|t| t.module_name().to_owned())
            .collect();
        for keep in subsets(&targets) {
            let what = format!("{name} {keep:?}");
            let lora = scratch(&format!("{name}-{}", keep.join("-")));
            adapter_on(&dir.join("lora"), &keep, &lora);
            let mut quantized = plain.clone();
            load_lora_quantized(&mut quantized, &lora).unwrap();
            let (float, _) = load_model(&path, &device)
                .unwrap()
                .load_lora(&lora)
                .unwrap();
            std::fs::remove_dir_all(&lora).ok();

            // The prompt's pass: every token's logits from one call.
            let prompt = quantized
                .every_token_logits(&ids, &mut QuantizedKvCache::default())
                .unwrap();
            let batch = TokenBatch::from_rows(std::slice::from_ref(&ids)).unwrap();
            let want = to_f32_vec(float.forward(&batch)); // [1, T, V]
            for (t, (got, want)) in prompt.chunks(vocab).zip(want.chunks(vocab)).enumerate() {
                let g = relative_gap(got, want);
                assert!(
                    g <= TOLERANCE,
                    "{what}, prompt position {t}: {g:e} of the scale"
                );
            }

            // Decoding, one token at a time through each engine's cache.
            let (mut qc, mut fc, mut pc) = (
                QuantizedKvCache::default(),
                KvCache::default(),
                QuantizedKvCache::default(),
            );
            let mut effect = 0f32;
            for (t, id) in ids.iter().enumerate() {
                let q = QuantizedLlama::next_token_logits(&quantized, &[*id], &mut qc).unwrap();
                let f = NextToken::next_token_logits(&float, &[*id], &mut fc).unwrap();
                let p = QuantizedLlama::next_token_logits(&plain, &[*id], &mut pc).unwrap();
                let g = relative_gap(&q, &f);
                assert!(
                    g <= TOLERANCE,
                    "{what}, decoded position {t}: {g:e} of the scale"
                );
                effect = effect.max(relative_gap(&p, &f));
            }
            // The adapter moves the logits far more than the engines differ.
            assert!(
                effect > 1e-3,
                "{what}: the adapter changed nothing ({effect:e})"
            );
            checked.push(what);
        }
        std::fs::remove_file(&path).ok();
    }
    eprintln!("checked: {}", checked.join("; "));
}
