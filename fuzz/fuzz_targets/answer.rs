//! Exercise answers, checked against a bytes, a count and a choice exercise.
#![no_main]
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use napkin_core::exercises::{Expected, check, instance};

/// Building an instance runs the predictor: once, not per input.
fn expected() -> &'static [Expected] {
    static EXPECTED: OnceLock<Vec<Expected>> = OnceLock::new();
    EXPECTED.get_or_init(|| {
        ["full-ft-adamw", "lora-count", "will-it-fit"]
            .into_iter()
            .filter_map(|id| instance(id, 1).map(|x| x.expected))
            .collect()
    })
}

fuzz_target!(|bytes: &[u8]| {
    let text = String::from_utf8_lossy(bytes);
    for expected in expected() {
        let _ = check(&text, expected);
    }
});
