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
        // Walk the conversation: the text up to each reply is context, the reply is learned.
        let mut rendered = String::new();
        for (i, message) in messages.iter().enumerate() {
            if message.role != "assistant" {
                continue;
            }
            let prompt = format.render(&messages[..i], true)?;
            let full = format.render(&messages[..=i], false)?;
            let (Some(context), Some(reply)) = (
                prompt.strip_prefix(rendered.as_str()),
                full.strip_prefix(prompt.as_str()),
            ) else {
                return Err(Error::Input(
                    "the chat template does not render conversations incrementally".into(),
                ));
            };
            push(context, train_on_inputs)?;
            push(reply, true)?;
            rendered = full;
        }
        Ok(Sample { ids, labels })
    }
}
