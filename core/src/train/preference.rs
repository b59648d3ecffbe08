//! Preference tuning's step: DPO and ORPO on micro-batches of pairs ([`PairBatch`]).
//!
//! Both losses are functions of each sequence's log-probability, `π = Σ log p(token)` over its
//! reply (ORPO: the mean, `π̄ = π / n`), which is linear in the per-token log-probabilities. So
//! the step reads the policy's per-token values from its logits (outside the graph), computes
//! the loss and `∂loss/∂π` per sequence on the host, and backpropagates the shifted
//! cross-entropy with each token weighted by `−∂loss/∂π` of its sequence: the same gradient as
//! the loss itself, through the same fused cross-entropy as supervised training.
//!
//! - **DPO** (TRL's `sigmoid` loss): `−log σ(β·((π_c − π_c^ref) − (π_r − π_r^ref)))`, mean over
//!   the step's pairs. The reference log-probabilities come from `reference` (the base with
//!   the adapters off, or the adapter the run started from) in the same micro-batch, without a
//!   graph.
//! - **ORPO** (TRL's `ORPOTrainer`): the chosen sequences' NLL over every token after their
//!   first, prompt included (TRL's choice), mean over those tokens of the step, minus
//!   `λ · mean log σ(log odds)`, `log odds = π̄_c − π̄_r − (log(1 − e^π̄_c) − log(1 − e^π̄_r))`.
//!   No reference.
//!
//! The step's loss is over all its pairs, whatever the micro-batches: pair-weighted for the
//! sequence terms, token-weighted for ORPO's NLL (as `step.rs` is for supervised training).
//! TRL divides each micro-batch's mean by the accumulation steps instead; with one
//! micro-batch, or equal ones, the two agree.

use burn::module::Module;
use burn::tensor::Tensor;

use super::grads::ParamGrads;
use super::step::{StepOptions, micro_backward};
use crate::config::ObjectiveKind;
use crate::data::MicroBatch;
use crate::data::{PairBatch, Role};
use crate::error::{Error, Result};
use crate::model::chunked_loss::{chunked_label_log_probs, chunked_weighted_lm_loss};
use crate::model::dropout_draw::micro_batch_key;
use crate::model::{Llama, loss::label_log_probs, loss::weighted_lm_loss};

/// What a run minimises.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Objective {
    /// Supervised fine-tuning: the labels' cross-entropy.
    Sft,
    /// Direct preference optimisation, with its β (TRL's default 0.1).
    Dpo {
        /// How far the policy may move from the reference.
        beta: f64,
    },
    /// Odds-ratio preference optimisation, with its λ (TRL's `beta`, default 0.1).
    Orpo {
        /// The weight of the odds-ratio term beside the NLL.
        lambda: f64,
    },
}

impl Objective {
    /// `kind` with its weight `beta` (DPO's β, ORPO's λ).
    pub fn of(kind: ObjectiveKind, beta: f64) -> Objective {
        match kind {
            ObjectiveKind::Sft => Objective::Sft,
            ObjectiveKind::Dpo => Objective::Dpo { beta },
            ObjectiveKind::Orpo => Objective::Orpo { lambda: beta },
        }
    }
}

/// One sequence side of a pair.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct Side {
    /// Σ log p over the reply's tokens.
    sum: f64,
    /// Reply tokens.
    tokens: usize,
}

impl Side {
    fn mean(self) -> f64 {
        self.sum / self.tokens.max(1) as f64
    }
}

/// A pair's sequence log-probabilities: chosen, rejected.
type PairLogps = (Side, Side);

/// The reply log-probabilities of every pair of a micro-batch from per-token values.
fn pair_logps(batch: &PairBatch, per_token: &[f32]) -> Vec<PairLogps> {
    let seq = batch.micro.batch.seq;
    batch
        .roles
        .chunks(seq)
        .zip(per_token.chunks(seq))
        .map(|(roles, values)| {
            let (mut chosen, mut rejected) = (Side::default(), Side::default());
            for (&role, &v) in roles.iter().zip(values) {
                let side = match role {
                    Role::Chosen => &mut chosen,
                    Role::Rejected => &mut rejected,
                    _ => continue,
                };
                side.sum += f64::from(v);
                side.tokens += 1;
            }
            (chosen, rejected)
        })
        .collect()
}

/// The step's metrics, named as TRL logs them (means over the step's pairs).
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct PreferenceMetrics {
    /// The step's loss.
    pub loss: f64,
    /// `rewards/chosen`: DPO β(π_c − π_c^ref); ORPO β·π̄_c.
    pub rewards_chosen: f64,
    /// `rewards/rejected`.
    pub rewards_rejected: f64,
    /// `rewards/accuracies`: the share of pairs whose chosen reward is the larger.
    pub rewards_accuracy: f64,
    /// `rewards/margins`: chosen minus rejected reward.
    pub rewards_margin: f64,
    /// `logps/chosen`: DPO the sum over the reply, ORPO the mean.
    pub logps_chosen: f64,
    /// `logps/rejected`.
    pub logps_rejected: f64,
    /// ORPO's `nll_loss` (0 for DPO).
    pub nll: f64,
    /// ORPO's `log_odds_ratio`, mean log σ(log odds) (0 for DPO).
    pub log_odds_ratio: f64,
    /// ORPO's `log_odds_chosen`, mean log odds (0 for DPO).
    pub log_odds_chosen: f64,
    /// Pairs in the step.
    pub pairs: usize,
}

/// A preference step's gradients and metrics.
#[derive(Debug, Clone)]
pub struct PreferenceStep {
    /// Accumulated gradients of the trainable parameters.
    pub grads: ParamGrads,
    /// What the step measured.
    pub metrics: PreferenceMetrics,
}

fn log_sigmoid(x: f64) -> f64 {
    // log σ(x) = −log(1 + e^−x), stable both ways.
    if x >= 0.0 {
        -(-x).exp().ln_1p()
    } else {
        x - x.exp().ln_1p()
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// log(1 − eˣ) for x < 0, stable near 0 and far below it (TRL's branch at −ln 2).
fn log1mexp(x: f64) -> f64 {
    if x < -std::f64::consts::LN_2 {
        (-x.exp()).ln_1p()
    } else {
        (-x.exp_m1()).ln()
    }
}

/// One pair's share of the loss (before the mean), its metrics, and the token weights
/// `−∂loss/∂(log p)` for its chosen reply, rejected reply and chosen prompt, per pair of the
/// step (`pairs`) and per chosen token of the step (`chosen_tokens`, ORPO's NLL).
struct PairTerms {
    loss: f64,
    rewards: (f64, f64),
    logps: (f64, f64),
    log_odds: f64,
    weights: [f64; 3],
}

fn pair_terms(
    objective: Objective,
    policy: PairLogps,
    reference: Option<PairLogps>,
    pairs: usize,
    chosen_tokens: usize,
) -> Result<PairTerms> {
    let p = pairs as f64;
    match objective {
        Objective::Sft => Err(Error::Internal(
            "a preference step with the supervised objective".into(),
        )),
        Objective::Dpo { beta } => {
            let (rc, rr) = reference
                .ok_or_else(|| Error::Internal("DPO needs reference log-probabilities".into()))?;
            let chosen_ratio = policy.0.sum - rc.sum;
            let rejected_ratio = policy.1.sum - rr.sum;
            let z = beta * (chosen_ratio - rejected_ratio);
            // ∂(−log σ(z))/∂π_c = −β σ(−z); the chosen reply's tokens weigh β σ(−z) / P.
            let w = beta * sigmoid(-z) / p;
            Ok(PairTerms {
                loss: -log_sigmoid(z),
                rewards: (beta * chosen_ratio, beta * rejected_ratio),
                logps: (policy.0.sum, policy.1.sum),
                log_odds: 0.0,
                weights: [w, -w, 0.0],
            })
        }
        Objective::Orpo { lambda } => {
            let (c, r) = (policy.0.mean(), policy.1.mean());
            let log_odds = (c - r) - (log1mexp(c) - log1mexp(r));
            // ∂ log odds/∂π̄_c = 1/(1 − e^π̄_c), ∂/∂π̄_r = −1/(1 − e^π̄_r); π̄ = π / n.
            let g = lambda * sigmoid(-log_odds) / p;
            let nll = 1.0 / chosen_tokens.max(1) as f64;
            Ok(PairTerms {
                loss: -lambda * log_sigmoid(log_odds),
                rewards: (lambda * c, lambda * r),
                logps: (c, r),
                log_odds,
                weights: [
                    nll + g / (-c.exp_m1() * policy.0.tokens.max(1) as f64),
                    -g / (-r.exp_m1() * policy.1.tokens.max(1) as f64),
                    nll,
                ],
            })
        }
    }
}

/// The step's (or evaluation's) totals that every micro-batch's terms are shares of.
#[derive(Debug, Clone, Copy)]
struct Totals {
    pairs: usize,
    chosen_tokens: usize,
}

impl Totals {
    fn of(batches: &[PairBatch]) -> Result<Self> {
        let pairs = batches.iter().map(PairBatch::pairs).sum();
        if pairs == 0 {
            return Err(Error::Input("a preference step needs a pair".into()));
        }
        let chosen_tokens = batches
            .iter()
            .flat_map(|b| &b.roles)
            .filter(|&&r| matches!(r, Role::Chosen | Role::ChosenPrompt))
            .count();
        Ok(Totals {
            pairs,
            chosen_tokens,
        })
    }
}

/// One micro-batch's share of the loss and the metrics (added into `metrics`) and its token
/// weights `−∂loss/∂ log p`, from the policy's per-token log-probabilities.
fn micro_terms(
    objective: Objective,
    batch: &PairBatch,
    per_token: &[f32],
    reference: Option<&[PairLogps]>,
    totals: Totals,
    metrics: &mut PreferenceMetrics,
) -> Result<Vec<f32>> {
    let seq = batch.micro.batch.seq;
    let p = totals.pairs as f64;
    let mut weights = vec![0f32; per_token.len()];
    for (pair, &logps) in pair_logps(batch, per_token).iter().enumerate() {
        let terms = pair_terms(
            objective,
            logps,
            reference.map(|r| r[pair]),
            totals.pairs,
            totals.chosen_tokens,
        )?;
        metrics.loss += terms.loss / p;
        metrics.rewards_chosen += terms.rewards.0 / p;
        metrics.rewards_rejected += terms.rewards.1 / p;
        metrics.rewards_accuracy += f64::from(u8::from(terms.rewards.0 > terms.rewards.1)) / p;
        metrics.logps_chosen += terms.logps.0 / p;
        metrics.logps_rejected += terms.logps.1 / p;
        if let Objective::Orpo { .. } = objective {
            metrics.log_odds_ratio += log_sigmoid(terms.log_odds) / p;
            metrics.log_odds_chosen += terms.log_odds / p;
        }
        let [chosen, rejected, prompt] = terms.weights.map(|w| w as f32);
        let row = pair * seq..(pair + 1) * seq;
        for (weight, role) in weights[row.clone()].iter_mut().zip(&batch.roles[row]) {
            *weight = match role {
                Role::Chosen => chosen,
                Role::Rejected => rejected,
                Role::ChosenPrompt => prompt,
                Role::RejectedPrompt | Role::None => 0.0,
            };
        }
    }
    if let Objective::Orpo { .. } = objective {
        // The NLL's share: Σ −log p over this micro-batch's chosen tokens / the step's.
        let nll = per_token
            .iter()
            .zip(&batch.roles)
            .filter(|(_, r)| matches!(r, Role::Chosen | Role::ChosenPrompt))
            .map(|(&v, _)| -f64::from(v))
            .sum::<f64>()
            / totals.chosen_tokens.max(1) as f64;
        metrics.nll += nll;
        metrics.loss += nll;
    }
    Ok(weights)
}

/// DPO's reference log-probabilities of a micro-batch (None for ORPO), without a graph.
fn reference_logps(
    objective: Objective,
    reference: Option<&Llama>,
    batch: &PairBatch,
    loss_chunk_rows: Option<usize>,
) -> Result<Option<Vec<PairLogps>>> {
    match (objective, reference) {
        (Objective::Dpo { .. }, Some(reference)) => Ok(Some(pair_logps(
            batch,
            &graph_free_log_probs(reference, &batch.micro, loss_chunk_rows)?,
        ))),
        (Objective::Dpo { .. }, None) => Err(Error::Internal("DPO needs a reference model".into())),
        _ => Ok(None),
    }
}

/// `log p(label)` of every label of `micro` under a graph-free `model`, from the whole logits or
/// `loss_chunk_rows` rows of them at a time.
fn graph_free_log_probs(
    model: &Llama,
    micro: &MicroBatch,
    loss_chunk_rows: Option<usize>,
) -> Result<Vec<f32>> {
    match loss_chunk_rows {
        Some(rows) => {
            let top = model.blocks_in(model.embed(&micro.batch), &model.context(&micro.batch));
            chunked_label_log_probs(model, top, &micro.labels, rows)
        }
        None => label_log_probs(model.forward(&micro.batch), &micro.labels),
    }
}

/// Forward and backward of a preference step over its micro-batches: the objective's
/// gradients and TRL's metrics. `reference` (graph-free, e.g. `model.without_adapters()
/// .valid()`) is DPO's; ORPO takes none. Options as for supervised steps, less the
/// accumulation rule (see the module's note).
pub fn preference_forward_backward(
    model: &Llama,
    reference: Option<&Llama>,
    batches: &[PairBatch],
    objective: Objective,
    options: &StepOptions,
) -> Result<PreferenceStep> {
    let totals = Totals::of(batches)?;
    let mut metrics = PreferenceMetrics {
        pairs: totals.pairs,
        ..PreferenceMetrics::default()
    };
    let mut grads = ParamGrads::new();
    for (index, batch) in batches.iter().enumerate() {
        let micro = &batch.micro;
        let reference = reference_logps(objective, reference, batch, options.loss_chunk_rows)?;
        let mut head_loss = |top: Tensor<3>| -> Result<(Tensor<1>, Tensor<1>)> {
            // Whole: the logits, read for the log-probabilities and then weighted. Chunked: two
            // passes over the chunks, the log-probabilities without a graph, then the weighted
            // surrogate with each chunk's gradient.
            let (per_token, logits) = match options.loss_chunk_rows {
                Some(rows) => {
                    let top = top.clone().inner();
                    let values = chunked_label_log_probs(&model.valid(), top, &micro.labels, rows);
                    (values?, None)
                }
                None => {
                    let logits = model.head(top.clone());
                    (
                        label_log_probs(logits.clone(), &micro.labels)?,
                        Some(logits),
                    )
                }
            };
            let weights = micro_terms(
                objective,
                batch,
                &per_token,
                reference.as_deref(),
                totals,
                &mut metrics,
            )?;
            // The surrogate's value is not the loss (the loss is the host's sum above).
            let (surrogate, value) = match (options.loss_chunk_rows, logits) {
                (Some(rows), _) => {
                    chunked_weighted_lm_loss(model, top, &micro.labels, Some(&weights), rows)?
                }
                (None, Some(logits)) => {
                    let surrogate = weighted_lm_loss(logits, &micro.labels, &weights)?;
                    (surrogate.clone(), surrogate.inner())
                }
                (None, None) => return Err(Error::Internal("no logits to weigh".into())),
            };
            Ok((surrogate * options.loss_scale, value))
        };
        let key = micro_batch_key(options.dropout_key, index);
        let (micro_grads, _) = micro_backward(
            model,
            micro,
            options.checkpointing,
            key,
            &mut || {},
            &mut head_loss,
        )?;
        grads.add(micro_grads);
    }
    metrics.rewards_margin = metrics.rewards_chosen - metrics.rewards_rejected;
    Ok(PreferenceStep { grads, metrics })
}

/// The loss and metrics of `model` (graph-free) on `batches`, as a step would measure them
/// before its backward: the held-out evaluation.
pub fn preference_metrics(
    model: &Llama,
    reference: Option<&Llama>,
    batches: &[PairBatch],
    objective: Objective,
    loss_chunk_rows: Option<usize>,
) -> Result<PreferenceMetrics> {
    let totals = Totals::of(batches)?;
    let mut metrics = PreferenceMetrics {
        pairs: totals.pairs,
        ..PreferenceMetrics::default()
    };
    for batch in batches {
        let reference = reference_logps(objective, reference, batch, loss_chunk_rows)?;
        let per_token = graph_free_log_probs(model, &batch.micro, loss_chunk_rows)?;
        micro_terms(
            objective,
            batch,
            &per_token,
            reference.as_deref(),
            totals,
            &mut metrics,
        )?;
    }
    metrics.rewards_margin = metrics.rewards_chosen - metrics.rewards_rejected;
    Ok(metrics)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(sum: f64, tokens: usize) -> Side {
        Side { sum, tokens }
    }

    /// The token weights are −∂loss/∂(log p), checked by finite differences of the loss.
    #[test]
    fn the_token_weights_are_the_losses_derivatives() {
        let (c, r) = (side(-12.0, 4), side(-9.0, 3));
        let reference = Some((side(-11.0, 4), side(-10.0, 3)));
        for objective in [
            Objective::Dpo { beta: 0.1 },
            Objective::Orpo { lambda: 0.25 },
        ] {
            let loss = |c: Side, r: Side| {
                let t = pair_terms(objective, (c, r), reference, 2, 10).unwrap();
                // ORPO's NLL term: −π_c/N over the chosen tokens (prompt tokens held apart).
                let nll = match objective {
                    Objective::Orpo { .. } => -c.sum / 10.0,
                    _ => 0.0,
                };
                t.loss / 2.0 + nll
            };
            let terms = pair_terms(objective, (c, r), reference, 2, 10).unwrap();
            let h = 1e-5;
            // One token's log p moves π by h (and π̄ by h / n).
            let dc = (loss(side(c.sum + h, 4), r) - loss(side(c.sum - h, 4), r)) / (2.0 * h);
            let dr = (loss(c, side(r.sum + h, 3)) - loss(c, side(r.sum - h, 3))) / (2.0 * h);
            assert!(
                (terms.weights[0] + dc).abs() < 1e-8,
                "{objective:?}: {} vs {}",
                terms.weights[0],
                -dc
            );
            assert!(
                (terms.weights[1] + dr).abs() < 1e-8,
                "{objective:?}: {} vs {}",
                terms.weights[1],
                -dr
            );
        }
    }

    #[test]
    fn the_stable_forms_agree_with_the_naive_ones() {
        for x in [-30.0, -3.0, -0.7, -0.69, -0.01] {
            assert!(
                (log1mexp(x) - (1.0 - f64::exp(x)).ln()).abs() < 1e-12,
                "{x}"
            );
        }
        for x in [-20.0, -1.0, 0.0, 1.0, 20.0] {
            assert!((log_sigmoid(x) - sigmoid(x).ln()).abs() < 1e-12, "{x}");
        }
    }
}
