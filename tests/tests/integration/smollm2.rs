//! The real SmolLM2-135M-Instruct GGUF (Q4_1 / Q8_0 / F32 tensors), fetched by
//! `scripts/fetch-smollm2.sh` into `models/`: it loads, and it knows where Paris is.

use std::path::PathBuf;

use napkin_core::device::DeviceKind;
use napkin_core::io::gguf::{GgufFile, gguf_config, load_gguf_llama};
use napkin_core::kernels::values::to_f32_vec;
use napkin_core::model::TokenBatch;

pub fn smollm2_path() -> PathBuf {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.is_file(),
        "{} missing: run scripts/fetch-smollm2.sh (scripts/test.sh does)",
        path.display()
    );
    path
}

#[test]
fn smollm2_gguf_config_is_the_published_one() {
    let gguf = GgufFile::open(&smollm2_path()).unwrap();
    let config = gguf_config(&gguf).unwrap();
    let preset = napkin_core::config::LlamaConfig::smollm2_135m();
    assert_eq!(config.num_parameters(), preset.num_parameters());
    assert_eq!(
        (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim
        ),
        (9, 3, 64)
    );
    assert!(config.tie_word_embeddings);
    assert_eq!(config.rope_theta, 100_000.0);
}

#[test]
fn smollm2_completes_the_capital_of_france() {
    let gguf = GgufFile::open(&smollm2_path()).unwrap();
    let tokens = gguf.metadata["tokenizer.ggml.tokens"].as_array().unwrap();
    let id = |t: &str| {
        tokens
            .iter()
            .position(|v| v.as_str() == Some(t))
            .unwrap_or_else(|| panic!("no token {t}")) as u32
    };
    let prompt: Vec<u32> = ["The", "Ġcapital", "Ġof", "ĠFrance", "Ġis"]
        .iter()
        .map(|t| id(t))
        .collect();
    let model = load_gguf_llama(&gguf, &DeviceKind::Cpu.open().unwrap()).unwrap();
    let logits = to_f32_vec(model.forward(&TokenBatch::single(&prompt).unwrap()));
    let v = model.config.vocab_size;
    let last = &logits[(prompt.len() - 1) * v..];
    let best = (0..v).max_by(|&a, &b| last[a].total_cmp(&last[b])).unwrap();
    assert_eq!(
        tokens[best].as_str(),
        Some("ĠParis"),
        "next token after `The capital of France is`"
    );
}

#[test]
fn kv_cached_generation_matches_full_forward_logits() {
    use napkin_core::model::generate::KvCache;
    let gguf = GgufFile::open(&smollm2_path()).unwrap();
    let model = load_gguf_llama(&gguf, &DeviceKind::Cpu.open().unwrap()).unwrap();
    let ids: Vec<u32> = vec![1, 504, 3575, 282, 4649, 314, 2, 17, 42];
    let v = model.config.vocab_size;
    let full = to_f32_vec(model.forward(&TokenBatch::single(&ids).unwrap()));
    // Prefill five tokens, then feed the rest one at a time through the cache.
    let mut cache = KvCache::default();
    let mut got = model.next_token_logits(&ids[..5], &mut cache).unwrap();
    for t in 5..ids.len() {
        let want = &full[(t - 1) * v..t * v];
        let worst = got
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            worst < 1e-3,
            "position {t}: cached logits differ by {worst}"
        );
        got = model.next_token_logits(&ids[t..t + 1], &mut cache).unwrap();
    }
}

#[test]
fn smollm2_chat_answers_paris_greedily() {
    use napkin_core::chat::{ChatFormat, ChatTemplate, Message};
    use napkin_core::model::generate::Sampling;
    use napkin_core::tokenizer::TextTokenizer;
    let gguf = GgufFile::open(&smollm2_path()).unwrap();
    let tokenizer = TextTokenizer::from_gguf(&gguf).unwrap();
    let format = ChatFormat::from_template(ChatTemplate::of(&tokenizer)).unwrap();
    let prompt = format
        .render(
            &[Message::new("user", "What is the capital of France?")],
            true,
        )
        .unwrap();
    let model = load_gguf_llama(&gguf, &DeviceKind::Cpu.open().unwrap()).unwrap();
    let ids = model
        .generate(
            &tokenizer.encode(&prompt).unwrap(),
            24,
            &Sampling::default(),
            &tokenizer.eos_ids,
            |_| {},
        )
        .unwrap();
    let answer = tokenizer.decode(&ids).unwrap();
    assert!(answer.contains("Paris"), "answer: {answer}");
}
