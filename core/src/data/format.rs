//! The record shapes a training file may hold, and how each becomes a [`Conversation`]:
//!
//! | format              | one record                                                        |
//! |---------------------|-------------------------------------------------------------------|
//! | `alpaca`            | `{"instruction", "input"?, "output", "system"?}`                  |
//! | `sharegpt`          | `{"conversations": [{"from": "human" \| "gpt" \| "system", "value"}], "system"?}` |
//! | `messages`          | `{"messages": [{"role": "system" \| "user" \| "assistant", "content"}]}` |
//! | `prompt-completion` | `{"prompt", "completion"}` (raw text, no chat template)           |
//! | `text`              | `{"text"}` (every token learned)                                  |
//!
//! A file holds one format: it is detected from the first record (or given), and a later
//! record of another shape is an error naming its line — a mixed file is more often a mistake
//! than a wish.

use serde_json::Value;

use super::instruct::Conversation;
use crate::chat::Message;
use crate::config::spellings;
use crate::error::{Error, Result};

/// The shape of a data file's records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DataFormat {
    /// Detected from the first record.
    #[default]
    Auto,
    /// `instruction`, optional `input`, `output`.
    Alpaca,
    /// `conversations` of `from` / `value` turns.
    Sharegpt,
    /// `messages` of `role` / `content` turns.
    Messages,
    /// `prompt` (context) and `completion` (learned), concatenated as raw text.
    PromptCompletion,
    /// `text`, all learned.
    Text,
}

spellings! {
    DataFormat, "format", "data_format", serde;
    Auto => "auto" []: "the first record's",
    Alpaca => "alpaca" []: "instruction, optional input, output",
    Sharegpt => "sharegpt" []: "conversations of from / value turns",
    Messages => "messages" []: "messages of role / content turns",
    PromptCompletion => "prompt-completion" ["prompt_completion"]: "prompt and completion, raw text, no template",
    Text => "text" []: "text, every token learned",
}

impl DataFormat {
    /// The format a record looks like, by its keys (None: none of them).
    pub fn of(record: &Value) -> Option<DataFormat> {
        let has = |key: &str| record.get(key).is_some();
        if has("messages") {
            Some(DataFormat::Messages)
        } else if has("conversations") {
            Some(DataFormat::Sharegpt)
        } else if has("instruction") {
            Some(DataFormat::Alpaca)
        } else if has("prompt") && has("completion") {
            Some(DataFormat::PromptCompletion)
        } else if has("text") {
            Some(DataFormat::Text)
        } else {
            None
        }
    }

    /// The conversation of one record of this format (`self` is not `Auto`).
    pub fn parse(self, record: &Value) -> RecordResult<Conversation> {
        if !record.is_object() {
            return Err(
                format!("a record must be a JSON object, found {}", kind_of(record)).into(),
            );
        }
        match self {
            DataFormat::Auto => Err(expected_keys().into()),
            DataFormat::Alpaca => alpaca(record),
            DataFormat::Sharegpt => sharegpt(record),
            DataFormat::Messages => messages(record),
            DataFormat::PromptCompletion => Ok(Conversation::Completion {
                prompt: string(record, "prompt")?
                    .ok_or("a prompt-completion record needs `prompt`")?,
                completion: string(record, "completion")?
                    .ok_or("a prompt-completion record needs `completion`")?,
            }),
            DataFormat::Text => Ok(Conversation::Text(
                string(record, "text")?.ok_or("a text record needs `text`")?,
            )),
        }
    }

    /// Parses the records of one file in order, each with its 1-based line (for errors).
    /// `Auto` takes the first record's format.
    pub fn parse_all(
        self,
        records: &[(usize, Value)],
        path: &std::path::Path,
    ) -> Result<(DataFormat, Vec<Conversation>)> {
        let at = |line: usize, message: String| Error::Data {
            path: path.to_path_buf(),
            line,
            message,
        };
        let Some((first_line, first)) = records.first() else {
            return Err(at(0, "no examples in the file".into()));
        };
        let (format, detected) = match self {
            DataFormat::Auto => (
                DataFormat::of(first).ok_or_else(|| at(*first_line, expected_keys()))?,
                true,
            ),
            given => (given, false),
        };
        let mut out = Vec::with_capacity(records.len());
        for (line, record) in records {
            let conversation = format.parse(record).map_err(|message| {
                match DataFormat::of(record).filter(|&f| f != format) {
                    Some(other) => at(
                        *line,
                        format!(
                            "this record is {} but the file is {} ({}); one file holds one format",
                            other.name(),
                            format.name(),
                            if detected {
                                format!("detected from line {first_line}; --data-format sets it")
                            } else {
                                "--data-format".to_string()
                            }
                        ),
                    ),
                    None => at(*line, message.to_string()),
                }
            })?;
            out.push(conversation);
        }
        Ok((format, out))
    }
}

/// Why one record is not a usable example of its format; [`DataFormat::parse_all`] adds the
/// file and line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RecordError(String);

impl From<String> for RecordError {
    fn from(message: String) -> Self {
        RecordError(message)
    }
}

impl From<&str> for RecordError {
    fn from(message: &str) -> Self {
        RecordError(message.to_string())
    }
}

type RecordResult<T> = std::result::Result<T, RecordError>;

fn expected_keys() -> String {
    "expected `messages`, `conversations`, `instruction` + `output`, `prompt` + `completion`, or `text`"
        .into()
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// A string field: absent or null is None; another type is an error.
fn string(record: &Value, name: &str) -> RecordResult<Option<String>> {
    match record.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(format!("`{name}` must be a string, found {}", kind_of(other)).into()),
    }
}

fn alpaca(record: &Value) -> RecordResult<Conversation> {
    let instruction =
        string(record, "instruction")?.ok_or("an alpaca record needs `instruction`")?;
    let output = string(record, "output")?.ok_or("an alpaca record needs `output`")?;
    let user = match string(record, "input")? {
        Some(input) if !input.trim().is_empty() => format!("{instruction}\n\n{input}"),
        _ => instruction,
    };
    let mut messages = Vec::new();
    if let Some(system) = string(record, "system")? {
        messages.push(Message::new("system", &system));
    }
    messages.push(Message::new("user", &user));
    messages.push(Message::new("assistant", &output));
    Ok(Conversation::Chat(messages))
}

/// Roles of tool use, which napkin's chat templates do not render.
const TOOL_ROLES: [&str; 5] = [
    "tool",
    "function",
    "ipython",
    "function_call",
    "observation",
];

fn tool_refusal(k: usize, role: &str) -> String {
    format!(
        "turn {k}: role `{role}` is tool use, which napkin does not train on yet (its chat templates render system, user and assistant turns); remove the tool turns or the record"
    )
}

fn messages(record: &Value) -> RecordResult<Conversation> {
    let list = record
        .get("messages")
        .and_then(Value::as_array)
        .ok_or("`messages` must be a list of {role, content}")?;
    let mut out = Vec::with_capacity(list.len());
    for (k, m) in list.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str);
        let content = m.get("content").and_then(Value::as_str);
        match (role, content) {
            (Some(role @ ("system" | "user" | "assistant")), Some(content)) => {
                out.push(Message::new(role, content))
            }
            (Some(role), _) if TOOL_ROLES.contains(&role) => {
                return Err(tool_refusal(k, role).into());
            }
            (Some(role), Some(_)) => {
                return Err(
                    format!("turn {k}: role `{role}` is not system, user or assistant").into(),
                );
            }
            _ => return Err(format!("turn {k} needs string `role` and `content`").into()),
        }
    }
    with_a_reply(out)
}

fn sharegpt(record: &Value) -> RecordResult<Conversation> {
    let list = record
        .get("conversations")
        .and_then(Value::as_array)
        .ok_or("`conversations` must be a list of {from, value}")?;
    let mut out = Vec::with_capacity(list.len() + 1);
    if let Some(system) = string(record, "system")? {
        out.push(Message::new("system", &system));
    }
    for (k, turn) in list.iter().enumerate() {
        let from = turn.get("from").and_then(Value::as_str);
        let value = turn.get("value").and_then(Value::as_str);
        let role = match from {
            Some("system") => "system",
            Some("human" | "user") => "user",
            Some("gpt" | "assistant" | "model" | "chatgpt" | "bing" | "bard") => "assistant",
            Some(from) if TOOL_ROLES.contains(&from) => return Err(tool_refusal(k, from).into()),
            Some(from) => {
                return Err(format!("turn {k}: `from: {from}` is not system, human or gpt").into());
            }
            None => return Err(format!("turn {k} needs string `from` and `value`").into()),
        };
        let value = value.ok_or_else(|| format!("turn {k} needs string `from` and `value`"))?;
        out.push(Message::new(role, value));
    }
    with_a_reply(out)
}

fn with_a_reply(messages: Vec<Message>) -> RecordResult<Conversation> {
    if !messages.iter().any(|m| m.role == "assistant") {
        return Err("the conversation has no assistant turn to learn".into());
    }
    Ok(Conversation::Chat(messages))
}
