//! Preference steps (DPO, ORPO) against the predictor: the step peak above the resident model
//! and its reference, measured by the counting allocator, beside the replayed step of the same
//! settings (`StepSettings` with the objective: pair rows of twice the sequence, DPO's
//! graph-free reference forward first), and the reference's resident cost.
//!
//! DPO's reference forward sets no case's step peak (the policy's backward is larger), so it
//! is also measured alone, against the replay's reference events.
//!
//! Fit and held-out cases are apart. The fit cases were written with the reference forward's
//! rule (`predict/workspace.rs`, `predict/timeline.rs`) and its first run. The held-out cases
//! (other shapes, ranks, targets, pair counts and accumulation) were chosen on 2026-12-07
//! before any of them ran; their step peaks are the validation (2.6 % at worst, first run).
//! The reference forward's rule changed twice on what these cases showed, so its early
//! figures validate nothing:
//! - the first rule (the stream, one block, the logits) was 4–7 % low in every case, fit and
//!   held out alike: one `[B, T, D]` short at the logits, the final norm's output beside the
//!   stream;
//! - then the first held-out case (tiny-smol, whose reference peaks in a block, not at the
//!   logits) was 6 % low: the forward's tables, RoPE's cos and sin and the eager attention's
//!   mask (one per pair row), alive through the blocks and freed before the head. A probe of
//!   the graph-free forward alone (tiny-smol and the small config, eager and efficient,
//!   packed rows or not, NF4 or not) showed the mask's share: packed rows cost `(B − 1)` more
//!   `[T, T]` masks, and NF4 moved nothing.
//!
//! The last two cases were chosen after the first change and had not run before the second:
//! for the reference forward they are the held-out figures (first run: 0.9997, 0.9827).
use super::*;
use burn::module::Module;
use napkin_core::config::{LoraTarget, ObjectiveKind};
use napkin_core::data::{PairBatch, PairTokens};
use napkin_core::model::chunked_loss::chunked_label_log_probs;
use napkin_core::model::label_log_probs;
use napkin_core::predict::settings::StepSettings;
use napkin_core::predict::timeline::step_timeline;
use napkin_core::train::{Objective, preference_forward_backward};

struct Case {
    label: &'static str,
    config: LlamaConfig,
    lora: LoraConfig,
    nf4: Option<Nf4Config>,
    objective: ObjectiveKind,
    /// Pairs per micro-batch.
    pairs: usize,
    /// Tokens of each sequence (prompt and reply), chosen and rejected alike.
    seq: usize,
    checkpointing: bool,
    accumulation: usize,
    held_out: bool,
    /// The chunked loss (`--chunked-loss`): the policy's and the reference's logits one chunk
    /// at a time.
    chunked: bool,
}

fn cases() -> Vec<Case> {
    let all = |r: usize| LoraConfig {
        r,
        alpha: 2.0 * r as f64,
        ..Default::default()
    };
    let qv = |r: usize| LoraConfig {
        targets: vec![LoraTarget::QProj, LoraTarget::VProj],
        ..all(r)
    };
    let dq = Nf4Config {
        block_size: 64,
        double_quant: true,
    };
    let fit = |label, objective, nf4: Option<Nf4Config>, checkpointing, accumulation| Case {
        label,
        config: LlamaConfig::small(),
        lora: all(8),
        nf4,
        objective,
        pairs: 2,
        seq: 64,
        checkpointing,
        accumulation,
        held_out: false,
        chunked: false,
    };
    use ObjectiveKind::{Dpo, Orpo};
    vec![
        fit("small DPO LoRA r8", Dpo, None, false, 1),
        fit("small DPO LoRA r8 ckpt", Dpo, None, true, 1),
        fit("small DPO QLoRA r8 accum 2", Dpo, Some(dq), false, 2),
        fit("small DPO QLoRA r8 ckpt accum 2", Dpo, Some(dq), true, 2),
        fit("small ORPO LoRA r8", Orpo, None, false, 1),
        fit("small ORPO QLoRA r8 ckpt", Orpo, Some(dq), true, 1),
        Case {
            label: "tiny-smol DPO QLoRA r4 q,v ckpt 3 pairs T=40",
            config: LlamaConfig::tiny_smol(),
            lora: qv(4),
            nf4: Some(dq),
            objective: Dpo,
            pairs: 3,
            seq: 40,
            checkpointing: true,
            accumulation: 1,
            held_out: true,
            chunked: false,
        },
        Case {
            label: "small DPO LoRA r16 1 pair T=96 accum 3",
            config: LlamaConfig::small(),
            lora: all(16),
            nf4: None,
            objective: Dpo,
            pairs: 1,
            seq: 96,
            checkpointing: false,
            accumulation: 3,
            held_out: true,
            chunked: false,
        },
        Case {
            label: "tiny-smol ORPO LoRA r8 2 pairs T=50",
            config: LlamaConfig::tiny_smol(),
            lora: all(8),
            nf4: None,
            objective: Orpo,
            pairs: 2,
            seq: 50,
            checkpointing: false,
            accumulation: 1,
            held_out: true,
            chunked: false,
        },
        Case {
            label: "small DPO QLoRA r8 q,v ckpt 4 pairs T=32",
            config: LlamaConfig::small(),
            lora: qv(8),
            nf4: Some(Nf4Config::default()),
            objective: Dpo,
            pairs: 4,
            seq: 32,
            checkpointing: true,
            accumulation: 1,
            held_out: true,
            chunked: false,
        },
        // Chosen on 2026-12-07 after the reference forward's rule gained the final norm's
        // output and before they ran (see the module's note).
        Case {
            label: "tiny-smol DPO QLoRA r16 2 pairs T=64",
            config: LlamaConfig::tiny_smol(),
            lora: all(16),
            nf4: Some(Nf4Config::default()),
            objective: Dpo,
            pairs: 2,
            seq: 64,
            checkpointing: false,
            accumulation: 1,
            held_out: true,
            chunked: false,
        },
        Case {
            label: "small DPO LoRA r4 k,o ckpt 3 pairs T=24 accum 2",
            config: LlamaConfig::small(),
            lora: LoraConfig {
                targets: vec![LoraTarget::KProj, LoraTarget::OProj],
                ..all(4)
            },
            nf4: None,
            objective: Dpo,
            pairs: 3,
            seq: 24,
            checkpointing: true,
            accumulation: 2,
            held_out: true,
            chunked: false,
        },
        // The chunked loss on a SmolLM2-shaped slice (its 49,152-word vocabulary, 2 of its 30
        // layers), where the logits are the step's largest tensors: chosen 2026-12-07 before
        // their first run. The first one's first run found the reference forward still
        // predicted with the whole logits (0.34), so it drove the chunked reference's rule and
        // is fit; the other two first ran after it.
        Case {
            label: "SmolLM2 slice DPO LoRA r8 chunked 1 pair T=128",
            config: smollm2_slice(true),
            lora: all(8),
            nf4: None,
            objective: ObjectiveKind::Dpo,
            pairs: 1,
            seq: 128,
            checkpointing: false,
            accumulation: 1,
            held_out: false,
            chunked: true,
        },
        Case {
            label: "SmolLM2 slice ORPO LoRA r16 q,v chunked ckpt 2 pairs T=96",
            config: smollm2_slice(true),
            lora: qv(16),
            nf4: None,
            objective: ObjectiveKind::Orpo,
            pairs: 2,
            seq: 96,
            checkpointing: true,
            accumulation: 1,
            held_out: true,
            chunked: true,
        },
        Case {
            label: "SmolLM2 slice untied DPO QLoRA r8 chunked ckpt 1 pair T=160",
            config: smollm2_slice(false),
            lora: all(8),
            nf4: Some(Nf4Config {
                block_size: 64,
                double_quant: true,
            }),
            objective: ObjectiveKind::Dpo,
            pairs: 1,
            seq: 160,
            checkpointing: true,
            accumulation: 1,
            held_out: true,
            chunked: true,
        },
    ]
}

/// `pairs` pairs whose two sequences are both `seq` tokens (a prompt of a third, then the
/// reply), so every row is `2 · seq` wide, as the prediction's.
/// SmolLM2-135M's shape with 2 of its decoder layers, its head tied or not.
fn smollm2_slice(tied: bool) -> LlamaConfig {
    LlamaConfig {
        num_hidden_layers: 2,
        tie_word_embeddings: tied,
        ..LlamaConfig::smollm2_135m()
    }
}

fn pair_tokens(pairs: usize, seq: usize, vocab: usize, seed: usize) -> Vec<PairTokens> {
    let ids = |len: usize, salt: usize| -> Vec<u32> {
        (0..len)
            .map(|i| ((i * 31 + salt * 7 + seed * 131) % vocab) as u32)
            .collect()
    };
    let prompt = seq / 3;
    (0..pairs)
        .map(|p| PairTokens {
            prompt: ids(prompt, 3 * p),
            chosen: ids(seq - prompt, 3 * p + 1),
            rejected: ids(seq - prompt, 3 * p + 2),
        })
        .collect()
}

#[test]
fn preference_step_peaks_are_within_5_percent_of_the_prediction() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (mut worst, mut reference_worst) = ([0f64; 2], [0f64; 2]);
    for case in cases() {
        let model = build(&case.config, case.nf4.as_ref(), true)
            .with_lora(&case.lora)
            .unwrap();
        // The reference shares the base's weights: it adds burn's bookkeeping of each
        // parameter tensor it holds (under 3 KiB a tensor), no copy of a weight.
        let before = live_bytes();
        let reference = case
            .objective
            .has_reference()
            .then(|| model.without_adapters().valid());
        let reference_bytes = live_bytes().saturating_sub(before) as u64;
        let base = inventory(&Scenario {
            nf4: case.nf4,
            ..Scenario::new(case.config.clone(), 1, 2)
        });
        let resident = |e: &&napkin_core::predict::inventory::Entry| {
            matches!(e.kind, Kind::Weights | Kind::QuantCodes | Kind::QuantScales)
                && e.name != "parameters.bookkeeping"
        };
        let weights: u64 = base.iter().filter(resident).map(|e| e.bytes).sum();
        let tensors = base
            .iter()
            .filter(|e| e.kind == Kind::Weights && e.name != "parameters.bookkeeping")
            .count() as u64;
        assert!(
            reference_bytes <= 3 * 1024 * tensors,
            "{}: the reference took {reference_bytes} B for {tensors} parameter tensors \
             ({weights} B of weights)",
            case.label
        );
        let batches: Vec<PairBatch> = (0..case.accumulation)
            .map(|m| {
                PairBatch::new(
                    &pair_tokens(case.pairs, case.seq, case.config.vocab_size, m),
                    case.seq,
                )
            })
            .collect();
        assert!(batches.iter().all(|b| b.micro.batch.seq == 2 * case.seq));
        let objective = Objective::of(case.objective, 0.1);
        let scenario = StepSettings {
            objective: case.objective,
            micro_batch: case.pairs,
            seq_len: case.seq,
            lora_r: case.lora.r,
            lora_alpha: Some(case.lora.alpha),
            lora_targets: case.lora.targets.clone(),
            nf4: case.nf4,
            checkpointing: case.checkpointing,
            chunked_loss: case.chunked,
            accumulation: case.accumulation,
            ..StepSettings::default()
        }
        .scenario(case.config.clone())
        .unwrap();
        let chunk_rows = scenario.loss_chunk_rows();
        let options = StepOptions::default()
            .with_checkpointing(case.checkpointing)
            .with_loss_chunk_rows(chunk_rows);
        let step = || {
            preference_forward_backward(&model, reference.as_ref(), &batches, objective, &options)
                .unwrap()
        };
        drop(step()); // warm-up
        let start = reset_peak();
        let out = step();
        let peak = (peak_bytes() - start) as f64;
        drop(out);

        let timeline = step_timeline(&scenario);
        let predicted = (timeline.peak.bytes - timeline.persistent) as f64;
        let ratio = peak / predicted;
        eprintln!(
            "{:<9} {:<48} step peak measured {:>11.0} predicted {:>11.0} ratio {ratio:.4} \
             (at {}); reference {} B beside {} B of weights",
            if case.held_out { "held out" } else { "fit" },
            case.label,
            peak,
            predicted,
            timeline.peak.label,
            reference_bytes,
            weights
        );
        let k = usize::from(case.held_out);
        worst[k] = worst[k].max((ratio - 1.0).abs());
        // DPO's reference forward alone (it sets no case's step peak, so it is held here):
        // graph-free, the logits read for the label log-probabilities in place.
        if let Some(reference) = &reference {
            let batch = &batches[0].micro;
            let forward = || match chunk_rows {
                Some(rows) => {
                    let top = reference.blocks_in(
                        reference.embed(&batch.batch),
                        &reference.context(&batch.batch),
                    );
                    chunked_label_log_probs(reference, top, &batch.labels, rows)
                }
                None => label_log_probs(reference.forward(&batch.batch), &batch.labels),
            };
            drop(forward());
            let start = reset_peak();
            drop(forward());
            let measured = (peak_bytes() - start) as f64;
            let predicted = timeline
                .events
                .iter()
                .filter(|e| e.label.starts_with("reference.") && e.micro_batch == 0)
                .map(|e| e.bytes)
                .max()
                .expect("DPO replays its reference")
                - timeline.persistent;
            let ratio = measured / predicted as f64;
            eprintln!(
                "{:<9} {:<48} reference forward measured {measured:>11.0} predicted \
                 {predicted:>11} ratio {ratio:.4}",
                "", case.label
            );
            reference_worst[k] = reference_worst[k].max((ratio - 1.0).abs());
            assert!(
                (ratio - 1.0).abs() <= 0.05,
                "{}: reference forward measured {measured} vs predicted {predicted}",
                case.label
            );
        }
        assert!(
            (ratio - 1.0).abs() <= 0.05,
            "{}: step peak measured {peak} vs predicted {predicted}",
            case.label
        );
    }
    eprintln!(
        "worst |measured/predicted − 1|: step peak fit {:.4}, held out {:.4}; reference \
         forward fit {:.4}, held out {:.4}",
        worst[0], worst[1], reference_worst[0], reference_worst[1]
    );
}
