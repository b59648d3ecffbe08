//! The data side of a run: the tokenizer, the training stream, the held-out batches and the
//! sample prompts, read from the files a [`TrainConfig`] names.

use std::path::Path;

use serde::Serialize;

use super::config::TrainConfig;
use super::samples::SamplePrompts;
use crate::chat::{ChatFormat, ChatTemplate};
use crate::data::MicroBatch;
use crate::data::loader::ordered_batches;
use crate::data::text::text_samples;
use crate::data::{DataContent, DataFormat, DataLoader, DataSummary, Sample, hold_out, read_data};
use crate::error::{Error, Result};
use crate::tokenizer::{TextTokenizer, tokenizer_for_model, tokenizer_from_file};

/// What the training and held-out data turned into.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DataReport {
    /// The training file's record format (None: plain text).
    pub format: Option<DataFormat>,
    /// The training set as the loader sees it.
    pub train: DataSummary,
    /// Held-out samples (0: no evaluation).
    pub held_out_samples: usize,
    /// Held-out micro-batches per evaluation.
    pub held_out_batches: usize,
}

/// The data side of a run: the training stream, the held-out batches, the sample prompts.
pub(super) struct TrainingData {
    pub(super) tokenizer: std::sync::Arc<TextTokenizer>,
    pub(super) loader: DataLoader,
    pub(super) eval_batches: Vec<MicroBatch>,
    pub(super) sample_prompts: Option<SamplePrompts>,
    pub(super) report: DataReport,
    /// The largest token id of the training and held-out samples (None: no tokens).
    pub(super) largest_id: Option<u32>,
}

impl TrainingData {
    /// Tokenizes the data file (and the held-out file, or splits a held-out fraction off),
    /// and the sample prompts.
    pub(super) fn read(config: &TrainConfig) -> Result<Self> {
        let tokenizer = match &config.tokenizer {
            Some(file) => tokenizer_from_file(file)?,
            None => tokenizer_for_model(&config.model, None)?,
        };
        let (format, samples) = load_samples(&config.data, config.data_format, config, &tokenizer)?;
        let (samples, held_out) = match &config.eval_data {
            Some(path) => (
                samples,
                load_samples(path, DataFormat::Auto, config, &tokenizer)?.1,
            ),
            None if config.val_fraction > 0.0 => {
                hold_out(samples, config.val_fraction, config.seed)?
            }
            None => (samples, Vec::new()),
        };
        let held_out_samples = held_out.len();
        let largest_id = samples
            .iter()
            .chain(&held_out)
            .filter_map(|sample| sample.ids.iter().max().copied())
            .max();
        let eval_batches =
            ordered_batches(held_out, config.seq_len, config.micro_batch, config.pack);
        if config.has_eval() && eval_batches.is_empty() {
            return Err(Error::config(
                "--eval-data",
                "no held-out sample has a token to learn within the sequence length".to_string(),
            ));
        }
        let loader = DataLoader::new(
            samples,
            config.seq_len,
            config.micro_batch,
            config.pack,
            config.seed,
        )?;
        let tokenizer = std::sync::Arc::new(tokenizer);
        let sample_prompts = if config.sample_prompts.is_empty() {
            None
        } else {
            // Through the chat template when there is one; raw text otherwise.
            let format = chat_format(config, &tokenizer, &config.data).ok();
            Some(SamplePrompts::new(
                &config.sample_prompts,
                format.as_ref(),
                tokenizer.clone(),
                config.sample_tokens,
            )?)
        };
        let report = DataReport {
            format,
            train: loader.summary(),
            held_out_samples,
            held_out_batches: eval_batches.len(),
        };
        Ok(TrainingData {
            tokenizer,
            loader,
            eval_batches,
            sample_prompts,
            report,
            largest_id,
        })
    }
}

/// Reads and tokenizes a data file: its record format (None: plain text) and its samples.
pub fn load_samples(
    path: &Path,
    format: DataFormat,
    config: &TrainConfig,
    tokenizer: &TextTokenizer,
) -> Result<(Option<DataFormat>, Vec<Sample>)> {
    let (format, examples) = match read_data(path, format)? {
        DataContent::PlainText(text) => {
            return Ok((None, text_samples(&text, tokenizer, config.seq_len)?));
        }
        DataContent::Records { format, examples } => (format, examples),
    };
    let chat = if examples.iter().any(|c| c.needs_chat_format()) {
        Some(chat_format(config, tokenizer, path)?)
    } else {
        None
    };
    let samples = examples
        .iter()
        .map(|c| c.render(chat.as_ref(), tokenizer, config.train_on_inputs))
        .collect::<Result<Vec<_>>>()?;
    Ok((Some(format), samples))
}

fn chat_format(config: &TrainConfig, tokenizer: &TextTokenizer, data: &Path) -> Result<ChatFormat> {
    match config.chat_format {
        Some(builtin) => Ok(builtin.format()),
        None => ChatFormat::from_template(ChatTemplate::of(tokenizer)).map_err(|e| {
            Error::Input(format!(
                "{}: chat examples need a chat template: {e} (or pass --chat-format)",
                data.display()
            ))
        }),
    }
}
