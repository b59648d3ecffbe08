//! Tokenizers: the fixture `tokenizer.json` reproduces HF tokenizers' ids, tokens, offsets and
//! decoding exactly; SmolLM2's tokenizer rebuilt from GGUF metadata round-trips hard text and
//! keeps the chat specials whole.

use std::path::PathBuf;

use napkin_core::io::gguf::GgufFile;
use napkin_core::tokenizer::TextTokenizer;
use napkin_tests::fixture_root;

#[test]
fn fixture_tokenizer_matches_hf_tokenizers_exactly() {
    let dir = fixture_root().join("tokenizer");
    let tokenizer = TextTokenizer::from_file(&dir.join("tokenizer.json")).unwrap();
    let examples: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("examples.json")).unwrap()).unwrap();
    assert_eq!(
        tokenizer.vocab_size() as u64,
        examples["vocab_size"].as_u64().unwrap()
    );
    let examples = examples["examples"].as_array().unwrap();
    assert!(!examples.is_empty());
    for ex in examples {
        let text = ex["text"].as_str().unwrap();
        let (ids, tokens, offsets) = tokenizer.encode_detailed(text).unwrap();
        let want_ids: Vec<u32> = ex["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let want_tokens: Vec<String> = ex["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        let want_offsets: Vec<(usize, usize)> = ex["offsets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                (
                    o[0].as_u64().unwrap() as usize,
                    o[1].as_u64().unwrap() as usize,
                )
            })
            .collect();
        assert_eq!(ids, want_ids, "ids of {text:?}");
        assert_eq!(tokens, want_tokens, "tokens of {text:?}");
        assert_eq!(offsets, want_offsets, "offsets of {text:?}");
        assert_eq!(
            tokenizer.decode(&ids).unwrap(),
            ex["decoded"].as_str().unwrap(),
            "decode of {text:?}"
        );
    }
}

fn smollm2() -> TextTokenizer {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    TextTokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap()
}

#[test]
fn smollm2_gguf_tokenizer_round_trips_and_keeps_specials_whole() {
    let tokenizer = smollm2();
    for text in [
        "Hello, world!",
        "café naïve Zürich — 漢字 🦀",
        "fn main() {\n    println!(\"{}\", 1 + 2);\n}",
        "a    b\t\tc\n\n\nd",
        "12345 and 3.14159",
    ] {
        let ids = tokenizer.encode(text).unwrap();
        assert_eq!(
            tokenizer.decode(&ids).unwrap(),
            text,
            "round trip of {text:?}"
        );
    }
    let start = tokenizer
        .token_to_id("<|im_start|>")
        .expect("<|im_start|> in the vocabulary");
    let end = tokenizer
        .token_to_id("<|im_end|>")
        .expect("<|im_end|> in the vocabulary");
    let ids = tokenizer.encode("<|im_start|>user\nHi<|im_end|>").unwrap();
    assert_eq!(ids.first(), Some(&start));
    assert_eq!(ids.last(), Some(&end));
    assert!(
        tokenizer.eos_ids.contains(&end),
        "a chat turn ends generation"
    );
    // SmolLM2 splits numbers into single digits.
    let digits = tokenizer.encode("2026").unwrap();
    assert_eq!(digits.len(), 4, "{digits:?}");
}
