//! Hostile input: every parser of user files fed thousands of deterministic mutations of a
//! good file (flipped bytes, truncation, absurd 64-bit counts and offsets, inserted and
//! repeated ranges, numbers swapped for huge or negative ones). Each must return — a model or
//! a typed error — and never panic. A cheap, seeded stand-in for coverage-guided fuzzing
//! that runs in every CI build.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use napkin_core::config::LlamaConfig;
use napkin_core::data::parse_jsonl;
use napkin_core::device::DeviceKind;
use napkin_core::exercises::{check, instance};
use napkin_core::io::load_model;
use napkin_core::tokenizer::TextTokenizer;
use napkin_tests::{ONE_MODEL, fixture_root, model_dir};

use super::gguf_files::fixture_as_gguf;

/// xorshift64*: deterministic mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One mutation of `good`; positions fall inside the first `hot` bytes four times in five
/// (headers, where the structure is).
fn mutate(good: &[u8], hot: usize, rng: &mut Rng) -> Vec<u8> {
    let mut out = good.to_vec();
    let len = out.len().max(1);
    let pos = |rng: &mut Rng| {
        if rng.below(5) < 4 {
            rng.below(hot.min(len))
        } else {
            rng.below(len)
        }
    };
    match rng.below(6) {
        0 => {
            for _ in 0..1 + rng.below(8) {
                let p = pos(rng);
                if p < out.len() {
                    out[p] = rng.next() as u8;
                }
            }
        }
        1 => out.truncate(pos(rng)),
        2 => {
            let p = pos(rng);
            let big = [u64::MAX, 1 << 40, 1 << 32, u32::MAX as u64, 0][rng.below(5)];
            for (i, b) in big.to_le_bytes().iter().enumerate() {
                if p + i < out.len() {
                    out[p + i] = *b;
                }
            }
        }
        3 => {
            let p = pos(rng).min(out.len());
            let junk: Vec<u8> = (0..1 + rng.below(32)).map(|_| rng.next() as u8).collect();
            out.splice(p..p, junk);
        }
        4 => {
            let a = pos(rng).min(out.len());
            let b = (a + rng.below(64)).min(out.len());
            let copy = out[a..b].to_vec();
            out.splice(a..a, copy);
        }
        _ => {
            // A run of digits replaced by a huge, negative or zero number (text formats).
            let text_pos = pos(rng);
            if let Some(start) = (text_pos..out.len()).find(|&i| out[i].is_ascii_digit()) {
                let end = (start..out.len())
                    .find(|&i| !out[i].is_ascii_digit())
                    .unwrap_or(out.len());
                let with = ["99999999999999999999", "-1", "0", "4294967297", "1e308"][rng.below(5)];
                out.splice(start..end, with.bytes());
            }
        }
    }
    out
}

/// Runs `parse` on `cases` mutations and fails on any panic; returns how many were refused.
fn survive(
    what: &str,
    good: &[u8],
    hot: usize,
    cases: usize,
    parse: &dyn Fn(&[u8]) -> bool,
) -> usize {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ what.len() as u64);
    let mut refused = 0;
    for case in 0..cases {
        let bytes = mutate(good, hot, &mut rng);
        match catch_unwind(AssertUnwindSafe(|| parse(&bytes))) {
            Ok(accepted) => refused += usize::from(!accepted),
            Err(_) => {
                let dump = std::env::temp_dir().join(format!("napkin-crash-{what}-{case}"));
                std::fs::write(&dump, &bytes).ok();
                panic!(
                    "{what}: mutation {case} panicked (input kept at {})",
                    dump.display()
                );
            }
        }
    }
    eprintln!("{what}: {cases} mutations, {refused} refused with a typed error, no panic");
    refused
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("napkin-hostile-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
        }
    }
}

#[test]
fn mutated_model_files_never_panic() {
    let device = DeviceKind::Cpu.open().unwrap();
    let dir = &model_dir(ONE_MODEL);
    let work = scratch("models");

    // GGUF: header (metadata, tensor infos) is the first few KiB.
    let gguf = work.join("model.gguf");
    fixture_as_gguf(dir, &gguf);
    let good = std::fs::read(&gguf).unwrap();
    let refused = survive("gguf", &good, 8192, 1500, &|bytes| {
        std::fs::write(&gguf, bytes).unwrap();
        load_model(&gguf, &device).is_ok()
    });
    assert!(
        refused > 500,
        "most mutations of the header should be refused"
    );

    // safetensors (+ the config beside it): the JSON header is at the front.
    let folder = work.join("hf");
    copy_dir(dir, &folder);
    let weights = folder.join("model.safetensors");
    let good = std::fs::read(&weights).unwrap();
    let header = 8 + u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    survive("safetensors", &good, header, 1500, &|bytes| {
        std::fs::write(&weights, bytes).unwrap();
        load_model(&folder, &device).is_ok()
    });
    std::fs::write(&weights, &good).unwrap();

    // config.json: parsed alone, and loaded with the good weights (sizes must be checked
    // against the file before anything of that size is allocated).
    let config_path = folder.join("config.json");
    let good = std::fs::read(&config_path).unwrap();
    survive("config.json", &good, good.len(), 1000, &|bytes| {
        std::fs::write(&config_path, bytes).unwrap();
        let parsed = serde_json::from_slice::<serde_json::Value>(bytes)
            .ok()
            .map(|v| LlamaConfig::from_hf_json(&v, "config.json"));
        let loaded = load_model(&folder, &device);
        matches!(parsed, Some(Ok(_))) && loaded.is_ok()
    });
    std::fs::write(&config_path, &good).unwrap();

    // A peft adapter folder: adapter_config.json and the adapter tensors (every fixture model
    // has one: a missing one fails rather than skipping the adapter's files).
    {
        assert!(
            dir.join("lora/adapter_config.json").is_file(),
            "{}: no lora/adapter_config.json",
            dir.display()
        );
        let lora = work.join("lora");
        copy_dir(&dir.join("lora"), &lora);
        let model = load_model(dir, &device.clone().autodiff()).unwrap();
        for file in ["adapter_config.json", "adapter_model.safetensors"] {
            let path = lora.join(file);
            let good = std::fs::read(&path).unwrap();
            survive(file, &good, 4096, 500, &|bytes| {
                std::fs::write(&path, bytes).unwrap();
                model.clone().load_lora(&lora).is_ok()
            });
            std::fs::write(&path, &good).unwrap();
        }
    }
    std::fs::remove_dir_all(&work).ok();
}

#[test]
fn mutated_text_inputs_never_panic() {
    // The shared root's tokenizer (the first model folder by name may be one of napkin's own
    // fixtures, beside which there is none: this part used to be skipped then).
    let fixtures = fixture_root();
    let work = scratch("text");
    let tokenizer = fixtures.join("tokenizer/tokenizer.json");
    assert!(tokenizer.is_file(), "{}: missing", tokenizer.display());
    let good = std::fs::read(&tokenizer).unwrap();
    let path = work.join("tokenizer.json");
    survive("tokenizer.json", &good, good.len(), 400, &|bytes| {
        std::fs::write(&path, bytes).unwrap();
        match TextTokenizer::from_file(&path) {
            Ok(t) => t.encode("héllo wörld 123").is_ok(),
            Err(_) => false,
        }
    });
    let data =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/napkin-instruct.jsonl");
    let text = std::fs::read_to_string(&data).unwrap();
    let good: String = text.lines().take(20).collect::<Vec<_>>().join("\n");
    survive(
        "instruct.jsonl",
        good.as_bytes(),
        good.len(),
        2000,
        &|bytes| {
            let text = String::from_utf8_lossy(bytes);
            parse_jsonl(&text, Path::new("data.jsonl")).is_ok()
        },
    );
    let exercise = instance("full-ft-adamw", 0).unwrap();
    survive("answer", b"128.48 GB", 9, 10_000, &|bytes| {
        check(&String::from_utf8_lossy(bytes), &exercise.expected).is_ok()
    });
    std::fs::remove_dir_all(&work).ok();
}
