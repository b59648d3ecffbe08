//! One training example and how it becomes tokens and labels.
//!
//! Conversations are rendered with the model's chat template and the loss is taken on the
//! assistant replies only (unless `train_on_inputs`): each piece of the rendered text is
//! tokenized on its own, and only the pieces that are replies (with the template's end-of-turn
//! marker) keep their labels. Raw prompt/completion pairs learn the completion; plain text
//! learns every token. Both end with the tokenizer's EOS, so the model learns to stop.

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
    /// Raw text: the prompt is context, the completion is learned.
    Completion {
        /// Context (learned only with `train_on_inputs`).
        prompt: String,
        /// The text to learn.
        completion: String,
    },
}

impl Conversation {
    /// Whether rendering it needs a chat template.
    pub fn needs_chat_format(&self) -> bool {
        matches!(self, Conversation::Chat(_))
    }

    /// Tokens and labels. Chat examples need `format`; only the replies are labels unless
    /// `train_on_inputs`.
    pub fn render(
        &self,
        format: Option<&ChatFormat>,
        tokenizer: &TextTokenizer,
        train_on_inputs: bool,
    ) -> Result<Sample> {
        let eos: Vec<u32> = tokenizer.eos_ids.first().copied().into_iter().collect();
        let messages = match self {
            Conversation::Text(text) => {
                let mut ids = tokenizer.encode(text)?;
                ids.extend(&eos);
                return Ok(Sample::causal(ids));
            }
            Conversation::Completion { prompt, completion } => {
                let prompt = tokenizer.encode(prompt)?;
                let mut completion = tokenizer.encode(completion)?;
                completion.extend(&eos);
                let labels = prompt
                    .iter()
                    .map(|&id| {
                        if train_on_inputs {
                            i64::from(id)
                        } else {
                            IGNORE_INDEX
                        }
                    })
                    .chain(completion.iter().map(|&id| i64::from(id)))
                    .collect();
                let ids = prompt.into_iter().chain(completion).collect();
                return Ok(Sample { ids, labels });
            }
            Conversation::Chat(messages) => messages,
        };
        let format = format.ok_or_else(|| {
            Error::Input("a chat example needs a chat format to be rendered".into())
        })?;
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
        // The whole conversation rendered once; each reply's span in it is found by rendering:
        // it starts where the prompt for it (the turns before, with the generation prompt)
        // stops agreeing with the whole (DeepSeek-R1's prompt opens a `<think>` the history
        // drops), and ends where the conversation up to and with it ends — less the text a
        // template closes every conversation with (Phi-3's EOS), found by rendering none.
        let full = format.render(messages, false)?;
        // Rendered only for a template that needs it (most render each prefix as a prefix).
        let mut closing_text: Option<String> = None;
        let mut cursor = 0;
        for (i, message) in messages.iter().enumerate() {
            if message.role != "assistant" {
                continue;
            }
            let prompt = format.render(&messages[..i], true)?;
            let upto = format.render(&messages[..=i], false)?;
            let start = common_prefix(&prompt, &full).max(cursor);
            let end = if full.starts_with(&upto) {
                upto.len()
            } else {
                let closing_text = closing_text
                    .get_or_insert_with(|| format.render(&[], false).unwrap_or_default());
                let closing = common_suffix(&upto, closing_text);
                let open = &upto[..upto.len() - closing];
                if closing > 0 && full.starts_with(open) {
                    open.len()
                } else {
                    common_prefix(&upto, &full)
                }
            };
            if end <= start {
                return Err(Error::Input(format!(
                    "the chat template renders assistant turn {} nowhere in the conversation",
                    i + 1
                )));
            }
            push(&full[cursor..start], train_on_inputs)?;
            push(&full[start..end], true)?;
            cursor = end;
        }
        if cursor < full.len() && cursor > 0 {
            push(&full[cursor..], train_on_inputs)?;
        }
        Ok(Sample { ids, labels })
    }
}

/// The length in bytes of the longest common prefix of `a` and `b`, on a character boundary.
fn common_prefix(a: &str, b: &str) -> usize {
    let mut n = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    while !a.is_char_boundary(n) {
        n -= 1;
    }
    n
}

/// The length in bytes of the longest common suffix of `a` and `b`, on a character boundary.
fn common_suffix(a: &str, b: &str) -> usize {
    let mut n = a
        .bytes()
        .rev()
        .zip(b.bytes().rev())
        .take_while(|(x, y)| x == y)
        .count();
    while !a.is_char_boundary(a.len() - n) {
        n -= 1;
    }
    n
}
