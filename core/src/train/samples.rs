//! Sample generations during training: a few fixed prompts answered greedily at each
//! evaluation, so a run shows what the model learned, not only a number.

use std::sync::Arc;

use burn::module::Module;
use serde::Serialize;

use crate::chat::{ChatFormat, Message};
use crate::error::Result;
use crate::model::Llama;
use crate::model::generate::{NextToken, Sampling};
use crate::tokenizer::TextTokenizer;

/// One prompt and what the model answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SampleText {
    /// The prompt as the user wrote it.
    pub prompt: String,
    /// The greedy continuation, decoded (the stop token left out).
    pub completion: String,
}

/// The prompts, tokenized once, and what decoding needs.
pub struct SamplePrompts {
    prompts: Vec<(String, Vec<u32>)>,
    tokenizer: Arc<TextTokenizer>,
    max_new_tokens: usize,
}

impl std::fmt::Debug for SamplePrompts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SamplePrompts")
            .field("prompts", &self.prompts.len())
            .field("max_new_tokens", &self.max_new_tokens)
            .finish()
    }
}

impl SamplePrompts {
    /// Each prompt as a user turn through `format` (ready for the reply), or as raw text
    /// without one.
    pub fn new(
        prompts: &[String],
        format: Option<&ChatFormat>,
        tokenizer: Arc<TextTokenizer>,
        max_new_tokens: usize,
    ) -> Result<Self> {
        let prompts = prompts
            .iter()
            .map(|p| {
                let text = match format {
                    Some(f) => f.render(&[Message::new("user", p)], true)?,
                    None => p.clone(),
                };
                Ok((p.clone(), tokenizer.encode(&text)?))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(SamplePrompts {
            prompts,
            tokenizer,
            max_new_tokens,
        })
    }

    /// Greedy answers of `model` (outside autodiff), stopping at an end-of-sequence token.
    pub fn generate(&self, model: &Llama) -> Result<Vec<SampleText>> {
        let frozen = model.valid();
        let stop = &self.tokenizer.eos_ids;
        self.prompts
            .iter()
            .map(|(prompt, ids)| {
                let mut out = frozen.generate(
                    ids,
                    self.max_new_tokens,
                    &Sampling::default(),
                    stop,
                    |_| {},
                )?;
                out.retain(|id| !stop.contains(id));
                Ok(SampleText {
                    prompt: prompt.clone(),
                    completion: self.tokenizer.decode(&out)?,
                })
            })
            .collect()
    }
}
