//! The malformed-file corpus (`tests/corpus/malformed/`, checked in; its README lists each
//! file): every file and the exact error napkin must give for it — the file named, and what
//! is wrong in words a learner can act on. Regenerate the files from a micro model with
//! `NAPKIN_WRITE_CORPUS=1 cargo test -p napkin-tests --test integration malformed`; the
//! expected errors below are the specification and do not change with it.

use std::path::{Path, PathBuf};

use napkin_core::config::LlamaConfig;
use napkin_core::data::parse_jsonl;
use napkin_core::device::DeviceKind;
use napkin_core::exercises::{check, instance};
use napkin_core::io::load_model;
use napkin_core::io::save_hf_llama;
use napkin_core::model::Llama;

use super::gguf_files::fixture_as_gguf;

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/malformed")
}

/// One block, hidden 8, two heads (one KV head), vocabulary 16: a few kilobytes.
fn micro_config() -> LlamaConfig {
    LlamaConfig {
        vocab_size: 16,
        hidden_size: 8,
        intermediate_size: 16,
        num_hidden_layers: 1,
        num_attention_heads: 2,
        num_key_value_heads: 1,
        head_dim: 4,
        max_position_embeddings: 32,
        ..LlamaConfig::tiny_smol()
    }
}

/// Writes the corpus from the micro model (only with NAPKIN_WRITE_CORPUS=1).
fn write_corpus() {
    let root = corpus();
    let device = DeviceKind::Cpu.open().unwrap();
    device.seed(1);
    let model = Llama::init(&micro_config(), &device);
    let good_hf = std::env::temp_dir().join(format!("napkin-corpus-{}", std::process::id()));
    save_hf_llama(&model, &good_hf).unwrap();
    let gguf_path = good_hf.join("model.gguf");
    fixture_as_gguf(&good_hf, &gguf_path);
    let gguf = std::fs::read(&gguf_path).unwrap();
    let put = |name: &str, bytes: &[u8]| {
        let path = root.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    };
    // GGUF header: magic, version, tensor count, metadata count, then metadata and tensor
    // infos; the data section is aligned to 32 bytes at the end.
    put("gguf/truncated-in-header.gguf", &gguf[..20]);
    put("gguf/truncated-in-data.gguf", &gguf[..gguf.len() - 1]);
    let mut bad = gguf.clone();
    bad[..4].copy_from_slice(b"GGML");
    put("gguf/wrong-magic.gguf", &bad);
    let mut bad = gguf.clone();
    bad[4..8].copy_from_slice(&7u32.to_le_bytes());
    put("gguf/wrong-version.gguf", &bad);
    let mut bad = gguf.clone();
    bad[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    put("gguf/absurd-tensor-count.gguf", &bad);
    // Tensor offsets: the last u64 of each tensor info. Find `output_norm.weight`'s info and
    // point it past the end, or onto the tensor before it.
    let info = |name: &str| {
        let needle = [&(name.len() as u64).to_le_bytes()[..], name.as_bytes()].concat();
        let at = gguf
            .windows(needle.len())
            .position(|w| w == needle)
            .unwrap();
        let dims_at = at + needle.len();
        let n_dims = u32::from_le_bytes(gguf[dims_at..dims_at + 4].try_into().unwrap()) as usize;
        dims_at + 4 + 8 * n_dims + 4 // the offset field
    };
    let offset_at = info("output_norm.weight");
    let mut bad = gguf.clone();
    bad[offset_at..offset_at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    put("gguf/offset-out-of-range.gguf", &bad);
    let first = info("token_embd.weight");
    let mut bad = gguf.clone();
    let first_offset = gguf[first..first + 8].to_vec();
    bad[offset_at..offset_at + 8].copy_from_slice(&first_offset);
    put("gguf/overlapping-tensors.gguf", &bad);
    // A NaN in the data section's last float (output_norm.weight is written last).
    let mut bad = gguf.clone();
    let n = bad.len();
    bad[n - 4..].copy_from_slice(&f32::NAN.to_le_bytes());
    put("gguf/nan-weight.gguf", &bad);

    // HF folders.
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(good_hf.join("config.json")).unwrap()).unwrap();
    let weights = std::fs::read(good_hf.join("model.safetensors")).unwrap();
    let folder = |name: &str, config: &serde_json::Value, weights: &[u8]| {
        put(
            &format!("hf/{name}/config.json"),
            serde_json::to_string_pretty(config).unwrap().as_bytes(),
        );
        put(&format!("hf/{name}/model.safetensors"), weights);
    };
    let mut c = config.clone();
    c["num_attention_heads"] = 0.into();
    folder("zero-heads", &c, &weights);
    let mut c = config.clone();
    c["num_attention_heads"] = 3.into();
    c["num_key_value_heads"] = 3.into();
    c.as_object_mut().unwrap().remove("head_dim");
    folder("heads-not-dividing-hidden", &c, &weights);
    let mut c = config.clone();
    c["hidden_size"] = 12.into();
    c["head_dim"] = 6.into();
    folder("shape-mismatch", &c, &weights);
    let header = 8 + u64::from_le_bytes(weights[..8].try_into().unwrap()) as usize;
    folder("truncated-safetensors", &config, &weights[..header + 10]);
    let text = String::from_utf8(weights[8..header].to_vec()).unwrap();
    let as_i32 = text.replacen("\"F32\"", "\"I32\"", 1);
    let mut bad = weights[..8].to_vec();
    bad.extend(as_i32.as_bytes());
    bad.extend(&weights[header..]);
    folder("wrong-dtype", &config, &bad);

    write_tokenizer_corpus(&put);

    put(
        "data/not-json.jsonl",
        b"{\"instruction\": \"Name a colour.\", \"output\": \"Blue.\"}\n{instruction: unquoted}\n",
    );
    std::fs::remove_dir_all(&good_hf).ok();
}

/// GGUFs that carry only a tokenizer (no tensors), each wrong in one way.
fn write_tokenizer_corpus(put: &dyn Fn(&str, &[u8])) {
    use napkin_tests::GgufTestValue::{F32Array, I32Array, Str, StrArray};
    let strings = |items: &[&str]| StrArray(items.iter().map(|s| s.to_string()).collect());
    let write = |name: &str, metadata: Vec<(&str, napkin_tests::GgufTestValue)>| {
        let path = std::env::temp_dir().join(format!("napkin-corpus-{}.gguf", std::process::id()));
        napkin_tests::write_gguf(&path, &metadata, &[]);
        put(name, &std::fs::read(&path).unwrap());
        std::fs::remove_file(&path).ok();
    };
    let byte_level = |pre: &str, merges: &[&str]| {
        vec![
            ("tokenizer.ggml.model", Str("gpt2".into())),
            ("tokenizer.ggml.pre", Str(pre.into())),
            (
                "tokenizer.ggml.tokens",
                strings(&["a", "b", "ab", "<|end|>"]),
            ),
            ("tokenizer.ggml.token_type", I32Array(vec![1, 1, 1, 3])),
            ("tokenizer.ggml.merges", strings(merges)),
        ]
    };
    write(
        "gguf/tokenizer-unknown-pre.gguf",
        byte_level("tekken", &["a b"]),
    );
    write(
        "gguf/tokenizer-bad-merge.gguf",
        byte_level("gpt-2", &["ab"]),
    );
    let sentencepiece = |scores: Vec<f32>| {
        vec![
            ("tokenizer.ggml.model", Str("llama".into())),
            ("tokenizer.ggml.tokens", strings(&["<unk>", "▁", "a", "▁a"])),
            ("tokenizer.ggml.token_type", I32Array(vec![2, 1, 1, 1])),
            ("tokenizer.ggml.scores", F32Array(scores)),
        ]
    };
    write(
        "gguf/tokenizer-scores-short.gguf",
        sentencepiece(vec![0.0, -1.0, -2.0]),
    );
    let mut unknown_model = sentencepiece(vec![0.0, -1.0, -2.0, -3.0]);
    unknown_model[0].1 = Str("rwkv".into());
    write("gguf/tokenizer-unknown-model.gguf", unknown_model);
}

/// The exact errors of the tokenizer-only GGUFs.
fn tokenizer_corpus_errors(root: &Path) -> Vec<String> {
    use napkin_core::io::gguf::GgufFile;
    use napkin_core::tokenizer::TextTokenizer;
    let cases: &[(&str, &str)] = &[
        (
            "gguf/tokenizer-unknown-pre.gguf",
            "FILE: malformed checkpoint: tokenizer.ggml.pre `tekken` is not a pre-tokenizer napkin knows (known: gpt-2, mpt, olmo, llama-bpe, llama3, llama-v3, falcon3, dbrx, smaug-bpe, qwen2, stablelm2, smollm, starcoder, refact, command-r, deepseek-llm, deepseek-coder, falcon, default); pass the model's tokenizer.json with --tokenizer",
        ),
        (
            "gguf/tokenizer-bad-merge.gguf",
            "FILE: malformed checkpoint: merge `ab` is not two tokens",
        ),
        (
            "gguf/tokenizer-scores-short.gguf",
            "FILE: malformed checkpoint: tokenizer.ggml.scores has 3 entries for 4 tokens",
        ),
        (
            "gguf/tokenizer-unknown-model.gguf",
            "FILE: malformed checkpoint: tokenizer model `rwkv` is not supported (gpt2: byte-level BPE; llama: SentencePiece); pass a tokenizer.json",
        ),
    ];
    let mut wrong = Vec::new();
    for (name, expected) in cases {
        let path = root.join(name);
        let got = match GgufFile::open(&path).and_then(|g| TextTokenizer::from_gguf(&g)) {
            Ok(_) => "built a tokenizer".to_string(),
            Err(e) => e.to_string().replace(&path.display().to_string(), "FILE"),
        };
        if got != *expected {
            wrong.push(format!("{name}:\n  expected {expected}\n  got      {got}"));
        }
        // The same bytes from memory (the browser's way in) fail the same way.
        let bytes = std::fs::read(&path).expect("corpus file");
        let in_memory =
            match GgufFile::from_bytes("FILE", bytes).and_then(|g| TextTokenizer::from_gguf(&g)) {
                Ok(_) => "built a tokenizer".to_string(),
                Err(e) => e.to_string(),
            };
        if in_memory != *expected {
            wrong.push(format!(
                "{name} from bytes:\n  expected {expected}\n  got      {in_memory}"
            ));
        }
    }
    wrong
}

#[test]
fn malformed_corpus_gives_the_exact_errors() {
    if std::env::var_os("NAPKIN_WRITE_CORPUS").is_some() {
        write_corpus();
    }
    let root = corpus();
    let device = DeviceKind::Cpu.open().unwrap();
    let load_error = |name: &str| -> String {
        let path = root.join(name);
        match load_model(&path, &device) {
            Ok(_) => panic!("{name}: loaded"),
            Err(e) => e.to_string().replace(&path.display().to_string(), "FILE"),
        }
    };
    let cases: &[(&str, &str)] = &[
        (
            "gguf/truncated-in-header.gguf",
            "FILE: malformed checkpoint: GGUF: tensor count = 11 cannot fit in the 4 bytes left at byte 16",
        ),
        (
            "gguf/truncated-in-data.gguf",
            "FILE: malformed checkpoint: tensor `output_norm.weight`: bytes 2880..2912 lie outside the 2911-byte data section",
        ),
        (
            "gguf/wrong-magic.gguf",
            "FILE: malformed checkpoint: not a GGUF file (the first 4 bytes are not `GGUF`)",
        ),
        (
            "gguf/wrong-version.gguf",
            "FILE: malformed checkpoint: GGUF version 7 is not supported (2 or 3)",
        ),
        (
            "gguf/absurd-tensor-count.gguf",
            "FILE: malformed checkpoint: GGUF: tensor count = 18446744073709551615 cannot fit in the 3984 bytes left at byte 16",
        ),
        (
            "gguf/offset-out-of-range.gguf",
            "FILE: malformed checkpoint: tensor `output_norm.weight`: bytes 1099511627776..1099511627808 lie outside the 2912-byte data section",
        ),
        (
            "gguf/overlapping-tensors.gguf",
            "FILE: malformed checkpoint: tensors `output_norm.weight` and `token_embd.weight` overlap",
        ),
        (
            // Found by `scripts/ci/fuzz.sh gguf` (kept as the fuzzer wrote it).
            "gguf/fuzz-data-past-end.gguf",
            "FILE: malformed checkpoint: the tensor data would start at byte 512, past the end of the 494-byte file",
        ),
        (
            "gguf/nan-weight.gguf",
            "FILE: malformed checkpoint: tensor `output_norm.weight` holds a non-finite value at 7",
        ),
        (
            "hf/zero-heads",
            "FILE/config.json: `num_attention_heads` must be at least 1, found 0",
        ),
        (
            "hf/heads-not-dividing-hidden",
            "FILE/config.json: no `head_dim` given and hidden_size 8 is not divisible by num_attention_heads 3",
        ),
        (
            "hf/shape-mismatch",
            "FILE/model.safetensors: tensor `model.layers.0.input_layernorm.weight` has shape [8], expected [12]",
        ),
        (
            "hf/truncated-safetensors",
            "FILE/model.safetensors: malformed checkpoint: bad safetensors header: incomplete metadata, file not fully covered",
        ),
        (
            "hf/wrong-dtype",
            "FILE/model.safetensors: tensor `model.embed_tokens.weight` has dtype I32, expected one of F32, F16, BF16",
        ),
    ];
    let mut wrong = tokenizer_corpus_errors(&root);
    for (name, expected) in cases {
        let got = load_error(name);
        if got != *expected {
            wrong.push(format!("{name}:\n  expected {expected}\n  got      {got}"));
        }
    }
    let path = root.join("data/not-json.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    let got = parse_jsonl(&text, Path::new("not-json.jsonl"))
        .map(|_| ())
        .unwrap_err()
        .to_string();
    let expected = "not-json.jsonl:2: not valid JSON: key must be a string at line 1 column 2";
    if got != expected {
        wrong.push(format!(
            "data/not-json.jsonl:\n  expected {expected}\n  got      {got}"
        ));
    }
    let x = instance("full-ft-adamw", 0).unwrap();
    let got = check("128", &x.expected).unwrap_err().to_string();
    let expected = "`128` has no unit: bytes, seconds and FLOPs need one, e.g. `56 GB`, `52.2 GiB` or `5.6e10 bytes`";
    if got != expected {
        wrong.push(format!(
            "answer `128`:\n  expected {expected}\n  got      {got}"
        ));
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
