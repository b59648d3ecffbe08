//! A `napkin train` TOML run configuration, parsed and validated as the CLI does.
#![no_main]
use libfuzzer_sys::fuzz_target;
use napkin_core::train::TrainConfig;

fuzz_target!(|bytes: &[u8]| {
    let text = String::from_utf8_lossy(bytes);
    if let Ok(config) = toml::from_str::<TrainConfig>(&text) {
        let _ = config.validate();
        let _ = config.lora_config();
        let _ = config.compute_dtype();
    }
});
