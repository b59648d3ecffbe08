//! TinyLlama-1.1B's Hugging Face layout, proven on a small randomly initialised checkpoint
//! (the real weights cannot be downloaded here): TinyLlama's `config.json` keys, its tensor
//! names with an untied LM head, bf16 weights in two shards with an index, a Llama-2 style
//! SentencePiece-BPE `tokenizer.json` with byte fallback, and the Zephyr chat template in
//! `tokenizer_config.json`.

use std::path::Path;

use burn::tensor::Tensor;
use napkin_core::chat::{ChatFormat, ChatTemplate, Message};
use napkin_core::config::LlamaConfig;
use napkin_core::device::DeviceKind;
use napkin_core::io::load_model;
use napkin_core::kernels::values::to_f32_vec;
use napkin_core::model::generate::{NextToken, Sampling};
use napkin_core::model::named::ParamTensor;
use napkin_core::model::{Llama, TokenBatch};
use napkin_core::tokenizer::tokenizer_for_model;
use safetensors::Dtype;
use serde_json::{Value, json};

use super::checkpoints::{Scratch, write_file};

/// TinyLlama-1.1B-Chat-v1.0's `config.json`, key for key.
fn tinyllama_config_json() -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": false,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "initializer_range": 0.02,
        "intermediate_size": 5632,
        "max_position_embeddings": 2048,
        "model_type": "llama",
        "num_attention_heads": 32,
        "num_hidden_layers": 22,
        "num_key_value_heads": 4,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": null,
        "rope_theta": 10000.0,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.35.0",
        "use_cache": true,
        "vocab_size": 32000
    })
}

/// TinyLlama-Chat's template (Zephyr format), as its `tokenizer_config.json` ships it.
const ZEPHYR_TEMPLATE: &str = "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}";

/// A small Llama-2 style tokenizer: `<unk> <s> </s>`, the 256 byte-fallback tokens, `▁`,
/// letters and a few merges; SentencePiece normalisation (prepend `▁`, spaces → `▁`).
fn llama_style_tokenizer_json() -> Value {
    let mut vocab: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    vocab.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    vocab.push("▁".into());
    vocab.extend(('a'..='z').chain('A'..='Z').map(String::from));
    vocab.extend([",", ".", "!", "?", "|", "<", ">"].map(String::from));
    let merges = [
        ("l", "l"),
        ("▁", "w"),
        ("o", "r"),
        ("▁w", "or"),
        ("▁", "H"),
        ("e", "ll"),
        ("▁H", "ell"),
        ("▁", "t"),
        ("h", "e"),
        ("▁t", "he"),
    ];
    for (a, b) in merges {
        vocab.push(format!("{a}{b}"));
    }
    let vocab_map: serde_json::Map<String, Value> = vocab
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), json!(i)))
        .collect();
    let special = |id: usize, content: &str| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false,
               "rstrip": false, "normalized": false, "special": true})
    };
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
        ]},
        "pre_tokenizer": null,
        "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}
        ]},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": "<unk>",
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
            "vocab": vocab_map,
            "merges": merges.iter().map(|(a, b)| format!("{a} {b}")).collect::<Vec<_>>()
        }
    })
}

/// The model's tensors by HF name, with values rounded to bf16 so that the bf16 files hold
/// them exactly.
fn bf16_exact_tensors(model: &Llama) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let round = |v: Vec<f32>| -> Vec<f32> {
        v.into_iter()
            .map(|x| half::bf16::from_f32(x).to_f32())
            .collect()
    };
    model
        .hf_parameters()
        .into_iter()
        .map(|(name, tensor)| match tensor {
            ParamTensor::Vector(t) => (name, t.dims().to_vec(), round(to_f32_vec(t))),
            ParamTensor::Matrix(t) => (name, t.dims().to_vec(), round(to_f32_vec(t))),
        })
        .collect()
}

fn write_json(path: &Path, value: &Value) {
    std::fs::write(path, serde_json::to_string_pretty(value).unwrap()).unwrap();
}

#[test]
fn tinyllama_config_parses_to_the_published_size() {
    let config = LlamaConfig::from_hf_json(&tinyllama_config_json(), "config.json").unwrap();
    assert_eq!(config.num_parameters(), 1_100_048_384);
    assert_eq!(config, LlamaConfig::tiny_llama_1_1b());
}

#[test]
fn a_tinyllama_layout_folder_loads_through_the_same_path() {
    // TinyLlama's config with small dimensions; 32:4 heads becomes 8:1 (grouped 8 to 1).
    let tokenizer_json = llama_style_tokenizer_json();
    let vocab = tokenizer_json["model"]["vocab"].as_object().unwrap().len();
    let mut config_json = tinyllama_config_json();
    for (key, value) in [
        ("hidden_size", 64),
        ("intermediate_size", 176),
        ("num_attention_heads", 8),
        ("num_key_value_heads", 1),
        ("num_hidden_layers", 2),
        ("vocab_size", vocab),
    ] {
        config_json[key] = json!(value);
    }
    let config = LlamaConfig::from_hf_json(&config_json, "config.json").unwrap();
    assert!(!config.tie_word_embeddings);

    let device = DeviceKind::Cpu.open().unwrap();
    device.seed(7);
    let tensors = bf16_exact_tensors(&Llama::init(&config, &device));
    assert!(tensors.iter().any(|(n, _, _)| n == "lm_head.weight"));

    // The same values twice: one f32 file, and TinyLlama's form (two bf16 shards + index).
    let single = Scratch::new("tinyllama-single");
    write_json(&single.0.join("config.json"), &config_json);
    write_file(&single.0.join("model.safetensors"), &tensors, Dtype::F32);

    let sharded = Scratch::new("tinyllama-sharded");
    write_json(&sharded.0.join("config.json"), &config_json);
    let (first, second) = tensors.split_at(tensors.len() / 2);
    let mut weight_map = serde_json::Map::new();
    let mut total_bytes = 0;
    for (i, part) in [first, second].into_iter().enumerate() {
        let file = format!("model-0000{}-of-00002.safetensors", i + 1);
        write_file(&sharded.0.join(&file), part, Dtype::BF16);
        for (name, _, values) in part {
            weight_map.insert(name.clone(), json!(file));
            total_bytes += 2 * values.len();
        }
    }
    write_json(
        &sharded.0.join("model.safetensors.index.json"),
        &json!({"metadata": {"total_size": total_bytes}, "weight_map": weight_map}),
    );
    write_json(&sharded.0.join("tokenizer.json"), &tokenizer_json);
    write_json(
        &sharded.0.join("tokenizer_config.json"),
        &json!({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                "chat_template": ZEPHYR_TEMPLATE, "model_max_length": 2048}),
    );

    let from_shards = load_model(&sharded.0, &device).unwrap();
    let from_single = load_model(&single.0, &device).unwrap();
    assert_eq!(from_shards.config, config);
    assert!(from_shards.lm_head.is_some(), "untied head");
    let batch = TokenBatch::single(&[1, 300, 17, 42, 2]).unwrap();
    let logits: Tensor<3> = from_shards.forward(&batch);
    assert_eq!(to_f32_vec(logits), to_f32_vec(from_single.forward(&batch)));

    // The tokenizer: merges, byte fallback for characters outside the vocabulary, EOS.
    let tokenizer = tokenizer_for_model(&sharded.0, None).unwrap();
    let ids = tokenizer.encode("Hello world").unwrap();
    let tokens: Vec<String> = ids
        .iter()
        .map(|&i| {
            tokenizer_json["model"]["vocab"]
                .as_object()
                .unwrap()
                .iter()
                .find(|(_, v)| v.as_u64() == Some(i as u64))
                .unwrap()
                .0
                .clone()
        })
        .collect();
    assert_eq!(tokens, ["▁Hell", "o", "▁wor", "l", "d"]);
    for text in ["Hello world", "café ünïcode €5", "two  spaces"] {
        let ids = tokenizer.encode(text).unwrap();
        assert_eq!(
            tokenizer.decode(&ids).unwrap(),
            text,
            "round trip of {text:?}"
        );
    }
    let e_acute = tokenizer.encode("é").unwrap();
    assert_eq!(
        &e_acute[1..],
        [3 + 0xC3, 3 + 0xA9],
        "é falls back to its UTF-8 bytes"
    );
    assert_eq!(tokenizer.eos_ids, [2]);

    // The chat template renders (Jinja, as transformers: trim_blocks, lstrip_blocks) as
    // TinyLlama-Chat expects, and as napkin's built-in Zephyr format.
    let format = ChatFormat::from_template(ChatTemplate::of(&tokenizer)).unwrap();
    let messages = [
        Message::new("system", "Be brief."),
        Message::new("user", "Hi"),
    ];
    let prompt = format.render(&messages, true).unwrap();
    assert_eq!(prompt, ChatFormat::Zephyr.render(&messages, true).unwrap());
    assert_eq!(
        prompt,
        "<|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\n"
    );

    // And it generates through the KV cache.
    let new = from_shards
        .generate(
            &tokenizer.encode(&prompt).unwrap(),
            4,
            &Sampling::default(),
            &[],
            |_| {},
        )
        .unwrap();
    assert_eq!(new.len(), 4);
    assert!(new.iter().all(|&id| (id as usize) < vocab));
}
