//! The data side of a run: the tokenizer, the training stream, the held-out batches and the
//! sample prompts, read from the files a [`TrainConfig`] names.

use std::path::Path;

use serde::Serialize;

use super::config::TrainConfig;
use super::samples::SamplePrompts;
use crate::chat::{ChatFormat, ChatTemplate};
use crate::data::loader::{LoaderState, ordered_batches};
use crate::data::text::text_samples;
use crate::data::{DataContent, DataFormat, DataLoader, DataSummary, Sample, hold_out, read_data};
use crate::data::{
    MicroBatch, PairBatch, PairLoader, PairTokens, ordered_pair_batches, read_pairs,
};
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

/// The training stream: token micro-batches, or preference pairs.
#[derive(Debug, Clone)]
pub enum Stream {
    /// Supervised samples, packed or padded.
    Tokens(DataLoader),
    /// Preference pairs, one row each.
    Pairs(PairLoader),
}

impl Stream {
    /// Where the stream is.
    pub fn state(&self) -> LoaderState {
        match self {
            Stream::Tokens(l) => l.state(),
            Stream::Pairs(l) => l.state(),
        }
    }

    /// Continues from a saved position.
    pub fn resume(&mut self, state: LoaderState) {
        match self {
            Stream::Tokens(l) => l.resume(state),
            Stream::Pairs(l) => l.resume(state),
        }
    }

    /// Micro-batches per epoch.
    pub fn batches_per_epoch(&self) -> usize {
        match self {
            Stream::Tokens(l) => l.batches_per_epoch(),
            Stream::Pairs(l) => l.batches_per_epoch(),
        }
    }

    /// The data set as trained on.
    pub fn summary(&self) -> DataSummary {
        match self {
            Stream::Tokens(l) => l.summary(),
            Stream::Pairs(l) => l.summary(),
        }
    }
}

/// The held-out micro-batches, of the stream's kind.
#[derive(Debug, Clone)]
pub(super) enum HeldOut {
    Tokens(Vec<MicroBatch>),
    Pairs(Vec<PairBatch>),
}

impl HeldOut {
    pub(super) fn len(&self) -> usize {
        match self {
            HeldOut::Tokens(b) => b.len(),
            HeldOut::Pairs(b) => b.len(),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The data side of a run: the training stream, the held-out batches, the sample prompts.
pub(super) struct TrainingData {
    pub(super) tokenizer: std::sync::Arc<TextTokenizer>,
    pub(super) loader: Stream,
    pub(super) eval_batches: HeldOut,
    pub(super) sample_prompts: Option<SamplePrompts>,
    pub(super) report: DataReport,
    /// The largest token id of the training and held-out samples (None: no tokens).
    pub(super) largest_id: Option<u32>,
}

/// The training stream and the held-out batches of one data file (and its held-out file or
/// fraction).
struct Streams {
    format: Option<DataFormat>,
    loader: Stream,
    eval_batches: HeldOut,
    held_out_samples: usize,
    largest_id: Option<u32>,
}

impl Streams {
    /// Supervised samples.
    fn of_samples(config: &TrainConfig, tokenizer: &TextTokenizer) -> Result<Self> {
        let (format, samples) = load_samples(&config.data, config.data_format, config, tokenizer)?;
        let (samples, held_out) = match &config.eval_data {
            Some(path) => (
                samples,
                load_samples(path, DataFormat::Auto, config, tokenizer)?.1,
            ),
            None if config.val_fraction > 0.0 => {
                hold_out(samples, config.val_fraction, config.seed)?
            }
            None => (samples, Vec::new()),
        };
        let largest_id = samples
            .iter()
            .chain(&held_out)
            .filter_map(|sample| sample.ids.iter().max().copied())
            .max();
        let held_out_samples = held_out.len();
        let eval = ordered_batches(held_out, config.seq_len, config.micro_batch, config.pack);
        let loader = DataLoader::new(
            samples,
            config.seq_len,
            config.micro_batch,
            config.pack,
            config.seed,
        )?;
        Ok(Streams {
            format,
            loader: Stream::Tokens(loader),
            eval_batches: HeldOut::Tokens(eval),
            held_out_samples,
            largest_id,
        })
    }

    /// Preference pairs.
    fn of_pairs(config: &TrainConfig, tokenizer: &TextTokenizer) -> Result<Self> {
        let pairs = load_pairs(&config.data, config, tokenizer)?;
        let (pairs, held_out) = match &config.eval_data {
            Some(path) => (pairs, load_pairs(path, config, tokenizer)?),
            None if config.val_fraction > 0.0 => hold_out(pairs, config.val_fraction, config.seed)?,
            None => (pairs, Vec::new()),
        };
        let largest_id = pairs
            .iter()
            .chain(&held_out)
            .flat_map(|p| p.prompt.iter().chain(&p.chosen).chain(&p.rejected))
            .max()
            .copied();
        let held_out_samples = held_out.len();
        let eval = ordered_pair_batches(held_out, config.seq_len, config.micro_batch);
        let loader = PairLoader::new(pairs, config.seq_len, config.micro_batch, config.seed)?;
        Ok(Streams {
            format: None,
            loader: Stream::Pairs(loader),
            eval_batches: HeldOut::Pairs(eval),
            held_out_samples,
            largest_id,
        })
    }
}

impl TrainingData {
    /// Tokenizes the data file (and the held-out file, or splits a held-out fraction off),
    /// and the sample prompts.
    pub(super) fn read(config: &TrainConfig) -> Result<Self> {
        let tokenizer = match &config.tokenizer {
            Some(file) => tokenizer_from_file(file)?,
            None => tokenizer_for_model(&config.model, None)?,
        };
        let Streams {
            format,
            loader,
            eval_batches,
            held_out_samples,
            largest_id,
        } = if config.objective.is_preference() {
            Streams::of_pairs(config, &tokenizer)?
        } else {
            Streams::of_samples(config, &tokenizer)?
        };
        if config.has_eval() && eval_batches.is_empty() {
            return Err(Error::config(
                "--eval-data",
                "no held-out sample has a token to learn within the sequence length".to_string(),
            ));
        }
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

/// Reads and tokenizes a file of preference pairs (through the chat template when its
/// records are messages).
pub fn load_pairs(
    path: &Path,
    config: &TrainConfig,
    tokenizer: &TextTokenizer,
) -> Result<Vec<PairTokens>> {
    let pairs = read_pairs(path)?;
    let chat = if pairs.iter().any(|p| p.needs_chat_format()) {
        Some(chat_format(config, tokenizer, path)?)
    } else {
        None
    };
    pairs
        .iter()
        .map(|p| p.tokenize(chat.as_ref(), tokenizer))
        .collect()
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
