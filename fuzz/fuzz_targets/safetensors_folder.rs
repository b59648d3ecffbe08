//! A Hugging Face folder: the input is split into config.json and model.safetensors at the
//! first 0xFF byte, then loaded as a model. Any panic is a bug; errors are fine.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let (config, weights) = match bytes.iter().position(|&b| b == 0xFF) {
        Some(i) => (&bytes[..i], &bytes[i + 1..]),
        None => (bytes, &[][..]),
    };
    let dir = std::env::temp_dir().join(format!("napkin-fuzz-hf-{}", std::process::id()));
    if std::fs::create_dir_all(&dir).is_err()
        || std::fs::write(dir.join("config.json"), config).is_err()
        || std::fs::write(dir.join("model.safetensors"), weights).is_err()
    {
        return;
    }
    let _ = napkin_core::io::load_model(&dir, &napkin_core::device::cpu());
});
