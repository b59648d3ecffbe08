//! Chat templates: turning a conversation into the prompt text a chat model was trained on.
//!
//! Checkpoints ship their template as Jinja source. Rather than run arbitrary Jinja, napkin
//! recognises the three formats its models use and renders them itself; anything else is a
//! clear error, never a silently wrong prompt.

use crate::error::{Error, Result};

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A message with a role.
    pub fn new(role: &str, content: &str) -> Self {
        Message {
            role: role.to_string(),
            content: content.to_string(),
        }
    }
}

/// A recognised chat format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChatFormat {
    /// ChatML (`<|im_start|>role\n...<|im_end|>\n`), as SmolLM2; with the system prompt the
    /// template inserts when the conversation has none.
    ChatMl {
        /// The template's default system prompt.
        default_system: Option<String>,
    },
    /// Llama-2 chat: `<s>[INST] <<SYS>>\n...\n<</SYS>>\n\nuser [/INST] assistant </s>`.
    Llama2,
    /// Zephyr / TinyLlama-Chat: `<|system|>\n...</s>\n<|user|>\n...</s>\n<|assistant|>\n`.
    Zephyr,
}

impl ChatFormat {
    /// Recognises the format of a Jinja chat template.
    pub fn detect(template: Option<&str>) -> Result<Self> {
        let Some(t) = template else {
            return Err(Error::Input(
                "this model has no chat template; drop --chat to use a plain prompt".into(),
            ));
        };
        if t.contains("<|im_start|>") {
            Ok(ChatFormat::ChatMl {
                default_system: default_chatml_system(t),
            })
        } else if t.contains("[INST]") {
            Ok(ChatFormat::Llama2)
        } else if t.contains("<|user|>") && t.contains("<|assistant|>") {
            Ok(ChatFormat::Zephyr)
        } else {
            Err(Error::Input(
                "this chat template is not one napkin can render (ChatML, Llama-2, Zephyr); drop --chat and write the prompt yourself".into(),
            ))
        }
    }

    /// The prompt for `messages`, ending where the assistant's reply begins when
    /// `add_generation_prompt` is set.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> String {
        let mut out = String::new();
        match self {
            ChatFormat::ChatMl { default_system } => {
                if let Some(system) = default_system
                    && messages.first().is_none_or(|m| m.role != "system")
                {
                    out.push_str(&format!("<|im_start|>system\n{system}<|im_end|>\n"));
                }
                for m in messages {
                    out.push_str(&format!(
                        "<|im_start|>{}\n{}<|im_end|>\n",
                        m.role, m.content
                    ));
                }
                if add_generation_prompt {
                    out.push_str("<|im_start|>assistant\n");
                }
            }
            ChatFormat::Llama2 => {
                let mut system: Option<&str> = None;
                for m in messages {
                    match m.role.as_str() {
                        "system" => system = Some(&m.content),
                        "user" => {
                            let content = match system.take() {
                                Some(s) => format!("<<SYS>>\n{s}\n<</SYS>>\n\n{}", m.content),
                                None => m.content.clone(),
                            };
                            out.push_str(&format!("<s>[INST] {} [/INST]", content.trim()));
                        }
                        _ => out.push_str(&format!(" {} </s>", m.content.trim())),
                    }
                }
            }
            ChatFormat::Zephyr => {
                for m in messages {
                    out.push_str(&format!("<|{}|>\n{}</s>\n", m.role, m.content));
                }
                if add_generation_prompt {
                    out.push_str("<|assistant|>\n");
                }
            }
        }
        out
    }
}

/// The system prompt a ChatML template inserts by default: the literal text between
/// `<|im_start|>system\n` and `<|im_end|>` inside the template, if there is one.
fn default_chatml_system(template: &str) -> Option<String> {
    let start = template
        .find("<|im_start|>system\\n")
        .map(|i| (i, "<|im_start|>system\\n".len()))
        .or_else(|| {
            template
                .find("<|im_start|>system\n")
                .map(|i| (i, "<|im_start|>system\n".len()))
        })?;
    let rest = &template[start.0 + start.1..];
    let end = rest.find("<|im_end|>")?;
    let text = &rest[..end];
    // A literal prompt, not a Jinja expression such as `{{ message['content'] }}`.
    (!text.contains("{{") && !text.is_empty()).then(|| text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn chatml_renders_smollm2s_default_system_prompt() {
        let format = ChatFormat::detect(Some(SMOLLM2)).unwrap();
        let prompt = format.render(&[Message::new("user", "Hi")], true);
        assert_eq!(
            prompt,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let own = format.render(
            &[
                Message::new("system", "Be brief."),
                Message::new("user", "Hi"),
            ],
            false,
        );
        assert!(
            own.starts_with("<|im_start|>system\nBe brief.<|im_end|>\n") && !own.contains("SmolLM")
        );
    }

    #[test]
    fn llama2_and_zephyr_formats() {
        let msgs = [Message::new("system", "S"), Message::new("user", "U")];
        assert_eq!(
            ChatFormat::Llama2.render(&msgs, true),
            "<s>[INST] <<SYS>>\nS\n<</SYS>>\n\nU [/INST]"
        );
        assert_eq!(
            ChatFormat::Zephyr.render(&msgs, true),
            "<|system|>\nS</s>\n<|user|>\nU</s>\n<|assistant|>\n"
        );
    }

    #[test]
    fn unknown_or_missing_templates_are_errors() {
        assert!(ChatFormat::detect(None).is_err());
        assert!(ChatFormat::detect(Some("{{ bos }}{{ messages }}")).is_err());
    }
}
