//! Training data files: JSON lines and JSON arrays of every record format (alpaca, sharegpt,
//! chat messages, prompt/completion, text).
#![no_main]
use libfuzzer_sys::fuzz_target;
use napkin_core::data::{DataFormat, parse_data};

fuzz_target!(|bytes: &[u8]| {
    let text = String::from_utf8_lossy(bytes);
    for name in ["data.jsonl", "data.json"] {
        let _ = parse_data(&text, std::path::Path::new(name), DataFormat::Auto);
    }
});
