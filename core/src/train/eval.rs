//! Held-out evaluation and early stopping.
//!
//! The held-out loss is the token-weighted mean of −log p(label) over every label token of the
//! held-out micro-batches (the same packing rules as training, in file order), computed on the
//! model outside autodiff (no graph kept); the perplexity is its exponential. Early stopping
//! watches it: after `patience` evaluations in a row without a new best, the run ends, and the
//! best step's weights are in `best/` beside the checkpoints. With a preference objective the
//! held-out pairs' loss takes the held-out loss's place, with TRL's reward metrics beside it.

use burn::module::Module;
use serde::{Deserialize, Serialize};

use super::preference::{Objective, PreferenceMetrics, preference_metrics};
use crate::data::{MicroBatch, PairBatch};
use crate::error::Result;
use crate::kernels::values::scalar;
use crate::model::chunked_loss::chunked_lm_loss_value;
use crate::model::{Llama, causal_lm_loss};

/// One evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct EvalReport {
    /// Mean loss over the held-out label tokens (nats/token).
    pub loss: f64,
    /// `exp(loss)`.
    pub perplexity: f64,
    /// Label tokens scored.
    pub tokens: usize,
    /// With a preference objective: the held-out pairs' loss and TRL's metrics (`loss` is
    /// then that loss, and `perplexity` its exponential, which means little).
    pub preference: Option<PreferenceMetrics>,
}

impl EvalReport {
    /// The evaluation in a few words, for the progress line.
    pub fn describe(&self) -> String {
        match &self.preference {
            Some(m) => format!(
                "{:.4} (reward accuracy {:.2}, margin {:.3})",
                self.loss, m.rewards_accuracy, m.rewards_margin
            ),
            None => format!("{:.4} (ppl {:.2})", self.loss, self.perplexity),
        }
    }
}

/// The held-out loss of `model` on `batches`; with `loss_chunk_rows` (the run's chunked loss)
/// the head and the loss run that many logits rows at a time, so an evaluation holds no more
/// logits than a step.
pub fn held_out_loss(
    model: &Llama,
    batches: &[MicroBatch],
    loss_chunk_rows: Option<usize>,
) -> Result<EvalReport> {
    let frozen = model.valid();
    let mut sum = 0.0f64;
    let mut tokens = 0usize;
    for micro in batches {
        let value = match loss_chunk_rows {
            Some(rows) => {
                let top =
                    frozen.blocks_in(frozen.embed(&micro.batch), &frozen.context(&micro.batch));
                chunked_lm_loss_value(&frozen, top, &micro.labels, rows)?
            }
            None => causal_lm_loss(frozen.forward(&micro.batch), &micro.labels)?.sum,
        };
        tokens += micro.label_tokens();
        sum += f64::from(scalar(value));
    }
    let loss = sum / tokens.max(1) as f64;
    Ok(EvalReport {
        loss,
        perplexity: loss.exp(),
        tokens,
        preference: None,
    })
}

/// The held-out preference loss and metrics of `model` on `batches` (one evaluation over all
/// of them, pair-weighted), without a graph.
pub fn held_out_preference(
    model: &Llama,
    reference: Option<&Llama>,
    batches: &[PairBatch],
    objective: Objective,
    loss_chunk_rows: Option<usize>,
) -> Result<EvalReport> {
    let metrics = preference_metrics(
        &model.valid(),
        reference,
        batches,
        objective,
        loss_chunk_rows,
    )?;
    let tokens = batches.iter().map(|b| b.micro.label_tokens()).sum();
    Ok(EvalReport {
        loss: metrics.loss,
        perplexity: metrics.loss.exp(),
        tokens,
        preference: Some(metrics),
    })
}

/// Where early stopping stands; saved in each checkpoint so a resumed run stops where an
/// uninterrupted one would.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct EvalState {
    /// The lowest held-out loss so far.
    pub best_loss: Option<f64>,
    /// The optimizer step that reached it.
    pub best_step: u64,
    /// Evaluations since the best one.
    pub evals_since_best: usize,
}

impl EvalState {
    /// Records an evaluation after `step`; returns whether it is a new best (strictly lower).
    pub fn record(&mut self, step: u64, loss: f64) -> bool {
        let improved = self.best_loss.is_none_or(|best| loss < best);
        if improved {
            self.best_loss = Some(loss);
            self.best_step = step;
            self.evals_since_best = 0;
        } else {
            self.evals_since_best += 1;
        }
        improved
    }

    /// Whether `patience` evaluations in a row brought no new best (0: never).
    pub fn should_stop(&self, patience: usize) -> bool {
        patience > 0 && self.evals_since_best >= patience
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Evaluations of `losses` (steps 10, 20, …) until `patience` stops them: the index of
    /// the stopping evaluation, and the state.
    fn run(losses: &[f64], patience: usize) -> (Option<usize>, EvalState) {
        let mut s = EvalState::default();
        for (i, &loss) in losses.iter().enumerate() {
            s.record(i as u64 * 10 + 10, loss);
            if s.should_stop(patience) {
                return (Some(i), s);
            }
        }
        (None, s)
    }

    #[test]
    fn stops_after_patience_evaluations_without_a_new_best() {
        // An equal loss is no improvement: 2.6 and 2.5 are two misses after 2.5.
        let (stop, s) = run(&[3.0, 2.5, 2.6, 2.5, 2.4], 2);
        assert_eq!((stop, s.best_loss, s.best_step), (Some(3), Some(2.5), 20));
        // A new best (2.4) starts the count again.
        let (stop, s) = run(&[3.0, 2.5, 2.6, 2.5, 2.4, 2.7, 2.8, 2.9], 3);
        assert_eq!((stop, s.best_loss, s.best_step), (Some(7), Some(2.4), 50));
        assert_eq!(run(&[3.0, 3.1, 3.2], 0).0, None, "patience 0 never stops");
    }
}
