//! The type of every tensor of a GGUF export equals llama.cpp's quantizer's choice for the same
//! file type, on five model shapes llama.cpp itself quantized
//! (`corpus/ggml/llama-cpp-type-mix.json`, made by `corpus/ggml/make_llama_cpp_reference.py`):
//! rows of whole K blocks over 16 and 28 layers (the Q4_K_M/Q5_K_M "more bits" layers), rows of
//! whole 32-blocks only with a tied head (every K-quant falls back), and rows that are not
//! whole 32-blocks (f16), and a Phi-3 (arch `phi3`: its fused `attn_qkv` and `ffn_up`).

use std::collections::BTreeMap;

use napkin_core::config::LlamaConfig;
use napkin_core::io::gguf::dequant::GgmlType;
use napkin_core::io::gguf::export::{GgufQuant, tensor_plan};
use serde_json::Value;

/// gguf-py's name of a ggml type (what the corpus records).
fn ggml_type(name: &str) -> GgmlType {
    match name {
        "F32" => GgmlType::F32,
        "F16" => GgmlType::F16,
        "Q8_0" => GgmlType::Q8_0,
        "Q4_0" => GgmlType::Q4_0,
        "Q5_0" => GgmlType::Q5_0,
        "Q5_1" => GgmlType::Q5_1,
        "Q4_K" => GgmlType::Q4K,
        "Q5_K" => GgmlType::Q5K,
        "Q6_K" => GgmlType::Q6K,
        other => panic!("llama.cpp chose {other}, which napkin does not write"),
    }
}

#[test]
fn every_tensor_of_an_export_is_typed_as_llama_cpp_types_it() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus/ggml/llama-cpp-type-mix.json");
    let cases: BTreeMap<String, Value> =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(cases.len(), 5);
    let mut checked = 0;
    for (name, case) in &cases {
        let size = |key: &str| case[key].as_u64().unwrap() as usize;
        let config = LlamaConfig {
            vocab_size: size("vocab"),
            hidden_size: size("hidden"),
            intermediate_size: size("intermediate"),
            num_hidden_layers: size("layers"),
            num_attention_heads: size("heads"),
            num_key_value_heads: size("kv_heads"),
            head_dim: size("hidden") / size("heads"),
            tie_word_embeddings: case["tied"].as_bool().unwrap(),
            fused_projections: case.get("arch").and_then(Value::as_str) == Some("phi3"),
            ..LlamaConfig::small()
        };
        let by_file_type = case["types"].as_object().unwrap();
        assert_eq!(by_file_type.len(), 8, "{name}");
        for (file_type, theirs) in by_file_type {
            // llama.cpp's file type names are napkin's `--quant` values.
            let quant: GgufQuant = file_type.to_lowercase().parse().unwrap();
            let theirs: BTreeMap<&str, GgmlType> = theirs
                .as_object()
                .unwrap()
                .iter()
                .map(|(t, ty)| (t.as_str(), ggml_type(ty.as_str().unwrap())))
                .collect();
            let ours: BTreeMap<String, GgmlType> = tensor_plan(&config, quant)
                .unwrap()
                .into_iter()
                .filter(|(_, e)| e.shape.len() == 2)
                .map(|(_, e)| (e.name, e.ggml_type))
                .collect();
            assert_eq!(
                ours.keys().map(String::as_str).collect::<Vec<_>>(),
                theirs.keys().copied().collect::<Vec<_>>(),
                "{name} {file_type}: the tensors"
            );
            let differing: Vec<String> = ours
                .iter()
                .filter(|(t, ty)| theirs[t.as_str()] != **ty)
                .map(|(t, ty)| format!("{t}: napkin {ty:?}, llama.cpp {:?}", theirs[t.as_str()]))
                .collect();
            assert!(differing.is_empty(), "{name} {file_type}: {differing:#?}");
            checked += ours.len();
        }
    }
    eprintln!("{checked} tensor types equal llama.cpp's");
}
