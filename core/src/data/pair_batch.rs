//! Preference pairs as one micro-batch: each pair is one row holding two segments, the prompt
//! with the chosen reply, then the prompt with the rejected one, each from position 0. The
//! segments never attend to each other (packing's rule), so both sequences' logits are what
//! they would be alone, and a pair never straddles two micro-batches. Rows are padded to the
//! longest.

use super::MicroBatch;
use super::packing::PAD_ID;
use crate::model::{IGNORE_INDEX, TokenBatch};

use super::preference::PairTokens;

/// What one token of a pair row is, for the preference loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Padding, or a sequence's first token (predicted by nothing).
    None,
    /// The prompt of the chosen sequence (ORPO's NLL counts it, as TRL's does).
    ChosenPrompt,
    /// A token of the chosen reply.
    Chosen,
    /// The prompt of the rejected sequence (counts nowhere).
    RejectedPrompt,
    /// A token of the rejected reply.
    Rejected,
}

/// A micro-batch of preference pairs.
#[derive(Debug, Clone)]
pub struct PairBatch {
    /// `[P, T]`: one row per pair; its labels are the tokens wherever a role counts.
    pub micro: MicroBatch,
    /// `[P, T]` row-major: each token's role.
    pub roles: Vec<Role>,
}

impl PairBatch {
    /// Pairs, each truncated to `seq_len` tokens per sequence (prompt first, as TRL's
    /// `keep_start`), as one micro-batch of `[P, T]`, T the longest pair's two sequences.
    ///
    /// # Panics
    /// If `pairs` is empty (the loader never makes an empty micro-batch).
    pub fn new(pairs: &[PairTokens], seq_len: usize) -> Self {
        assert!(!pairs.is_empty(), "a pair batch needs a pair");
        let sequence = |prompt: &[u32], reply: &[u32]| -> (Vec<u32>, usize) {
            let mut ids: Vec<u32> = prompt.iter().chain(reply).copied().collect();
            ids.truncate(seq_len);
            (ids, prompt.len())
        };
        let rows: Vec<[(Vec<u32>, usize); 2]> = pairs
            .iter()
            .map(|p| {
                [
                    sequence(&p.prompt, &p.chosen),
                    sequence(&p.prompt, &p.rejected),
                ]
            })
            .collect();
        let width = rows
            .iter()
            .map(|[c, r]| c.0.len() + r.0.len())
            .max()
            .unwrap_or(0);
        let cells = pairs.len() * width;
        let (mut ids, mut positions, mut segments) = (
            Vec::with_capacity(cells),
            Vec::with_capacity(cells),
            Vec::with_capacity(cells),
        );
        let (mut labels, mut roles) = (Vec::with_capacity(cells), Vec::with_capacity(cells));
        for row in &rows {
            let mut used = 0;
            for (segment, ((sequence, prompt_len), (prompt_role, reply_role))) in row
                .iter()
                .zip([
                    (Role::ChosenPrompt, Role::Chosen),
                    (Role::RejectedPrompt, Role::Rejected),
                ])
                .enumerate()
            {
                for (t, &id) in sequence.iter().enumerate() {
                    let role = match t {
                        0 => Role::None,
                        t if t < *prompt_len => prompt_role,
                        _ => reply_role,
                    };
                    ids.push(id);
                    positions.push(t as u32);
                    segments.push(segment as u32);
                    labels.push(if role == Role::None {
                        IGNORE_INDEX
                    } else {
                        i64::from(id)
                    });
                    roles.push(role);
                }
                used += sequence.len();
            }
            for t in 0..width - used {
                ids.push(PAD_ID);
                positions.push(t as u32);
                segments.push(2);
                labels.push(IGNORE_INDEX);
                roles.push(Role::None);
            }
        }
        let batch = TokenBatch {
            batch: pairs.len(),
            seq: width,
            input_ids: ids,
            positions,
            segments,
        };
        PairBatch {
            micro: MicroBatch { batch, labels },
            roles,
        }
    }

    /// Pairs in the micro-batch.
    pub fn pairs(&self) -> usize {
        self.micro.batch.batch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_pair_is_a_row_of_two_segments_from_position_zero() {
        let pairs = [
            PairTokens {
                prompt: vec![5, 6],
                chosen: vec![7],
                rejected: vec![8, 9],
            },
            PairTokens {
                prompt: vec![5],
                chosen: vec![7, 7, 7],
                rejected: vec![9],
            },
        ];
        let batch = PairBatch::new(&pairs, 64);
        assert_eq!((batch.micro.batch.batch, batch.micro.batch.seq), (2, 7));
        assert_eq!(&batch.micro.batch.input_ids[..7], &[5, 6, 7, 5, 6, 8, 9]);
        assert_eq!(&batch.micro.batch.positions[..7], &[0, 1, 2, 0, 1, 2, 3]);
        assert_eq!(&batch.micro.batch.segments[7..], &[0, 0, 0, 0, 1, 1, 2]);
        use Role::*;
        assert_eq!(
            &batch.roles[..7],
            &[
                None,
                ChosenPrompt,
                Chosen,
                None,
                RejectedPrompt,
                Rejected,
                Rejected
            ]
        );
        assert_eq!(
            &batch.micro.labels[..4],
            &[IGNORE_INDEX, 6, 7, IGNORE_INDEX]
        );
        // The second row: its chosen reply starts right after a one-token prompt, then padding.
        assert_eq!(
            &batch.roles[7..],
            &[None, Chosen, Chosen, Chosen, None, Rejected, None]
        );
        // Truncation keeps each sequence's start.
        let short = PairBatch::new(&pairs[..1], 2);
        assert_eq!(short.micro.batch.input_ids, vec![5, 6, 5, 6]);
    }
}
