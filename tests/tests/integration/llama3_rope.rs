//! Llama 3's RoPE schedule, from an HF folder and from the GGUF llama.cpp's converter makes of it
//! (`tests/corpus/llama3_rope`, by its script: transformers' logits over 288 positions of a
//! schedule that bites after 64). Both loads, and the quantized engine on the GGUF, give
//! transformers' logits; plain RoPE (what a GGUF loaded as before) does not; napkin's GGUF export
//! writes the converter's divisors; the scalings napkin does not implement are refused by name.

use std::path::{Path, PathBuf};

use napkin_core::config::RopeScaling;
use napkin_core::device::DeviceKind;
use napkin_core::io::gguf::export::{GgufQuant, export_gguf};
use napkin_core::io::gguf::{GgufFile, GgufValue, load_gguf_quantized};
use napkin_core::io::load_model;
use napkin_core::kernels::values::to_f32_vec;
use napkin_core::model::TokenBatch;
use napkin_core::model::quantized_llama::QuantizedKvCache;
use napkin_core::model::rope::inverse_frequencies;
use napkin_tests::{GgufTestValue, Reference, relative_gap, write_gguf};

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/llama3_rope")
}

fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("napkin-llama3-rope-{}-{name}", std::process::id()))
}

/// transformers' logits are f32 too: what is left is summation order.
const TOLERANCE: f32 = 1e-5;

#[test]
fn llama3_rope_from_an_hf_folder_and_its_gguf_gives_transformers_logits() {
    let reference = Reference::open_file(&corpus().join("reference.safetensors"));
    let (_, ids) = reference.i64("input_ids");
    let ids: Vec<u32> = ids.iter().map(|&i| i as u32).collect();
    let batch = TokenBatch::from_rows(std::slice::from_ref(&ids)).unwrap();
    let (_, want) = reference.f32("logits");
    let (_, unscaled) = reference.f32("logits_unscaled");
    // The schedule matters at these positions: plain RoPE is far off.
    assert!(
        relative_gap(&unscaled, &want) > 0.1,
        "{}",
        relative_gap(&unscaled, &want)
    );
    let device = DeviceKind::Cpu.open().unwrap();
    let hf = load_model(&corpus().join("hf"), &device).unwrap();
    let gguf_path = corpus().join("model.gguf");
    let from_gguf = load_model(&gguf_path, &device).unwrap();
    for (what, model) in [("HF folder", &hf), ("GGUF", &from_gguf)] {
        assert!(
            matches!(model.config.rope_scaling, RopeScaling::Llama3 { .. }),
            "{what}: {:?}",
            model.config.rope_scaling
        );
        let g = relative_gap(&to_f32_vec(model.forward(&batch)), &want);
        eprintln!("{what}: logits within {g:.1e} of the largest of transformers'");
        assert!(
            g <= TOLERANCE,
            "{what}: logits {g:e} of the largest from transformers'"
        );
    }
    // The GGUF's schedule gives the HF one's frequencies.
    let (a, b) = (
        inverse_frequencies(&hf.config),
        inverse_frequencies(&from_gguf.config),
    );
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() <= 1e-6 * x, "{:?} vs {:?}", a, b);
    }
    // The quantized (generation) engine, on every position in one pass.
    let quantized = load_gguf_quantized(&GgufFile::open(&gguf_path).unwrap()).unwrap();
    let got = quantized
        .every_token_logits(&ids, &mut QuantizedKvCache::default())
        .unwrap();
    let g = relative_gap(&got, &want);
    eprintln!(
        "quantized engine: within {g:.1e}; plain RoPE: {:.3}; schedule read from the GGUF: {:?}",
        relative_gap(&unscaled, &want),
        from_gguf.config.rope_scaling
    );
    assert!(g <= TOLERANCE, "quantized engine: {g:e} of the largest");
}

#[test]
fn napkin_writes_llama3_rope_as_llama_cpps_converter_does() {
    let reference = Reference::open_file(&corpus().join("reference.safetensors"));
    let (_, converter) = reference.f32("rope_freqs");
    let device = DeviceKind::Cpu.open().unwrap();
    let hf = load_model(&corpus().join("hf"), &device).unwrap();
    let path = scratch("export.gguf");
    export_gguf(&hf, Vec::new(), &path, GgufQuant::F32, false, "llama3-rope").unwrap();
    let written = GgufFile::open(&path).unwrap();
    let (shape, divisors) = written.read_f32("rope_freqs.weight").unwrap();
    assert_eq!(shape, [converter.len()]);
    for (d, c) in divisors.iter().zip(&converter) {
        assert!(
            (d - c).abs() <= 1e-6 * c,
            "{divisors:?} vs the converter's {converter:?}"
        );
    }
    let back = load_model(&path, &device).unwrap();
    let (_, ids) = reference.i64("input_ids");
    let ids: Vec<u32> = ids.iter().map(|&i| i as u32).collect();
    let batch = TokenBatch::from_rows(&[ids]).unwrap();
    let g = relative_gap(
        &to_f32_vec(back.forward(&batch)),
        &to_f32_vec(hf.forward(&batch)),
    );
    assert!(g <= TOLERANCE, "exported and read back: {g:e}");
    std::fs::remove_file(&path).ok();
}

/// The corpus GGUF written again with `extra` metadata and `divisors` in place of its own.
fn variant(name: &str, extra: &[(&str, GgufTestValue)], divisors: Option<Vec<f32>>) -> PathBuf {
    let source = GgufFile::open(&corpus().join("model.gguf")).unwrap();
    let mut metadata: Vec<(&str, GgufTestValue)> = source
        .metadata
        .iter()
        .filter_map(|(key, value)| {
            let value = match value {
                GgufValue::Uint(v) => GgufTestValue::U32(*v as u32),
                GgufValue::Float(v) => GgufTestValue::F32(*v as f32),
                GgufValue::String(s) => GgufTestValue::Str(s.clone()),
                _ => return None,
            };
            Some((key.as_str(), value))
        })
        .collect();
    metadata.extend(extra.iter().cloned());
    let tensors: Vec<(String, Vec<usize>, Vec<f32>)> = source
        .tensors
        .keys()
        .map(|name| {
            let (shape, values) = source.read_f32(name).unwrap();
            match (name.as_str(), &divisors) {
                ("rope_freqs.weight", Some(d)) => (name.clone(), vec![d.len()], d.clone()),
                _ => (name.clone(), shape, values),
            }
        })
        .collect();
    let path = scratch(&format!("{name}.gguf"));
    write_gguf(&path, &metadata, &tensors);
    path
}

#[test]
fn rope_scalings_napkin_does_not_implement_are_refused_by_name() {
    let device = DeviceKind::Cpu.open().unwrap();
    let cases = [
        (
            "yarn",
            vec![("llama.rope.scaling.type", GgufTestValue::Str("yarn".into()))],
            None,
            "RoPE scaling `yarn` (llama.rope.scaling.type)",
        ),
        (
            "linear",
            vec![("llama.rope.scaling.factor", GgufTestValue::F32(4.0))],
            None,
            "linear RoPE scaling by 4 (llama.rope.scaling.factor)",
        ),
        (
            "divisors",
            vec![],
            Some(vec![
                1.0, 5.0, 1.0, 5.0, 2.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0,
            ]),
            "`rope_freqs.weight` holds 16 per-frequency RoPE divisors that no Llama 3 schedule gives",
        ),
    ];
    for (name, extra, divisors, message) in cases {
        let path = variant(name, &extra, divisors);
        let error = load_model(&path, &device).err().map(|e| e.to_string());
        assert!(
            error.as_deref().is_some_and(|e| e.contains(message)),
            "{name}: {error:?}"
        );
        let error = load_gguf_quantized(&GgufFile::open(&path).unwrap())
            .err()
            .map(|e| e.to_string());
        assert!(
            error.as_deref().is_some_and(|e| e.contains(message)),
            "{name}, quantized engine: {error:?}"
        );
        std::fs::remove_file(&path).ok();
    }
}
