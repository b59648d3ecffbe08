//! Real chat templates (llama.cpp's copies of Llama 3.1/3.2, Qwen2.5, Phi-3.5, Gemma 2,
//! Mistral NeMo, SmolLM3 and DeepSeek-R1-Distill's own, fetched by
//! `scripts/fetch-llama-cpp-data.sh`) rendered by napkin exactly as transformers renders them
//! (`tests/corpus/chat_templates/expected.json`, made by `make_expected.py` beside it): the
//! same text for every conversation, the same refusal where the template refuses — within a
//! hundredth of the sandbox's fuel.

use std::path::PathBuf;

use napkin_core::chat::{BASE_FUEL, ChatTemplate, Message};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn real_templates_render_as_transformers_renders_them() {
    let expected: serde_json::Value = serde_json::from_slice(
        &std::fs::read(root().join("tests/corpus/chat_templates/expected.json")).unwrap(),
    )
    .unwrap();
    let mut wrong = Vec::new();
    let mut checked = 0;
    for (name, spec) in expected.as_object().unwrap() {
        let path = root().join(format!("models/llama.cpp/templates/{name}.jinja"));
        let source = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (run scripts/fetch-llama-cpp-data.sh)",
                path.display()
            )
        });
        let template = ChatTemplate {
            source,
            bos_token: spec["bos_token"].as_str().map(str::to_string),
            eos_token: spec["eos_token"].as_str().map(str::to_string),
        };
        for case in spec["cases"].as_array().unwrap() {
            let messages: Vec<Message> = case["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| Message::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
                .collect();
            let generation = case["add_generation_prompt"].as_bool().unwrap();
            let got = template.render_with_fuel(&messages, generation, BASE_FUEL / 100);
            checked += 1;
            match (case["text"].as_str(), case["error"].as_str(), got) {
                (Some(want), _, Ok(got)) if got == want => {}
                (None, Some(refusal), Err(e)) if e.to_string().contains(refusal) => {}
                (want, refusal, got) => wrong.push(format!(
                    "{name} ({} messages, generation prompt {generation}):\n  transformers {:?}\n  napkin       {:?}",
                    messages.len(),
                    want.map(str::to_string).or(refusal.map(|r| format!("error: {r}"))),
                    got.map_err(|e| e.to_string())
                )),
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {checked} differ:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    assert!(checked >= 40, "{checked}");
}
