//! The tokenizer a GGUF file's metadata describes: `tokenizer.ggml.model` picks the kind
//! (`gpt2`: byte-level BPE with the pre-tokenizer `tokenizer.ggml.pre` names; `llama`:
//! SentencePiece BPE), `tokenizer.ggml.tokens`/`token_type` give the vocabulary and which tokens
//! are matched whole, `merges` or `scores` how pieces join.

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::{AddedToken, Tokenizer};

use super::TextTokenizer;
use super::pre_tokenizer::{KNOWN_PRE_TOKENIZERS, byte_level_pre_tokenizer, ignores_merges};
use super::sentencepiece::{Piece, sentencepiece_tokenizer};
use crate::error::{Error, Result};
use crate::io::gguf::{GgufFile, GgufValue};

/// GGUF token types (llama.cpp's `llama_token_type`): unknown, control and user-defined
/// tokens are matched whole, before the model splits text.
const TOKEN_TYPE_UNKNOWN: u64 = 2;
const TOKEN_TYPE_CONTROL: u64 = 3;
const TOKEN_TYPE_USER_DEFINED: u64 = 4;

/// Spellings that end a chat turn in common templates; generation stops on them too when the
/// vocabulary has them (ChatML, Llama 3, Phi-3).
const END_OF_TURN: [&str; 3] = ["<|im_end|>", "<|eot_id|>", "<|end|>"];

impl TextTokenizer {
    /// Builds the tokenizer a GGUF file describes: byte-level BPE (`tokenizer.ggml.model =
    /// gpt2`) with the pre-tokenizer `tokenizer.ggml.pre` names (llama.cpp's table; a name not
    /// in it is refused, never guessed), or SentencePiece BPE (`llama`) from the pieces' scores.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self> {
        let err = |m: String| Error::checkpoint(&gguf.path, m);
        let model = gguf
            .require("tokenizer.ggml.model")?
            .as_str()
            .unwrap_or_default()
            .to_string();
        let tokens = string_array(gguf, "tokenizer.ggml.tokens")?;
        let types = gguf
            .metadata
            .get("tokenizer.ggml.token_type")
            .and_then(GgufValue::as_array);
        let kind_of = |id: usize| types.and_then(|t| t.get(id)).and_then(GgufValue::as_u64);
        let specials: Vec<AddedToken> = tokens
            .iter()
            .enumerate()
            .filter(|&(id, _)| {
                matches!(
                    kind_of(id),
                    Some(TOKEN_TYPE_UNKNOWN | TOKEN_TYPE_CONTROL | TOKEN_TYPE_USER_DEFINED)
                )
            })
            .map(|(_, token)| AddedToken::from(token.to_string(), true))
            .collect();
        let mut inner = match model.as_str() {
            "gpt2" => byte_level_bpe(gguf, &tokens)?,
            "llama" => {
                let scores = gguf
                    .require("tokenizer.ggml.scores")?
                    .as_array()
                    .ok_or_else(|| err("tokenizer.ggml.scores is not an array".into()))?;
                if scores.len() != tokens.len() {
                    return Err(err(format!(
                        "tokenizer.ggml.scores has {} entries for {} tokens",
                        scores.len(),
                        tokens.len()
                    )));
                }
                let pieces: Vec<Piece> = tokens
                    .iter()
                    .zip(scores)
                    .map(|(text, score)| Piece {
                        text: text.to_string(),
                        score: score.as_f64().unwrap_or(0.0) as f32,
                    })
                    .collect();
                let unk = (0..tokens.len())
                    .find(|&id| kind_of(id) == Some(TOKEN_TYPE_UNKNOWN))
                    .map(|id| tokens[id]);
                let add_space_prefix = match gguf.metadata.get("tokenizer.ggml.add_space_prefix") {
                    Some(GgufValue::Bool(b)) => *b,
                    _ => true,
                };
                sentencepiece_tokenizer(&pieces, unk, add_space_prefix)
                    .map_err(|e| err(format!("building the SentencePiece tokenizer: {e}")))?
            }
            other => {
                return Err(err(format!(
                    "tokenizer model `{other}` is not supported (gpt2: byte-level BPE; llama: \
                     SentencePiece); pass a tokenizer.json"
                )));
            }
        };
        inner.add_special_tokens(&specials);
        let token = |key: &str| {
            gguf.metadata
                .get(key)
                .and_then(GgufValue::as_u64)
                .map(|v| v as u32)
        };
        let mut eos_ids: Vec<u32> = token("tokenizer.ggml.eos_token_id").into_iter().collect();
        let end_of_turn = token("tokenizer.ggml.eot_token_id")
            .into_iter()
            .chain(END_OF_TURN.iter().filter_map(|t| inner.token_to_id(t)));
        for id in end_of_turn {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
        Ok(TextTokenizer {
            inner,
            eos_ids,
            bos_id: token("tokenizer.ggml.bos_token_id"),
            chat_template: gguf
                .metadata
                .get("tokenizer.chat_template")
                .and_then(GgufValue::as_str)
                .map(str::to_string),
            gguf_source: Some(
                gguf.metadata
                    .iter()
                    .filter(|(key, _)| key.starts_with("tokenizer.ggml."))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            ),
        })
    }
}

/// A metadata array of strings.
fn string_array<'a>(gguf: &'a GgufFile, key: &str) -> Result<Vec<&'a str>> {
    let err = |m: String| Error::checkpoint(&gguf.path, m);
    gguf.require(key)?
        .as_array()
        .ok_or_else(|| err(format!("{key} is not an array")))?
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_str()
                .ok_or_else(|| err(format!("{key}[{i}] is not a string")))
        })
        .collect()
}

/// GPT-2–style byte-level BPE: vocabulary, merges and the named pre-tokenizer.
fn byte_level_bpe(gguf: &GgufFile, tokens: &[&str]) -> Result<Tokenizer> {
    let err = |m: String| Error::checkpoint(&gguf.path, m);
    // llama.cpp reads a missing name as `default` (and warns that quality degrades).
    let pre = gguf
        .metadata
        .get("tokenizer.ggml.pre")
        .and_then(GgufValue::as_str)
        .unwrap_or("default");
    let pre_tokenizer = byte_level_pre_tokenizer(pre).ok_or_else(|| {
        err(format!(
            "tokenizer.ggml.pre `{pre}` is not a pre-tokenizer napkin knows (known: {}); pass \
             the model's tokenizer.json with --tokenizer",
            KNOWN_PRE_TOKENIZERS.join(", ")
        ))
    })?;
    let mut vocab = Vocab::default();
    for (id, token) in tokens.iter().enumerate() {
        vocab.insert(token.to_string(), id as u32);
    }
    let merges = string_array(gguf, "tokenizer.ggml.merges")?
        .into_iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| err(format!("merge `{m}` is not two tokens")))
        })
        .collect::<Result<Vec<_>>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(ignores_merges(pre))
        .build()
        .map_err(|e| err(format!("building BPE: {e}")))?;
    let mut inner = Tokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(pre_tokenizer));
    inner.with_decoder(Some(ByteLevelDecoder::default()));
    Ok(inner)
}
