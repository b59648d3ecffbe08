//! Tokenizers: Hugging Face `tokenizer.json` files, and the tokenizers a GGUF file's metadata
//! describes (`gguf.rs`: byte-level BPE with llama.cpp's pre-tokenizers, `pre_tokenizer.rs`;
//! SentencePiece, `sentencepiece.rs`), all as a `tokenizers::Tokenizer`.

mod gguf;
mod gguf_metadata;
mod pre_tokenizer;
mod sentencepiece;

pub use pre_tokenizer::KNOWN_PRE_TOKENIZERS;

use std::path::Path;

use tokenizers::Tokenizer;

use crate::error::{Error, Result};
use crate::io::gguf::GgufFile;

/// A text's token ids, token strings and character spans (start, end), one of each per token.
pub type DetailedEncoding = (Vec<u32>, Vec<String>, Vec<(usize, usize)>);

/// A text tokenizer with the model's special tokens.
pub struct TextTokenizer {
    inner: Tokenizer,
    /// Ids that end generation.
    pub eos_ids: Vec<u32>,
    /// The beginning-of-sequence id, when the checkpoint names one.
    pub bos_id: Option<u32>,
    /// The chat template from the checkpoint, if any (Jinja source).
    pub chat_template: Option<String>,
    /// The `tokenizer.ggml.*` metadata it was built from, when it came from a GGUF (written
    /// back unchanged when the model is exported to GGUF).
    gguf_source: Option<Vec<(String, crate::io::gguf::GgufValue)>>,
}

/// Parses a `tokenizer.json`. The `tokenizers` crate panics on some malformed sections (a
/// `decoder` of the wrong shape, found by `tests/integration/hostile_input.rs`): the panic is
/// caught, kept off the terminal, and returned as an error like any other parse failure.
fn parse_tokenizer_json(bytes: &[u8], path: &Path) -> Result<Tokenizer> {
    let unusable =
        |why: String| Error::checkpoint(path, format!("not a usable tokenizer.json: {why}"));
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let parsed = std::panic::catch_unwind(|| Tokenizer::from_bytes(bytes));
    std::panic::set_hook(previous);
    match parsed {
        Ok(Ok(tokenizer)) => Ok(tokenizer),
        Ok(Err(e)) => Err(unusable(e.to_string())),
        Err(_) => Err(unusable(
            "a section has the wrong shape (the tokenizers crate gave up)".into(),
        )),
    }
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("eos_ids", &self.eos_ids)
            .field("chat_template", &self.chat_template.is_some())
            .finish()
    }
}

impl TextTokenizer {
    /// Loads a Hugging Face `tokenizer.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let inner = parse_tokenizer_json(&bytes, path)?;
        // A `tokenizer_config.json` beside it may hold the chat template and EOS token.
        let config: Option<serde_json::Value> = path
            .parent()
            .map(|d| d.join("tokenizer_config.json"))
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|t| serde_json::from_str(&t).ok());
        let chat_template = config
            .as_ref()
            .and_then(|c| c.get("chat_template"))
            .and_then(|t| t.as_str())
            .map(str::to_string);
        // A special token is a string or `{"content": ...}`.
        let special = |key: &str| {
            config
                .as_ref()
                .and_then(|c| c.get(key))
                .and_then(|t| {
                    t.as_str()
                        .or_else(|| t.get("content").and_then(|c| c.as_str()))
                })
                .and_then(|t| inner.token_to_id(t))
        };
        let eos_ids = special("eos_token").into_iter().collect();
        let bos_id = special("bos_token");
        Ok(TextTokenizer {
            inner,
            eos_ids,
            bos_id,
            chat_template,
            gguf_source: None,
        })
    }

    /// The text of a token id (a special token's own spelling), if the vocabulary has it.
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The files that carry this tokenizer in a Hugging Face model folder: `tokenizer.json`
    /// and a `tokenizer_config.json` with the EOS token and the chat template (when known), so
    /// a folder napkin writes (a merged model) generates with the tokenizer it was trained with.
    pub fn hf_files(&self) -> Result<Vec<(String, Vec<u8>)>> {
        let json = self
            .inner
            .to_string(true)
            .map_err(|e| Error::Internal(format!("serializing the tokenizer: {e}")))?;
        let eos = self.eos_ids.first().and_then(|&id| self.token_text(id));
        let bos = self.bos_id.and_then(|id| self.token_text(id));
        let config = serde_json::json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": bos,
            "eos_token": eos,
            "chat_template": self.chat_template,
        });
        Ok(vec![
            ("tokenizer.json".into(), json.into_bytes()),
            (
                "tokenizer_config.json".into(),
                serde_json::to_vec_pretty(&config).unwrap_or_default(),
            ),
        ])
    }

    /// Token ids of `text` (special tokens in the text are matched whole).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.inner
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| Error::Input(format!("tokenizing: {e}")))
    }

    /// Ids, tokens and character offsets of `text` (as Python's `tokenizers` reports them;
    /// the Rust crate counts bytes, converted here).
    pub fn encode_detailed(&self, text: &str) -> Result<DetailedEncoding> {
        let e = self
            .inner
            .encode(text, false)
            .map_err(|e| Error::Input(format!("tokenizing: {e}")))?;
        // Byte index → character index (one entry per byte position, plus the end).
        let mut char_at = vec![0usize; text.len() + 1];
        let mut chars = 0;
        for (byte, ch) in text.char_indices() {
            for slot in &mut char_at[byte..byte + ch.len_utf8()] {
                *slot = chars;
            }
            chars += 1;
        }
        char_at[text.len()] = chars;
        let offsets = e
            .get_offsets()
            .iter()
            .map(|&(a, b)| (char_at[a.min(text.len())], char_at[b.min(text.len())]))
            .collect();
        Ok((e.get_ids().to_vec(), e.get_tokens().to_vec(), offsets))
    }

    /// Text of `ids` (special tokens included).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, false)
            .map_err(|e| Error::Input(format!("decoding: {e}")))
    }

    /// The id of a token string.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}

/// The tokenizer a file holds: a `tokenizer.json`, or the vocabulary a `.gguf` describes (a
/// model's, or a vocabulary-only GGUF such as llama.cpp's `ggml-vocab-*.gguf`).
pub fn tokenizer_from_file(path: &Path) -> Result<TextTokenizer> {
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        return TextTokenizer::from_gguf(&GgufFile::open(path)?);
    }
    TextTokenizer::from_file(path)
}

/// The tokenizer that goes with a model path: a GGUF's own metadata, or `tokenizer.json` in a
/// model folder; `explicit` (a `tokenizer.json` or a `.gguf`) wins when given.
pub fn tokenizer_for_model(model: &Path, explicit: Option<&Path>) -> Result<TextTokenizer> {
    if let Some(path) = explicit {
        return tokenizer_from_file(path);
    }
    let model = &crate::io::resolve_model_path(model)?;
    if model
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        return TextTokenizer::from_gguf(&GgufFile::open(model)?);
    }
    let file = model.join("tokenizer.json");
    if file.is_file() {
        return TextTokenizer::from_file(&file);
    }
    Err(Error::Input(format!(
        "no tokenizer for {}: expected a tokenizer.json in the folder (or pass --tokenizer FILE, or use --ids)",
        model.display()
    )))
}
