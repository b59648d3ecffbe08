//! Exercise answers, checked against a bytes, a count and a choice exercise.
#![no_main]
use libfuzzer_sys::fuzz_target;
use napkin_core::exercises::{check, instance};

fuzz_target!(|bytes: &[u8]| {
    let text = String::from_utf8_lossy(bytes);
    for id in ["full-ft-adamw", "lora-count", "will-it-fit"] {
        if let Some(x) = instance(id, 1) {
            let _ = check(&text, &x.expected);
        }
    }
});
