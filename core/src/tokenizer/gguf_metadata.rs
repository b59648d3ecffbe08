//! A tokenizer as GGUF metadata (`tokenizer.ggml.*`, `tokenizer.chat_template`), for writing a
//! model to GGUF. A tokenizer read from a GGUF writes back the metadata it came from; one read
//! from a `tokenizer.json` is described from its model: byte-level BPE (`gpt2`: tokens, merges
//! and the pre-tokenizer's llama.cpp name, found by comparing splits) or SentencePiece-style
//! BPE with byte fallback (`llama`: tokens and scores that reproduce the merge order).

use std::collections::HashMap;

use serde_json::Value;

use super::TextTokenizer;
use super::pre_tokenizer::identify;
use crate::error::{Error, Result};
use crate::io::gguf::writer::MetaValue;

/// llama.cpp's token types.
const NORMAL: i32 = 1;
const UNKNOWN: i32 = 2;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const BYTE: i32 = 6;

impl TextTokenizer {
    /// The GGUF metadata that rebuilds this tokenizer (and its chat template).
    pub fn gguf_metadata(&self) -> Result<Vec<(String, MetaValue)>> {
        let mut out = match &self.gguf_source {
            Some(source) => source
                .iter()
                .filter_map(|(k, v)| MetaValue::from_read(v).map(|v| (k.clone(), v)))
                .collect(),
            None => self.described_from_json()?,
        };
        if let Some(template) = &self.chat_template {
            out.push((
                "tokenizer.chat_template".into(),
                MetaValue::Str(template.clone()),
            ));
        }
        Ok(out)
    }

    /// The metadata of a tokenizer read from a `tokenizer.json`.
    fn described_from_json(&self) -> Result<Vec<(String, MetaValue)>> {
        let refuse = |why: &str| Error::Input(format!("writing the tokenizer to GGUF: {why}"));
        let json: Value = serde_json::from_str(
            &self
                .inner
                .to_string(false)
                .map_err(|e| refuse(&e.to_string()))?,
        )
        .map_err(|e| refuse(&e.to_string()))?;
        let model = &json["model"];
        if model["type"].as_str() != Some("BPE") {
            return Err(refuse(
                "only BPE tokenizers can be described in GGUF metadata",
            ));
        }
        // Tokens by id: the model's vocabulary, then the added tokens.
        let mut by_id: Vec<Option<String>> = Vec::new();
        let mut put = |id: usize, token: &str| {
            if by_id.len() <= id {
                by_id.resize(id + 1, None);
            }
            by_id[id] = Some(token.to_string());
        };
        for (token, id) in model["vocab"].as_object().into_iter().flatten() {
            put(id.as_u64().unwrap_or(0) as usize, token);
        }
        let mut added: HashMap<usize, bool> = HashMap::new();
        for t in json["added_tokens"].as_array().into_iter().flatten() {
            let (Some(id), Some(content)) = (t["id"].as_u64(), t["content"].as_str()) else {
                continue;
            };
            put(id as usize, content);
            added.insert(id as usize, t["special"].as_bool().unwrap_or(false));
        }
        let tokens: Vec<String> = by_id
            .into_iter()
            .enumerate()
            .map(|(id, t)| t.unwrap_or_else(|| format!("[PAD{id}]")))
            .collect();
        let merges: Vec<(String, String)> = model["merges"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| match m {
                Value::String(s) => s.split_once(' ').map(|(a, b)| (a.into(), b.into())),
                Value::Array(pair) => Some((pair[0].as_str()?.into(), pair[1].as_str()?.into())),
                _ => None,
            })
            .collect();
        let unk = model["unk_token"].as_str();
        let byte_fallback = model["byte_fallback"].as_bool().unwrap_or(false);
        let kind = |id: usize, token: &str| match added.get(&id) {
            Some(true) => CONTROL,
            Some(false) => USER_DEFINED,
            None if Some(token) == unk => UNKNOWN,
            None if byte_fallback && is_byte_piece(token) => BYTE,
            None => NORMAL,
        };
        let types: Vec<i32> = tokens
            .iter()
            .enumerate()
            .map(|(id, t)| kind(id, t))
            .collect();
        let mut out = Vec::new();
        if byte_fallback {
            // SentencePiece-style: a piece's score is minus the rank of the first merge that
            // makes it, so sorting by score gives back the merge order; other pieces rank below.
            let mut rank: HashMap<String, usize> = HashMap::new();
            for (r, (a, b)) in merges.iter().enumerate() {
                rank.entry(format!("{a}{b}")).or_insert(r);
            }
            let n = merges.len();
            let scores: Vec<f32> = tokens
                .iter()
                .enumerate()
                .map(|(id, t)| -(rank.get(t).copied().unwrap_or(n + id) as f32))
                .collect();
            let text = json.to_string();
            let add_space_prefix =
                text.contains("\"Prepend\"") || text.contains("\"prepend_scheme\":\"first\"");
            out.push((
                "tokenizer.ggml.model".into(),
                MetaValue::Str("llama".into()),
            ));
            out.push((
                "tokenizer.ggml.pre".into(),
                MetaValue::Str("default".into()),
            ));
            out.push((
                "tokenizer.ggml.tokens".into(),
                MetaValue::StrArray(tokens.clone()),
            ));
            out.push(("tokenizer.ggml.scores".into(), MetaValue::F32Array(scores)));
            out.push((
                "tokenizer.ggml.token_type".into(),
                MetaValue::I32Array(types),
            ));
            out.push((
                "tokenizer.ggml.add_space_prefix".into(),
                MetaValue::Bool(add_space_prefix),
            ));
        } else {
            let pre = self
                .inner
                .get_pre_tokenizer()
                .and_then(identify)
                .ok_or_else(|| {
                    refuse("its pre-tokenizer splits text like none of the rules llama.cpp names")
                })?;
            let merges = merges.iter().map(|(a, b)| format!("{a} {b}")).collect();
            out.push(("tokenizer.ggml.model".into(), MetaValue::Str("gpt2".into())));
            out.push(("tokenizer.ggml.pre".into(), MetaValue::Str(pre.into())));
            out.push((
                "tokenizer.ggml.tokens".into(),
                MetaValue::StrArray(tokens.clone()),
            ));
            out.push((
                "tokenizer.ggml.token_type".into(),
                MetaValue::I32Array(types),
            ));
            out.push(("tokenizer.ggml.merges".into(), MetaValue::StrArray(merges)));
        }
        if let Some(id) = self.bos_id {
            out.push(("tokenizer.ggml.bos_token_id".into(), MetaValue::U32(id)));
        }
        if let Some(&id) = self.eos_ids.first() {
            out.push(("tokenizer.ggml.eos_token_id".into(), MetaValue::U32(id)));
        }
        if let Some(id) = unk.and_then(|u| tokens.iter().position(|t| t == u)) {
            out.push((
                "tokenizer.ggml.unknown_token_id".into(),
                MetaValue::U32(id as u32),
            ));
        }
        Ok(out)
    }
}

/// `<0x0A>`: SentencePiece's spelling of a raw byte.
fn is_byte_piece(token: &str) -> bool {
    token.len() == 6
        && token.starts_with("<0x")
        && token.ends_with('>')
        && u8::from_str_radix(&token[3..5], 16).is_ok()
}
