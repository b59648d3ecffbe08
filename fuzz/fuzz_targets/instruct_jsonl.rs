//! Instruction JSONL (alpaca, chat messages, text).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let text = String::from_utf8_lossy(bytes);
    let _ = napkin_core::data::instruct::parse_jsonl(&text, std::path::Path::new("data.jsonl"));
});
