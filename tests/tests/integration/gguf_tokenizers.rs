//! Tokenizers built from GGUF metadata against llama.cpp's tokenizer tests: for each vocabulary
//! (`models/llama.cpp/vocab/`, fetched by `scripts/fetch/llama-cpp-data.sh`) the test texts (`.inp`:
//! digits, whitespace runs, tabs and newlines, accents, Cyrillic, CJK, emoji, code) must give the
//! ids Hugging Face's tokenizer for that model gives them (`.out`), and decode back.

use std::path::PathBuf;

use napkin_core::io::gguf::GgufFile;
use napkin_core::tokenizer::TextTokenizer;

/// The separator of llama.cpp's `.inp` files.
const SEPARATOR: &str = "\n__ggml_vocab_test__\n";

fn vocab_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/llama.cpp/vocab")
}

/// The texts and expected ids of one vocabulary.
fn cases(name: &str) -> Vec<(String, Vec<u32>)> {
    let base = vocab_dir().join(format!("ggml-vocab-{name}.gguf"));
    let read = |ext: &str| {
        let path = base.with_extension(format!("gguf.{ext}"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (run scripts/fetch/llama-cpp-data.sh)",
                path.display()
            )
        })
    };
    let texts: Vec<String> = read("inp").split(SEPARATOR).map(str::to_string).collect();
    // The file ends with a separator: the last piece is empty and is no case.
    let texts = &texts[..texts.len() - 1];
    let ids: Vec<Vec<u32>> = read("out")
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(texts.len(), ids.len(), "{name}: texts and id lines");
    texts.iter().cloned().zip(ids).collect()
}

fn tokenizer(name: &str) -> TextTokenizer {
    let path = vocab_dir().join(format!("ggml-vocab-{name}.gguf"));
    TextTokenizer::from_gguf(&GgufFile::open(&path).unwrap())
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Every case of `name` encodes to llama.cpp's expected ids; returns how many cases there were.
fn check(name: &str) -> usize {
    let tokenizer = tokenizer(name);
    let cases = cases(name);
    let mut wrong = Vec::new();
    for (text, want) in &cases {
        let got = tokenizer.encode(text).unwrap();
        if &got != want {
            wrong.push(format!(
                "  {text:?}\n    napkin {got:?}\n    HF     {want:?}"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{name}: {} of {} texts tokenize differently:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
    cases.len()
}

#[test]
fn sentencepiece_gguf_tokenizers_match_hugging_face() {
    // Llama 2 / TinyLlama / Mistral's kind, and Phi-3's: scores, byte fallback, `▁`.
    for name in ["llama-spm", "phi-3"] {
        assert!(check(name) > 40);
    }
}

#[test]
fn byte_level_gguf_tokenizers_match_hugging_face_for_each_pre_tokenizer() {
    for name in [
        "llama-bpe",
        "qwen2",
        "gpt-2",
        "mpt",
        "deepseek-llm",
        "deepseek-coder",
        "falcon",
        "starcoder",
        "refact",
        "command-r",
    ] {
        assert!(check(name) > 40, "{name}");
    }
}

#[test]
fn gguf_tokenizers_decode_what_they_encode() {
    for name in ["llama-spm", "llama-bpe", "qwen2"] {
        let tokenizer = tokenizer(name);
        for (text, _) in cases(name) {
            let ids = tokenizer.encode(&text).unwrap();
            assert_eq!(tokenizer.decode(&ids).unwrap(), text, "{name}: {text:?}");
        }
    }
}

/// Writes `tokenizer`'s GGUF metadata to a vocabulary-only GGUF and reads it back.
fn through_gguf(tokenizer: &TextTokenizer, tag: &str) -> TextTokenizer {
    let path = std::env::temp_dir().join(format!("napkin-vocab-{tag}-{}.gguf", std::process::id()));
    napkin_core::io::gguf::writer::write_gguf(
        &path,
        &tokenizer.gguf_metadata().unwrap(),
        &[],
        |_| unreachable!("no tensors"),
    )
    .unwrap();
    let back = TextTokenizer::from_gguf(&GgufFile::open(&path).unwrap())
        .unwrap_or_else(|e| panic!("{tag}: {e}"));
    std::fs::remove_file(&path).ok();
    back
}

/// A tokenizer as a `tokenizer.json` read back (what a Hugging Face folder gives napkin).
fn as_tokenizer_json(tokenizer: &TextTokenizer, tag: &str) -> TextTokenizer {
    let dir = std::env::temp_dir().join(format!("napkin-tokjson-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, bytes) in tokenizer.hf_files().unwrap() {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
    let back = TextTokenizer::from_file(&dir.join("tokenizer.json")).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    back
}

/// A GGUF written by napkin carries a tokenizer that tokenizes as the one it was written from:
/// copied through from a GGUF, or described from a tokenizer.json (SentencePiece scores from
/// the merge order; the byte-level pre-tokenizer named by comparing splits).
#[test]
fn exported_gguf_tokenizers_tokenize_as_their_source() {
    for name in ["llama-spm", "llama-bpe", "qwen2", "gpt-2", "deepseek-coder"] {
        let original = tokenizer(name);
        let from_json = as_tokenizer_json(&original, name);
        for (route, source) in [("gguf", &original), ("tokenizer.json", &from_json)] {
            let back = through_gguf(source, &format!("{name}-{route}"));
            for (text, want) in cases(name) {
                assert_eq!(
                    back.encode(&text).unwrap(),
                    want,
                    "{name} via {route}: {text:?}"
                );
            }
        }
    }
}

/// Special tokens written in the text are matched whole (one id each), before the model
/// splits the rest, as Hugging Face's tokenizers match added special tokens.
#[test]
fn special_tokens_in_text_stay_whole() {
    for (name, open, close) in [
        ("llama-bpe", "<|begin_of_text|>", "<|eot_id|>"),
        ("qwen2", "<|im_start|>", "<|im_end|>"),
        ("llama-spm", "<s>", "</s>"),
        ("phi-3", "<|user|>", "<|end|>"),
    ] {
        let tokenizer = tokenizer(name);
        let (a, b) = (
            tokenizer.token_to_id(open).unwrap(),
            tokenizer.token_to_id(close).unwrap(),
        );
        let ids = tokenizer.encode(&format!("{open}Hi there{close}")).unwrap();
        assert_eq!(ids.first(), Some(&a), "{name}: {ids:?}");
        assert_eq!(ids.last(), Some(&b), "{name}: {ids:?}");
        assert!(ids.len() <= 5, "{name}: {ids:?}");
    }
}
