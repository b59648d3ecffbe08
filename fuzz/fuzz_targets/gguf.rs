//! GGUF: open (header, metadata, tensor infos, bounds) and, when it opens, read every tensor
//! as f32 and the tokenizer it carries. Any panic is a bug; errors are fine.
#![no_main]
use libfuzzer_sys::fuzz_target;
use napkin_core::io::gguf::GgufFile;

fuzz_target!(|bytes: &[u8]| {
    let path = std::env::temp_dir().join(format!("napkin-fuzz-{}.gguf", std::process::id()));
    if std::fs::write(&path, bytes).is_err() {
        return;
    }
    if let Ok(gguf) = GgufFile::open(&path) {
        let names: Vec<String> = gguf.tensors.keys().cloned().collect();
        for name in names {
            let _ = gguf.read_f32(&name);
        }
        let _ = napkin_core::tokenizer::TextTokenizer::from_gguf(&gguf);
        let _ = napkin_core::io::gguf::gguf_config(&gguf);
    }
});
