//! Instruction data in JSONL, one example a line, in the shapes people have:
//!
//! - alpaca: `{"instruction": "...", "input": "..." (optional), "output": "..."}`
//! - chat: `{"messages": [{"role": "system" | "user" | "assistant", "content": "..."}, ...]}`
//! - plain: `{"text": "..."}` (causal LM, every token a label)
//!
//! Conversations are rendered with the model's chat template and the loss is taken on the
//! assistant replies only: each piece of the rendered text is tokenized on its own, and only
//! the pieces that are replies (with the template's end-of-turn marker) keep their labels.

use std::path::Path;

use serde_json::Value;

use super::sample::Sample;
use crate::chat::{ChatFormat, Message};
use crate::error::{Error, Result};
use crate::model::IGNORE_INDEX;
use crate::tokenizer::TextTokenizer;

/// One example of a data file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Conversation {
    /// Messages to render with a chat template; the assistant turns are learned.
    Chat(Vec<Message>),
    /// Plain text, all learned.
    Text(String),
}

/// Reads a JSONL file of examples. Blank lines are skipped; any other line that is not one of
/// the three shapes is an error naming the file and line.
pub fn read_jsonl(path: &Path) -> Result<Vec<Conversation>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    parse_jsonl(&text, path)
}

/// Parses JSONL text (`path` only names it in errors).
pub fn parse_jsonl(text: &str, path: &Path) -> Result<Vec<Conversation>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = |message: String| Error::Data {
            path: path.to_path_buf(),
            line: i + 1,
            message,
        };
        let value: Value =
            serde_json::from_str(line).map_err(|e| at(format!("not valid JSON: {e}")))?;
        out.push(conversation(&value).map_err(at)?);
    }
    if out.is_empty() {
        return Err(Error::Data {
            path: path.to_path_buf(),
            line: 0,
            message: "no examples in the file".into(),
        });
    }
    Ok(out)
}

fn conversation(value: &Value) -> std::result::Result<Conversation, String> {
    let field = |name: &str| -> std::result::Result<Option<String>, String> {
        match value.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(format!("`{name}` must be a string")),
        }
    };
    if let Some(messages) = value.get("messages") {
        let list = messages
            .as_array()
            .ok_or("`messages` must be a list of {role, content}")?;
        let mut out = Vec::with_capacity(list.len());
        for (k, m) in list.iter().enumerate() {
            let role = m.get("role").and_then(Value::as_str);
            let content = m.get("content").and_then(Value::as_str);
            match (role, content) {
                (Some(role @ ("system" | "user" | "assistant")), Some(content)) => {
                    out.push(Message::new(role, content))
                }
                (Some(role), Some(_)) => {
                    return Err(format!(
                        "message {k}: role `{role}` is not system, user or assistant"
                    ));
                }
                _ => return Err(format!("message {k} needs string `role` and `content`")),
            }
        }
        if !out.iter().any(|m| m.role == "assistant") {
            return Err("the conversation has no assistant message to learn".into());
        }
        return Ok(Conversation::Chat(out));
    }
    if let Some(instruction) = field("instruction")? {
        let output = field("output")?.ok_or("an alpaca example needs `output`")?;
        let user = match field("input")? {
            Some(input) if !input.trim().is_empty() => format!("{instruction}\n\n{input}"),
            _ => instruction,
        };
        let mut messages = Vec::new();
        if let Some(system) = field("system")? {
            messages.push(Message::new("system", &system));
        }
        messages.push(Message::new("user", &user));
        messages.push(Message::new("assistant", &output));
        return Ok(Conversation::Chat(messages));
    }
    if let Some(text) = field("text")? {
        return Ok(Conversation::Text(text));
    }
    Err("expected `messages`, `instruction` + `output`, or `text`".into())
}

impl Conversation {
    /// Tokens and labels: with a chat format, only the assistant replies are labels.
    pub fn render(&self, format: &ChatFormat, tokenizer: &TextTokenizer) -> Result<Sample> {
        let messages = match self {
            Conversation::Text(text) => return Ok(Sample::causal(tokenizer.encode(text)?)),
            Conversation::Chat(messages) => messages,
        };
        let mut ids = Vec::new();
        let mut labels = Vec::new();
        let mut push = |text: &str, learn: bool| -> Result<()> {
            let piece = tokenizer.encode(text)?;
            labels.extend(
                piece
                    .iter()
                    .map(|&id| if learn { i64::from(id) } else { IGNORE_INDEX }),
            );
            ids.extend(piece);
            Ok(())
        };
        // Walk the conversation: the text up to each reply is context, the reply is learned.
        let mut rendered = String::new();
        for (i, message) in messages.iter().enumerate() {
            if message.role != "assistant" {
                continue;
            }
            let prompt = format.render(&messages[..i], true);
            let full = format.render(&messages[..=i], false);
            let (Some(context), Some(reply)) = (
                prompt.strip_prefix(rendered.as_str()),
                full.strip_prefix(prompt.as_str()),
            ) else {
                return Err(Error::Input(
                    "the chat template does not render conversations incrementally".into(),
                ));
            };
            push(context, false)?;
            push(reply, true)?;
            rendered = full;
        }
        Ok(Sample { ids, labels })
    }
}
