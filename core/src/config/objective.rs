//! What a run minimises, as its settings name it (`--objective`): a plain name shared by the
//! trainer (`train/preference.rs` adds its weight) and the predictor (a preference step runs
//! pairs of sequences, and DPO a reference forward).

use super::spellings;

/// The objective of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ObjectiveKind {
    /// Supervised fine-tuning.
    #[default]
    Sft,
    /// DPO on preference pairs.
    Dpo,
    /// ORPO on preference pairs.
    Orpo,
}

spellings! {
    ObjectiveKind, "objective", "objective", serde;
    Sft => "sft" []: "supervised fine-tuning: the replies' cross-entropy",
    Dpo => "dpo" []: "DPO on prompt / chosen / rejected pairs, the run's start as reference",
    Orpo => "orpo" []: "ORPO on prompt / chosen / rejected pairs: NLL plus an odds-ratio term, no reference",
}

impl ObjectiveKind {
    /// Whether it trains on preference pairs (each row a prompt with its chosen reply, then
    /// the prompt with its rejected one).
    pub fn is_preference(self) -> bool {
        self != ObjectiveKind::Sft
    }

    /// Whether each micro-batch also runs a reference forward (DPO's, graph-free).
    pub fn has_reference(self) -> bool {
        self == ObjectiveKind::Dpo
    }
}
