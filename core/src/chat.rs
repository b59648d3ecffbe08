//! Chat templates: turning a conversation into the prompt text a chat model was trained on.
//!
//! Checkpoints ship their template as Jinja source (`tokenizer_config.json`'s `chat_template`,
//! GGUF's `tokenizer.chat_template`). napkin renders that source itself with a Jinja engine
//! (minijinja, with Python's string methods as transformers' sandbox offers them), the
//! variables transformers passes (`messages`, `add_generation_prompt`, `bos_token`,
//! `eos_token`) and its `raise_exception`: whatever format the model uses (ChatML, Llama-2,
//! Llama-3, Mistral, Zephyr, …) comes out as the model's own template writes it. Three formats
//! are also built in, for `--chat-format` when a model has no template.

use minijinja::{Environment, ErrorKind, Value, context};

use crate::error::{Error, Result};
use crate::tokenizer::TextTokenizer;

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

/// The fuel every render gets: about two million instructions or 128 MB of values, far
/// above what the real templates in the tests need (checked by rendering them with a
/// hundredth of it).
pub const BASE_FUEL: u64 = 2_000_000;
/// Fuel added per byte of the conversation, so long conversations render (a template may copy
/// each message a few times).
pub const FUEL_PER_BYTE: u64 = 4;
/// How deep macros and includes may nest.
pub const MAX_NESTING: usize = 64;

/// A checkpoint's Jinja chat template and the special tokens it may print.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatTemplate {
    /// The Jinja source.
    pub source: String,
    /// The text of the beginning-of-sequence token (`bos_token` in the template).
    pub bos_token: Option<String>,
    /// The text of the end-of-sequence token (`eos_token` in the template).
    pub eos_token: Option<String>,
}

impl ChatTemplate {
    /// The checkpoint's template with the texts of its BOS and EOS tokens (None when the
    /// checkpoint has no template).
    pub fn of(tokenizer: &TextTokenizer) -> Option<Self> {
        let text = |id: Option<u32>| id.and_then(|id| tokenizer.token_text(id));
        tokenizer.chat_template.as_ref().map(|source| ChatTemplate {
            source: source.clone(),
            bos_token: text(tokenizer.bos_id),
            eos_token: text(tokenizer.eos_ids.first().copied()),
        })
    }

    /// Renders `messages` (the prompt for the reply when `add_generation_prompt`).
    ///
    /// A template is code from the checkpoint, so it runs in a sandbox: a fuel budget (about
    /// one unit per instruction and per 64 bytes made) of [`BASE_FUEL`] plus [`FUEL_PER_BYTE`]
    /// per byte of the conversation bounds both its time and its memory, and macros may nest
    /// [`MAX_NESTING`] deep. A template that exceeds either is an error, not a hang.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        self.render_with_fuel(messages, add_generation_prompt, BASE_FUEL)
    }

    /// [`render`](Self::render) with `base_fuel` instead of [`BASE_FUEL`] (tests check that
    /// real templates need far less).
    pub fn render_with_fuel(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        base_fuel: u64,
    ) -> Result<String> {
        let mut env = Environment::new();
        let conversation: usize = messages
            .iter()
            .map(|m| m.content.len() + m.role.len())
            .sum();
        env.set_fuel(Some(base_fuel + FUEL_PER_BYTE * conversation as u64));
        env.set_recursion_limit(MAX_NESTING);
        // transformers renders chat templates with both on.
        if let Ok(syntax) = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
        {
            env.set_syntax(syntax);
        }
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> std::result::Result<Value, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| context! { role => m.role.clone(), content => m.content.clone() })
            .collect();
        env.render_str(
            &self.source,
            context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token.clone().unwrap_or_default(),
                eos_token => self.eos_token.clone().unwrap_or_default(),
            },
        )
        .map_err(|e| Error::Input(format!("the chat template: {}", describe(&e))))
    }
}

/// A Jinja error in one line: its kind and detail (a template's `raise_exception` message).
fn describe(e: &minijinja::Error) -> String {
    match e.detail() {
        Some(detail) => format!("{detail} ({})", e.kind()),
        None => e.kind().to_string(),
    }
}

/// A chat format napkin writes itself, for a model without a template (`--chat-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuiltInChat {
    /// ChatML, as SmolLM2 and Qwen.
    ChatMl,
    /// Llama-2 chat.
    Llama2,
    /// Zephyr / TinyLlama-Chat.
    Zephyr,
}

crate::config::spellings! {
    BuiltInChat, "chat format", "chat_format", serde;
    ChatMl => "chatml" []: "<|im_start|>role ... <|im_end|>, as SmolLM2 and Qwen",
    Llama2 => "llama2" []: "<s>[INST] <<SYS>> ... <</SYS>> user [/INST] assistant </s>",
    Zephyr => "zephyr" []: "<|system|> ... </s> <|user|> ... </s> <|assistant|>, as TinyLlama-Chat",
}

impl BuiltInChat {
    /// The format it names (ChatML without a default system prompt).
    pub fn format(self) -> ChatFormat {
        match self {
            BuiltInChat::ChatMl => ChatFormat::ChatMl {
                default_system: None,
            },
            BuiltInChat::Llama2 => ChatFormat::Llama2,
            BuiltInChat::Zephyr => ChatFormat::Zephyr,
        }
    }
}

/// How a conversation becomes text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChatFormat {
    /// The model's own Jinja template.
    Template(ChatTemplate),
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
    /// The model's template (checked by rendering a short conversation with it), or an error
    /// saying what to do when there is none or it does not render.
    pub fn from_template(template: Option<ChatTemplate>) -> Result<Self> {
        let Some(template) = template else {
            return Err(Error::Input(
                "this model has no chat template: give --chat-format chatml|llama2|zephyr, or write the prompt yourself".into(),
            ));
        };
        template.render(
            &[
                Message::new("user", "Hi"),
                Message::new("assistant", "Hello"),
            ],
            false,
        )?;
        Ok(ChatFormat::Template(template))
    }

    /// The format of a bare template source (no special tokens), as [`ChatFormat::from_template`].
    pub fn detect(template: Option<&str>) -> Result<Self> {
        Self::from_template(template.map(|source| ChatTemplate {
            source: source.to_string(),
            bos_token: None,
            eos_token: None,
        }))
    }

    /// The prompt for `messages`, ending where the assistant's reply begins when
    /// `add_generation_prompt` is set.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let mut out = String::new();
        match self {
            ChatFormat::Template(t) => return t.render(messages, add_generation_prompt),
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
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    /// A template in Llama-3's format, written for this test: the BOS token, a header per
    /// turn, `<|eot_id|>` after each, the contents trimmed.
    const LLAMA3_STYLE: &str = "{{- bos_token }}{%- for m in messages %}{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + m['content'] | trim + '<|eot_id|>' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}";

    /// A template in Mistral's format, written for this test: `[INST]` without Llama-2's
    /// `<<SYS>>` block, alternation enforced with `raise_exception`, Python's `.strip()`.
    const MISTRAL_STYLE: &str = "{{ bos_token }}{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if m['role'] == 'user' %}{{ '[INST] ' + m['content'].strip() + ' [/INST]' }}{% else %}{{ m['content'] + eos_token }}{% endif %}{% endfor %}";

    fn with_tokens(source: &str) -> ChatFormat {
        ChatFormat::from_template(Some(ChatTemplate {
            source: source.into(),
            bos_token: Some("<s>".into()),
            eos_token: Some("</s>".into()),
        }))
        .unwrap()
    }

    /// SmolLM2's own template, rendered by the Jinja engine, gives what napkin's built-in
    /// ChatML with the template's default system prompt gives (the renderer before this one).
    #[test]
    fn smollm2s_template_renders_as_the_built_in_chatml() {
        let format = ChatFormat::detect(Some(SMOLLM2)).unwrap();
        let built_in = ChatFormat::ChatMl {
            default_system: Some(
                "You are a helpful AI assistant named SmolLM, trained by Hugging Face".into(),
            ),
        };
        let conversations = [
            vec![Message::new("user", "Hi")],
            vec![
                Message::new("system", "Be brief."),
                Message::new("user", "Hi"),
                Message::new("assistant", "Hello"),
            ],
            vec![
                Message::new("user", "2+2?"),
                Message::new("assistant", "4"),
                Message::new("user", "and 3+3?"),
            ],
        ];
        for messages in &conversations {
            for generation in [true, false] {
                assert_eq!(
                    format.render(messages, generation).unwrap(),
                    built_in.render(messages, generation).unwrap()
                );
            }
        }
        assert_eq!(
            format.render(&conversations[0], true).unwrap(),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn llama3_and_mistral_formats_render_from_their_templates() {
        let llama3 = with_tokens(LLAMA3_STYLE);
        let msgs = [Message::new("system", " S "), Message::new("user", "U")];
        assert_eq!(
            llama3.render(&msgs, true).unwrap(),
            "<s><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        );
        // Mistral is not Llama-2: no <<SYS>> block, its own alternation rule.
        let mistral = with_tokens(MISTRAL_STYLE);
        let chat = [
            Message::new("user", " U1 "),
            Message::new("assistant", "A1"),
            Message::new("user", "U2"),
        ];
        assert_eq!(
            mistral.render(&chat, true).unwrap(),
            "<s>[INST] U1 [/INST]A1</s>[INST] U2 [/INST]"
        );
        let err = mistral
            .render(
                &[Message::new("system", "S"), Message::new("user", "U")],
                true,
            )
            .unwrap_err()
            .to_string();
        assert!(err.contains("Conversation roles must alternate"), "{err}");
    }

    #[test]
    fn llama2_and_zephyr_formats() {
        let msgs = [Message::new("system", "S"), Message::new("user", "U")];
        assert_eq!(
            ChatFormat::Llama2.render(&msgs, true).unwrap(),
            "<s>[INST] <<SYS>>\nS\n<</SYS>>\n\nU [/INST]"
        );
        assert_eq!(
            ChatFormat::Zephyr.render(&msgs, true).unwrap(),
            "<|system|>\nS</s>\n<|user|>\nU</s>\n<|assistant|>\n"
        );
    }

    #[test]
    fn missing_or_broken_templates_are_errors() {
        assert!(ChatFormat::detect(None).is_err());
        let err = ChatFormat::detect(Some("{% for m in messages %}{{ m.content }}"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("the chat template: ") && err.contains("syntax error"),
            "{err}"
        );
        let err = ChatFormat::detect(Some("{{ raise_exception('System role not supported') }}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("System role not supported"), "{err}");
    }

    /// A hostile template is an error quickly, not a hang or an allocation of gigabytes: an
    /// endless loop, a string multiplied past the fuel, unbounded recursion. (Not covered:
    /// doubling a list by `l + l` some 40 times makes minijinja 3.1 materialize it before it
    /// charges the fuel; a template that does so hangs.)
    #[test]
    fn hostile_templates_run_out_of_fuel_or_depth() {
        let conversation = [Message::new("user", "hi")];
        for (what, source, needle) in [
            (
                "loop",
                "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
                "fuel",
            ),
            ("string", "{{ 'x' * 99999999 }}", "fuel"),
            (
                "recursion",
                "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
                "recursion",
            ),
        ] {
            let started = std::time::Instant::now();
            let template = ChatTemplate {
                source: source.into(),
                bos_token: None,
                eos_token: None,
            };
            let err = template
                .render(&conversation, true)
                .unwrap_err()
                .to_string();
            assert!(err.to_lowercase().contains(needle), "{what}: {err}");
            assert!(
                started.elapsed().as_secs_f64() < 5.0,
                "{what}: {:?}",
                started.elapsed()
            );
        }
    }
}
