//! Real chat templates (llama.cpp's copies of Llama 3.1/3.2, Qwen2.5, Phi-3.5, Gemma 2,
//! Mistral NeMo, SmolLM3 and DeepSeek-R1-Distill's own, fetched by
//! `scripts/fetch/llama-cpp-data.sh`; SmolLM2's from its GGUF; TinyLlama-Chat's Zephyr) rendered by napkin exactly as transformers renders them
//! (`tests/corpus/chat_templates/expected.json`, made by `make_expected.py` beside it): the
//! same text for every conversation, the same refusal where the template refuses — within a
//! hundredth of the sandbox's fuel.

use std::path::PathBuf;

use napkin_core::chat::{BASE_FUEL, ChatTemplate, Message};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A template's Jinja source from where `expected.json` says it is: a file under the
/// repository, or `gguf:FILE` (the GGUF's `tokenizer.chat_template`).
fn template_source(spec: &serde_json::Value) -> String {
    let where_ = spec["source"].as_str().unwrap();
    if let Some(file) = where_.strip_prefix("gguf:") {
        let gguf = napkin_core::io::gguf::GgufFile::open(&root().join(file))
            .unwrap_or_else(|e| panic!("{file}: {e} (run scripts/fetch/smollm2.sh)"));
        return gguf.metadata["tokenizer.chat_template"]
            .as_str()
            .unwrap()
            .to_string();
    }
    let path = root().join(where_);
    std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run scripts/fetch/llama-cpp-data.sh)",
            path.display()
        )
    })
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
        let template = ChatTemplate {
            source: template_source(spec),
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
    assert!(checked >= 50, "{checked}");
}

/// Reply-only labels through each real template: the spans are found by rendering (the
/// prompt for each reply, then the conversation with it), so whatever the format, the learned
/// tokens are the replies (with the template's end-of-turn text) and nothing of the prompts —
/// also where a reply's prompt is not a prefix of the conversation (DeepSeek-R1's `<think>`)
/// or every conversation ends with an EOS (Phi-3.5).
#[test]
fn real_templates_learn_only_the_replies() {
    use napkin_core::chat::ChatFormat;
    use napkin_core::data::instruct::Conversation;
    use napkin_core::tokenizer::TextTokenizer;
    let tokenizer =
        TextTokenizer::from_file(&napkin_tests::fixture_root().join("tokenizer/tokenizer.json"))
            .unwrap();
    let expected: serde_json::Value = serde_json::from_slice(
        &std::fs::read(root().join("tests/corpus/chat_templates/expected.json")).unwrap(),
    )
    .unwrap();
    let conversation = Conversation::Chat(vec![
        Message::new("user", "What is the capital of France?"),
        Message::new("assistant", "Paris."),
        Message::new("user", "And of Peru?"),
        Message::new("assistant", "Lima."),
    ]);
    for (name, spec) in expected.as_object().unwrap() {
        let format = ChatFormat::from_template(Some(ChatTemplate {
            source: template_source(spec),
            bos_token: spec["bos_token"].as_str().map(str::to_string),
            eos_token: spec["eos_token"].as_str().map(str::to_string),
        }))
        .unwrap();
        let sample = conversation
            .render(Some(&format), &tokenizer, false)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let learned: Vec<u32> = sample
            .labels
            .iter()
            .filter(|&&l| l >= 0)
            .map(|&l| l as u32)
            .collect();
        let learned = tokenizer.decode(&learned).unwrap();
        let everything = tokenizer.decode(&sample.ids).unwrap();
        let (paris, lima) = (
            learned.find("Paris.").unwrap(),
            learned.find("Lima.").unwrap(),
        );
        assert!(paris < lima, "{name}: {learned:?}");
        for prompt in ["capital of France", "Peru", "user"] {
            assert!(
                !learned.contains(prompt),
                "{name} learns {prompt:?}: {learned:?}"
            );
            assert!(everything.contains(prompt) || prompt == "user", "{name}");
        }
        // The learned text is each reply and what the template closes a turn with (the same
        // after both; the last may add what closes the conversation, Phi-3.5's EOS):
        // "Paris.<|eot_id|>Lima.<|eot_id|>".
        let after_paris = &learned[paris + "Paris.".len()..lima];
        let after_lima = &learned[lima + "Lima.".len()..];
        assert!(paris == 0, "{name}: {learned:?}");
        assert!(
            !after_paris.is_empty() && after_lima.starts_with(after_paris),
            "{name}: {learned:?}"
        );
    }
}
