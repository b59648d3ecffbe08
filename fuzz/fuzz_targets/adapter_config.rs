//! A peft adapter_config.json.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(bytes) {
        let _ = napkin_core::io::peft::parse_adapter_config(&value, "adapter_config.json");
    }
});
