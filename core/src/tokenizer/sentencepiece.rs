//! SentencePiece BPE from a GGUF (`tokenizer.ggml.model = llama`: Llama 2, TinyLlama, Mistral,
//! Phi-3), built the way Hugging Face's converter builds `LlamaTokenizerFast` from a
//! `tokenizer.model`, so napkin's ids equal the fast tokenizer's.
//!
//! A SentencePiece BPE model stores pieces with scores, not merges: two pieces merge when their
//! concatenation is a piece, and the higher the merged piece's score, the earlier the merge.
//! Spaces become `▁` and one `▁` is put before the text (unless the GGUF says
//! `tokenizer.ggml.add_space_prefix = false`). A character with no piece is spelled in byte
//! pieces `<0xNN>` (byte fallback). Decoding reverses each step and drops the leading space.

use std::collections::HashMap;

use tokenizers::Tokenizer;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::prepend::Prepend;
use tokenizers::normalizers::replace::Replace;
use tokenizers::normalizers::{NormalizerWrapper, Sequence as NormalizerSequence};

/// SentencePiece's visible space.
const SPACE: char = '▁';

/// One vocabulary entry: its text and score (`tokenizer.ggml.tokens`, `tokenizer.ggml.scores`).
pub struct Piece {
    pub text: String,
    pub score: f32,
}

/// The merges a SentencePiece BPE vocabulary implies, in order: for each piece every split into
/// two pieces (ordered by the halves' ids), all sorted by the merged piece's score, highest
/// first; equal scores keep vocabulary order.
fn merges_from_scores(pieces: &[Piece]) -> Vec<(String, String)> {
    let ids: HashMap<&str, usize> = pieces
        .iter()
        .enumerate()
        .map(|(id, p)| (p.text.as_str(), id))
        .collect();
    let mut merges: Vec<(usize, usize, f32)> = Vec::new();
    for piece in pieces {
        let mut splits: Vec<(usize, usize, f32)> = piece
            .text
            .char_indices()
            .skip(1)
            .filter_map(|(at, _)| {
                let left = ids.get(&piece.text[..at])?;
                let right = ids.get(&piece.text[at..])?;
                Some((*left, *right, piece.score))
            })
            .collect();
        splits.sort_by_key(|&(l, r, _)| (l, r));
        merges.extend(splits);
    }
    // A stable sort: equal scores keep the order above.
    merges.sort_by(|a, b| b.2.total_cmp(&a.2));
    merges
        .into_iter()
        .map(|(l, r, _)| (pieces[l].text.clone(), pieces[r].text.clone()))
        .collect()
}

/// The tokenizer of a SentencePiece BPE vocabulary. `unk` names the unknown piece;
/// `add_space_prefix` puts `▁` before the text.
pub fn sentencepiece_tokenizer(
    pieces: &[Piece],
    unk: Option<&str>,
    add_space_prefix: bool,
) -> tokenizers::Result<Tokenizer> {
    let vocab: Vocab = pieces
        .iter()
        .enumerate()
        .map(|(id, p)| (p.text.clone(), id as u32))
        .collect();
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges_from_scores(pieces))
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(unk) = unk {
        builder = builder.unk_token(unk.to_string());
    }
    let bpe = builder.build()?;
    let mut tokenizer = Tokenizer::new(bpe);
    // A `▁` before the text even when it starts with a space (" a" is "▁▁a"), as the
    // SentencePiece library and Hugging Face's converted Llama tokenizers do.
    let mut normalizers: Vec<NormalizerWrapper> = Vec::new();
    if add_space_prefix {
        normalizers.push(Prepend::new(SPACE.to_string()).into());
    }
    normalizers.push(Replace::new(" ", SPACE.to_string())?.into());
    tokenizer.with_normalizer(Some(NormalizerSequence::new(normalizers)));
    let mut decoders: Vec<DecoderWrapper> = vec![
        Replace::new(SPACE.to_string(), " ")?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if add_space_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    tokenizer.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(tokenizer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(text: &str, score: f32) -> Piece {
        Piece {
            text: text.into(),
            score,
        }
    }

    #[test]
    fn merges_follow_the_merged_pieces_scores() {
        let pieces = [
            piece("a", 0.0),
            piece("b", 0.0),
            piece("c", 0.0),
            piece("bc", -2.0),
            piece("ab", -1.0),
            piece("abc", -3.0),
        ];
        let merges = merges_from_scores(&pieces);
        let pair = |l: &str, r: &str| (l.to_string(), r.to_string());
        // "ab" (score -1) before "bc" (-2) before the two ways to make "abc" (-3), ordered by
        // their halves' ids (a=0 < ab=4).
        assert_eq!(
            merges,
            vec![
                pair("a", "b"),
                pair("b", "c"),
                pair("a", "bc"),
                pair("ab", "c")
            ]
        );
    }
}
