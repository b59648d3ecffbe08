//! Plain text for causal language modelling: the whole text tokenized once and cut into
//! windows of the sequence length, every token a label.

use super::sample::Sample;
use crate::error::Result;
use crate::tokenizer::TextTokenizer;

/// Consecutive windows of `seq_len` tokens (the last one may be shorter; windows of fewer than
/// two tokens carry no loss and are dropped).
pub fn text_samples(text: &str, tokenizer: &TextTokenizer, seq_len: usize) -> Result<Vec<Sample>> {
    let ids = tokenizer.encode(text)?;
    Ok(ids
        .chunks(seq_len.max(2))
        .filter(|w| w.len() >= 2)
        .map(|w| Sample::causal(w.to_vec()))
        .collect())
}
