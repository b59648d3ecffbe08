//! Chat templates: any text as a checkpoint's Jinja template, rendered on a short
//! conversation with and without the generation prompt, in napkin's sandbox (fuel and nesting
//! limits). Errors are fine; a panic, a hang or a blow-up is a bug.
#![no_main]
use libfuzzer_sys::fuzz_target;
use napkin_core::chat::{ChatTemplate, Message};

fuzz_target!(|bytes: &[u8]| {
    let template = ChatTemplate {
        source: String::from_utf8_lossy(bytes).into_owned(),
        bos_token: Some("<s>".into()),
        eos_token: Some("</s>".into()),
    };
    let conversation = [
        Message::new("system", "Be brief."),
        Message::new("user", "What is 2 + 2?"),
        Message::new("assistant", "4"),
        Message::new("user", "And 3 + 3?"),
    ];
    for add_generation_prompt in [false, true] {
        let _ = template.render(&conversation, add_generation_prompt);
    }
});
