//! Preference pairs in TRL's format, and how each becomes tokens.
//!
//! One record is `{"prompt", "chosen", "rejected"}`: three strings (raw text), or three lists of
//! `{"role", "content"}` messages (the prompt's turns, then each reply's), rendered with the
//! checkpoint's chat template. A file holds one of the two. As TRL's `DPOTrainer` does:
//! - the prompt alone and the prompt with each reply are tokenized, and a reply starts where
//!   both prompt-with-reply tokenizations stop agreeing with the prompt's (a token merging across
//!   the boundary moves it);
//! - a raw-text reply ends with the tokenizer's EOS (a chat template closes its own turns).

use std::path::Path;

use serde_json::Value;

use super::file::json_records;
use crate::chat::{ChatFormat, Message};
use crate::error::{Error, Result};
use crate::tokenizer::TextTokenizer;

/// One record: a prompt with a preferred and a dispreferred reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PreferencePair {
    /// Raw text, no template.
    Text {
        /// The context.
        prompt: String,
        /// The preferred continuation.
        chosen: String,
        /// The dispreferred continuation.
        rejected: String,
    },
    /// Conversations through the chat template.
    Chat {
        /// The turns before the replies.
        prompt: Vec<Message>,
        /// The preferred reply's turns.
        chosen: Vec<Message>,
        /// The dispreferred reply's turns.
        rejected: Vec<Message>,
    },
}

/// A pair's tokens: the shared prompt and each reply after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairTokens {
    /// The prompt's tokens.
    pub prompt: Vec<u32>,
    /// The preferred reply's tokens (after the prompt).
    pub chosen: Vec<u32>,
    /// The dispreferred reply's tokens (after the prompt).
    pub rejected: Vec<u32>,
}

impl PairTokens {
    /// The longer of the two sequences, prompt included.
    pub fn longest(&self) -> usize {
        self.prompt.len() + self.chosen.len().max(self.rejected.len())
    }
}

impl PreferencePair {
    /// Whether tokenizing it needs a chat template.
    pub fn needs_chat_format(&self) -> bool {
        matches!(self, PreferencePair::Chat { .. })
    }

    /// Its tokens; chat pairs need `format`.
    pub fn tokenize(
        &self,
        format: Option<&ChatFormat>,
        tokenizer: &TextTokenizer,
    ) -> Result<PairTokens> {
        let (prompt, with_chosen, with_rejected) = match self {
            PreferencePair::Text {
                prompt,
                chosen,
                rejected,
            } => {
                let eos = tokenizer.eos_ids.first().copied();
                let reply = |reply: &str| -> Result<Vec<u32>> {
                    let mut ids = tokenizer.encode(&format!("{prompt}{reply}"))?;
                    if let Some(eos) = eos.filter(|&e| ids.last() != Some(&e)) {
                        ids.push(eos);
                    }
                    Ok(ids)
                };
                (tokenizer.encode(prompt)?, reply(chosen)?, reply(rejected)?)
            }
            PreferencePair::Chat {
                prompt,
                chosen,
                rejected,
            } => {
                let format = format.ok_or_else(|| {
                    Error::Input("a chat preference pair needs a chat format".into())
                })?;
                let reply = |reply: &[Message]| -> Result<Vec<u32>> {
                    let turns: Vec<Message> = prompt.iter().chain(reply).cloned().collect();
                    tokenizer.encode(&format.render(&turns, false)?)
                };
                (
                    tokenizer.encode(&format.render(prompt, true)?)?,
                    reply(chosen)?,
                    reply(rejected)?,
                )
            }
        };
        let shared =
            common_prefix(&prompt, &with_chosen).min(common_prefix(&prompt, &with_rejected));
        Ok(PairTokens {
            prompt: prompt[..shared].to_vec(),
            chosen: with_chosen[shared..].to_vec(),
            rejected: with_rejected[shared..].to_vec(),
        })
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Reads a file of preference pairs (`.jsonl`, or `.json` as an array or JSON lines).
pub fn read_pairs(path: &Path) -> Result<Vec<PreferencePair>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    parse_pairs(&text, path)
}

/// Parses preference pairs; `path` names the file in errors, each with its line.
pub fn parse_pairs(text: &str, path: &Path) -> Result<Vec<PreferencePair>> {
    let records = json_records(text, path)?;
    let at = |line: usize, message: String| Error::Data {
        path: path.to_path_buf(),
        line,
        message,
    };
    if records.is_empty() {
        return Err(at(0, "no preference pairs in the file".into()));
    }
    let mut pairs: Vec<PreferencePair> = Vec::with_capacity(records.len());
    for (line, record) in &records {
        let pair = parse_pair(record).map_err(|message| at(*line, message))?;
        if let Some(first) = pairs.first()
            && first.needs_chat_format() != pair.needs_chat_format()
        {
            let kind = |p: &PreferencePair| {
                if p.needs_chat_format() {
                    "messages"
                } else {
                    "text"
                }
            };
            return Err(at(
                *line,
                format!(
                    "this pair is {} but the file's first is {}; one file holds one kind",
                    kind(&pair),
                    kind(first)
                ),
            ));
        }
        pairs.push(pair);
    }
    Ok(pairs)
}

/// One record, or what is wrong with it.
fn parse_pair(record: &Value) -> std::result::Result<PreferencePair, String> {
    let Some(object) = record.as_object() else {
        return Err(
            "a preference record must be a JSON object with `prompt`, `chosen` and `rejected`"
                .into(),
        );
    };
    let field = |key: &str| {
        object.get(key).ok_or_else(|| {
            format!("a preference record needs `{key}` (it has `prompt`, `chosen` and `rejected`)")
        })
    };
    let (prompt, chosen, rejected) = (field("prompt")?, field("chosen")?, field("rejected")?);
    match (prompt, chosen, rejected) {
        (Value::String(p), Value::String(c), Value::String(r)) => {
            for (key, reply) in [("chosen", c), ("rejected", r)] {
                if reply.trim().is_empty() {
                    return Err(format!("`{key}` is empty: a preference needs two replies"));
                }
            }
            Ok(PreferencePair::Text {
                prompt: p.clone(),
                chosen: c.clone(),
                rejected: r.clone(),
            })
        }
        (Value::Array(_), Value::Array(_), Value::Array(_)) => {
            let turns = |key: &str, value: &Value| -> std::result::Result<Vec<Message>, String> {
                let list = value.as_array().map(Vec::as_slice).unwrap_or_default();
                let mut out = Vec::with_capacity(list.len());
                for (i, turn) in list.iter().enumerate() {
                    let text = |name: &str| turn.get(name).and_then(Value::as_str);
                    match (text("role"), text("content")) {
                        (Some(role), Some(content)) => out.push(Message::new(role, content)),
                        _ => {
                            return Err(format!(
                                "`{key}` turn {}: expected {{\"role\", \"content\"}} strings",
                                i + 1
                            ));
                        }
                    }
                }
                Ok(out)
            };
            let prompt = turns("prompt", prompt)?;
            let (chosen, rejected) = (turns("chosen", chosen)?, turns("rejected", rejected)?);
            for (key, reply) in [("chosen", &chosen), ("rejected", &rejected)] {
                if reply.iter().all(|m| m.content.trim().is_empty()) {
                    return Err(format!("`{key}` is empty: a preference needs two replies"));
                }
            }
            Ok(PreferencePair::Chat {
                prompt,
                chosen,
                rejected,
            })
        }
        _ => Err(
            "`prompt`, `chosen` and `rejected` must be all strings (raw text) or all lists of messages"
                .into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_of(text: &str) -> String {
        match parse_pairs(text, Path::new("pairs.jsonl")) {
            Err(e) => e.to_string(),
            Ok(pairs) => panic!("parsed {pairs:?}"),
        }
    }

    #[test]
    fn a_bad_record_is_refused_with_its_file_and_line() {
        let good = r#"{"prompt": "p", "chosen": "a", "rejected": "b"}"#;
        let missing = format!("{good}\n\n{}", r#"{"prompt": "p", "chosen": "a"}"#);
        let e = error_of(&missing);
        assert!(
            e.contains("pairs.jsonl") && e.contains(":3") && e.contains("`rejected`"),
            "{e}"
        );
        let empty = format!(
            "{good}\n{}",
            r#"{"prompt": "p", "chosen": " ", "rejected": "b"}"#
        );
        let e = error_of(&empty);
        assert!(e.contains(":2") && e.contains("`chosen` is empty"), "{e}");
        let mixed = format!(
            "{good}\n{}",
            r#"{"prompt": [{"role": "user", "content": "p"}], "chosen": [{"role": "assistant", "content": "a"}], "rejected": [{"role": "assistant", "content": "b"}]}"#
        );
        let e = error_of(&mixed);
        assert!(
            e.contains(":2") && e.contains("one file holds one kind"),
            "{e}"
        );
        let e = error_of(r#"{"prompt": "p", "chosen": ["a"], "rejected": "b"}"#);
        assert!(e.contains(":1") && e.contains("all strings"), "{e}");
        let e = error_of(r#"{"prompt": [], "chosen": [{"role": "assistant"}], "rejected": []}"#);
        assert!(e.contains("`chosen` turn 1"), "{e}");
    }
}
