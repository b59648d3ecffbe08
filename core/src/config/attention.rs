//! Which attention the model runs: a plain name, shared by the trainer, the predictor and the
//! browser app.

use super::spellings;

/// Query and key positions per tile of the memory-efficient attention.
pub const ATTENTION_TILE: usize = 128;

/// Additive value for masked attention scores: `exp` of it underflows to exactly 0.
pub const MASKED: f32 = -1.0e9;

/// How the attention softmax is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttentionKind {
    /// HF "eager": the `[B, H, T, T]` scores and probabilities are materialised and kept for
    /// the backward.
    #[default]
    Eager,
    /// Memory-efficient ("flash-style"): tiled over queries and keys with an online softmax;
    /// only the output and one log-sum-exp per query row are kept, the tiles are recomputed
    /// in the backward.
    Efficient,
}

spellings! {
    AttentionKind, "attention", "attention", serde;
    Eager => "eager" []: "keeps the T×T attention probabilities for the backward (HF's eager)",
    Efficient => "efficient" ["flash"]: "tiled online softmax: keeps none, recomputes them in the backward",
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_bad_names_are_refused() {
        for kind in [AttentionKind::Eager, AttentionKind::Efficient] {
            assert_eq!(kind.to_string().parse::<AttentionKind>().unwrap(), kind);
        }
        let err = "sdpa".parse::<AttentionKind>().unwrap_err().to_string();
        assert!(err.contains("expected eager or efficient"), "{err}");
    }
}
