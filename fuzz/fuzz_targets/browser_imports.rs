//! The browser app's imports: a dropped config.json and a `napkin measure --json` report.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let text = String::from_utf8_lossy(bytes);
    let _ = napkin_web::import::config_from_json("config.json", &text);
    let _ = napkin_web::import::measurement_from_json("measure.json", &text);
});
