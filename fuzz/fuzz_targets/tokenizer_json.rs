//! A tokenizer.json, loaded and used on a fixed text.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let path = std::env::temp_dir().join(format!("napkin-fuzz-{}.json", std::process::id()));
    if std::fs::write(&path, bytes).is_err() {
        return;
    }
    if let Ok(t) = napkin_core::tokenizer::TextTokenizer::from_file(&path)
        && let Ok(ids) = t.encode("héllo wörld 123")
    {
        let _ = t.decode(&ids);
    }
});
