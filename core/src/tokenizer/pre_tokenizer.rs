//! The pre-tokenizers of byte-level BPE GGUFs, by the name in `tokenizer.ggml.pre`.
//!
//! A GGUF names its pre-tokenizer instead of storing it; llama.cpp keeps the table from names to
//! splitting rules (`src/llama-vocab.cpp`). Each rule is a list of regular expressions applied in
//! turn: every expression splits each piece further, keeping both the matches and the text
//! between them as pieces (Hugging Face's `Split` with `Isolated` behaviour). The pieces are then
//! byte-level encoded. The expressions below are the ones llama.cpp uses for the Llama-family
//! names (themselves taken from each model's `tokenizer.json`); each name with a test vocabulary
//! in llama.cpp is checked against it in `tests/integration/gguf_tokenizers.rs`.

use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer, SplitDelimiterBehavior,
};

/// GPT-2's word split: contractions, letters, digits, other symbols, whitespace runs.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// Llama 3's split (digits in groups of up to three; case-insensitive contractions).
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's split: Llama 3's with every digit on its own.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The letters DeepSeek-LLM keeps together (Latin, Greek, Cyrillic, Armenian, Georgian, …).
/// Written with escapes: several of these code points change under Unicode normalization
/// (U+212A KELVIN SIGN becomes K), which would turn a range around.
const DEEPSEEK_LLM_LETTERS: &str = "\\s?[A-Za-z\u{B5}\u{C0}-\u{D6}\u{D8}-\u{F6}\u{F8}-\u{1BA}\u{1BC}-\u{1BF}\u{1C4}-\u{293}\u{295}-\u{2AF}\u{370}-\u{373}\u{376}\u{377}\u{37B}-\u{37D}\u{37F}\u{386}\u{388}-\u{38A}\u{38C}\u{38E}-\u{3A1}\u{3A3}-\u{3F5}\u{3F7}-\u{481}\u{48A}-\u{52F}\u{531}-\u{556}\u{10A0}-\u{10C5}\u{13A0}-\u{13F5}\u{13F8}-\u{13FD}\u{1C90}-\u{1CBA}\u{1CBD}-\u{1CBF}\u{1D00}-\u{1D2B}\u{1D6B}-\u{1D77}\u{1D79}-\u{1D9A}\u{1E00}-\u{1F15}\u{1F18}-\u{1F1D}\u{1F20}-\u{1F45}\u{1F48}-\u{1F4D}\u{1F50}-\u{1F57}\u{1F59}\u{1F5B}\u{1F5D}\u{1F5F}-\u{1F7D}\u{1F80}-\u{1FB4}\u{1FB6}-\u{1FBC}\u{1FBE}\u{1FC2}-\u{1FC4}\u{1FC6}-\u{1FCC}\u{1FD0}-\u{1FD3}\u{1FD6}-\u{1FDB}\u{1FE0}-\u{1FEC}\u{1FF2}-\u{1FF4}\u{1FF6}-\u{1FFC}\u{2102}\u{2107}\u{210A}-\u{2113}\u{2115}\u{2119}-\u{211D}\u{2124}\u{2126}\u{2128}\u{212A}-\u{212D}\u{212F}-\u{2134}\u{2139}\u{213C}-\u{213F}\u{2145}-\u{2149}\u{214E}\u{2183}\u{2184}\u{2C00}-\u{2C7B}\u{2C7E}-\u{2CE4}\u{2CEB}-\u{2CEE}\u{2CF2}\u{2CF3}\u{A640}-\u{A66D}\u{A680}-\u{A69B}\u{A722}-\u{A76F}\u{A771}-\u{A787}\u{A78B}-\u{A78E}\u{AB70}-\u{ABBF}\u{FB00}-\u{FB06}\u{FB13}-\u{FB17}\u{FF21}-\u{FF3A}\u{FF41}-\u{FF5A}\u{10400}-\u{1044F}\u{104B0}-\u{104D3}\u{104D8}-\u{104FB}\u{10C80}-\u{10CB2}\u{10CC0}-\u{10CF2}\u{118A0}-\u{118DF}\u{1E900}-\u{1E943}]+";

/// CJK ideographs, the blocks from Samaritan up to them, and Hangul, kept together by DeepSeek.
const CJK: &str = "[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+";

/// The `tokenizer.ggml.pre` names napkin reads, and the expressions each applies in turn.
const TABLE: &[(&[&str], &[&str])] = &[
    (&["gpt-2", "mpt", "olmo"], &[GPT2]),
    (
        &[
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "dbrx",
            "smaug-bpe",
        ],
        &[LLAMA3],
    ),
    (&["qwen2", "stablelm2"], &[QWEN2]),
    (
        &["smollm", "starcoder", "refact", "command-r"],
        &[r"\p{N}", GPT2],
    ),
    (
        &["deepseek-llm"],
        &[
            r"[\r\n]",
            DEEPSEEK_LLM_LETTERS,
            "\\s?[!-/:-~\u{FF01}-\u{FF0F}\u{FF1A}-\u{FF5E}\u{2018}-\u{201F}\u{3000}-\u{3002}]+",
            r"\s+$",
            CJK,
            r"\p{N}+",
        ],
    ),
    (
        &["deepseek-coder"],
        &[r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", CJK, r"\p{N}"],
    ),
    (
        &["falcon"],
        &[
            r"[\p{P}\$\+<=>\^~\|`]+",
            r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
            r"[0-9][0-9][0-9]",
        ],
    ),
    // llama.cpp's rule for a GGUF that names none (it warns that quality degrades).
    (
        &["default"],
        &[
            r"[\p{P}\$\+<=>\^~\|]+",
            r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
            r"\p{N}+",
            r"[0-9][0-9][0-9]",
        ],
    ),
];

/// Every `tokenizer.ggml.pre` name napkin reads (for messages and docs).
pub const KNOWN_PRE_TOKENIZERS: &[&str] = &[
    "gpt-2",
    "mpt",
    "olmo",
    "llama-bpe",
    "llama3",
    "llama-v3",
    "falcon3",
    "dbrx",
    "smaug-bpe",
    "qwen2",
    "stablelm2",
    "smollm",
    "starcoder",
    "refact",
    "command-r",
    "deepseek-llm",
    "deepseek-coder",
    "falcon",
    "default",
];

/// Whether llama.cpp's BPE takes a piece that is already a whole vocabulary entry as one token
/// instead of merging it (Hugging Face's `ignore_merges`: the Llama 3 family).
pub fn ignores_merges(name: &str) -> bool {
    ["llama3", "llama-v3", "llama-bpe", "falcon3"].contains(&name)
}

/// The pre-tokenizer named `name`: the table's splits, then byte-level encoding. `None` for a
/// name napkin does not know (the caller refuses it rather than guess).
pub fn byte_level_pre_tokenizer(name: &str) -> Option<PreTokenizerWrapper> {
    let (_, expressions) = TABLE.iter().find(|(names, _)| names.contains(&name))?;
    let mut steps: Vec<PreTokenizerWrapper> = expressions
        .iter()
        .map(|pattern| {
            // The expressions are constants checked by the tests, so building them cannot fail
            // on user input.
            Split::new(
                SplitPattern::Regex((*pattern).to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map(PreTokenizerWrapper::from)
        })
        .collect::<Result<_, _>>()
        .ok()?;
    steps.push(ByteLevel::new(false, true, false).into());
    Some(Sequence::new(steps).into())
}

/// Text that tells the table's rules apart: contractions in both cases, digit runs of every
/// length, whitespace runs before words and at the end, newlines after punctuation, letters of
/// several scripts, CJK, and symbols.
const PROBE: &str = "I'm here, YOU'LL see: 1 22 333 4444 55555 x1y22   spaces\t\ttabs\n\n\
    end.\r\n  \n(parens) [brackets] don't-stop ÄÖÜ café naïve Ωμέγα Привет 漢字かな 한국어 \
    $100 +=-*/ <tag> `code` ~^| 🦀🦙 ...!?   ";

/// The name of the table entry whose rule splits text as `pre` does (a tokenizer.json's
/// pre-tokenizer), so a GGUF written from it can name its pre-tokenizer; `None` when no entry
/// matches on a probe text.
pub fn identify(pre: &PreTokenizerWrapper) -> Option<&'static str> {
    let splits = |p: &PreTokenizerWrapper| -> Option<Vec<String>> {
        let mut text = PreTokenizedString::from(PROBE);
        p.pre_tokenize(&mut text).ok()?;
        Some(
            text.get_splits(OffsetReferential::Original, OffsetType::Byte)
                .into_iter()
                .map(|(piece, _, _)| piece.to_string())
                .collect(),
        )
    };
    let want = splits(pre)?;
    TABLE.iter().find_map(|(names, _)| {
        let name = names[0];
        let candidate = byte_level_pre_tokenizer(name)?;
        (splits(&candidate)? == want).then_some(name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_expression_compiles() {
        for (names, expressions) in TABLE {
            for pattern in *expressions {
                if let Err(e) = Split::new(
                    SplitPattern::Regex((*pattern).to_string()),
                    SplitDelimiterBehavior::Isolated,
                    false,
                ) {
                    panic!("{names:?}: {pattern}: {e}");
                }
            }
        }
    }

    #[test]
    fn every_known_name_builds_and_the_list_matches_the_table() {
        let mut in_table: Vec<&str> = TABLE.iter().flat_map(|(n, _)| n.iter().copied()).collect();
        let mut listed = KNOWN_PRE_TOKENIZERS.to_vec();
        in_table.sort_unstable();
        listed.sort_unstable();
        assert_eq!(in_table, listed);
        for name in KNOWN_PRE_TOKENIZERS {
            assert!(byte_level_pre_tokenizer(name).is_some(), "{name}");
        }
        assert!(byte_level_pre_tokenizer("tekken").is_none());
    }

    #[test]
    fn each_rule_is_identified_as_itself_and_told_apart_from_the_others() {
        for (names, _) in TABLE {
            let pre = byte_level_pre_tokenizer(names[0]).unwrap();
            assert_eq!(identify(&pre), Some(names[0]));
        }
        // SmolLM's tokenizer.json form: digits split, then GPT-2's byte-level regex.
        let smollm: PreTokenizerWrapper =
            tokenizers::pre_tokenizers::sequence::Sequence::new(vec![
                tokenizers::pre_tokenizers::digits::Digits::new(true).into(),
                ByteLevel::new(false, true, true).into(),
            ])
            .into();
        assert_eq!(identify(&smollm), Some("smollm"));
        assert_eq!(
            identify(&ByteLevel::new(false, true, true).into()),
            Some("gpt-2")
        );
    }
}
