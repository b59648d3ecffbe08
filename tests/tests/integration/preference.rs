//! DPO and ORPO against TRL (`tests/corpus/preference`, by its script: a tiny Llama, a drawn
//! LoRA adapter, eight plain-text pairs, and `DPOTrainer` / `ORPOTrainer`'s losses, metrics and
//! LoRA gradients on all eight in one batch). napkin tokenizes the pairs as TRL does, and its
//! preference step gives TRL's loss, metrics and every adapter gradient; the step's
//! invariants hold (micro-batches and checkpointing change nothing; a reference equal to the
//! policy gives DPO's log 2).

use std::path::{Path, PathBuf};

use burn::module::Module;

use napkin_core::data::{PairBatch, PairTokens, read_pairs};
use napkin_core::device::DeviceKind;
use napkin_core::io::load_hf_llama;
use napkin_core::io::peft::PEFT_PREFIX;
use napkin_core::kernels::values::to_f32_vec;
use napkin_core::model::Llama;
use napkin_core::tokenizer::tokenizer_for_model;
use napkin_core::train::{
    Objective, PreferenceMetrics, PreferenceStep, StepOptions, preference_forward_backward,
    preference_metrics,
};
use napkin_tests::{Reference, assert_close};
use serde_json::Value;

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/preference")
}

fn policy() -> Llama {
    let device = DeviceKind::Cpu.open().unwrap().autodiff();
    let base = load_hf_llama(&corpus().join("hf"), &device).unwrap();
    base.load_lora(&corpus().join("lora")).unwrap().0
}

fn summary() -> Value {
    let text = std::fs::read_to_string(corpus().join("reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The pairs as TRL tokenized them (`reference.json`).
fn trl_pairs() -> Vec<PairTokens> {
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_u64().unwrap() as u32)
            .collect()
    };
    summary()["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| PairTokens {
            prompt: ids(&p["prompt_ids"]),
            chosen: ids(&p["chosen_ids"]),
            rejected: ids(&p["rejected_ids"]),
        })
        .collect()
}

fn step(
    model: &Llama,
    reference: Option<&Llama>,
    batches: &[PairBatch],
    objective: Objective,
) -> PreferenceStep {
    preference_forward_backward(
        model,
        reference,
        batches,
        objective,
        &StepOptions::default(),
    )
    .unwrap()
}

/// Every adapter gradient against TRL's `<prefix>.grad.*`: the worst absolute gap.
fn check_grads(model: &Llama, step: &PreferenceStep, reference: &Reference, prefix: &str) -> f32 {
    let adapters = model.lora_adapters();
    assert_eq!(
        2 * adapters.len(),
        reference
            .names_with_prefix(&format!("{prefix}.grad."))
            .len(),
        "one gradient per A and B"
    );
    let mut worst = 0f32;
    for (path, _, adapter) in &adapters {
        for (name, param) in [("lora_A", &adapter.lora_a), ("lora_B", &adapter.lora_b)] {
            let key = format!("{PEFT_PREFIX}{path}.{name}.weight");
            let got = step
                .grads
                .get(param.id)
                .unwrap_or_else(|| panic!("no gradient for {key}"));
            worst = worst.max(assert_close(
                &format!("{prefix}: grad {key}"),
                &to_f32_vec(got.clone()),
                &reference.f32(&format!("{prefix}.grad.{key}")).1,
                1e-5,
                1e-4,
            ));
        }
    }
    worst
}

/// napkin's metrics beside TRL's logged ones, each within `tolerance`.
fn check_metrics(what: &str, got: &PreferenceMetrics, want: &Value, tolerance: f64) {
    let pairs = [
        ("rewards/chosen", got.rewards_chosen),
        ("rewards/rejected", got.rewards_rejected),
        ("rewards/accuracies", got.rewards_accuracy),
        ("rewards/margins", got.rewards_margin),
        ("logps/chosen", got.logps_chosen),
        ("logps/rejected", got.logps_rejected),
    ];
    for (name, value) in pairs {
        let expected = want[name]
            .as_f64()
            .unwrap_or_else(|| panic!("{what}: TRL logged no {name}"));
        assert!(
            (value - expected).abs() <= tolerance * expected.abs().max(1.0),
            "{what}: {name} {value} vs TRL's {expected}"
        );
    }
}

#[test]
fn napkin_tokenizes_the_pairs_as_trl_does() {
    let tokenizer = tokenizer_for_model(&corpus().join("hf"), None).unwrap();
    let pairs = read_pairs(&corpus().join("pairs.jsonl")).unwrap();
    let tokens: Vec<PairTokens> = pairs
        .iter()
        .map(|p| p.tokenize(None, &tokenizer).unwrap())
        .collect();
    assert_eq!(tokens, trl_pairs());
}

#[test]
fn dpo_matches_trl_loss_metrics_and_gradients() {
    let reference = Reference::open_file(&corpus().join("reference.safetensors"));
    let model = policy();
    let base = model.without_adapters().valid();
    let batch = PairBatch::new(&trl_pairs(), 128);
    let beta = summary()["beta"].as_f64().unwrap();
    let result = step(
        &model,
        Some(&base),
        std::slice::from_ref(&batch),
        Objective::Dpo { beta },
    );
    let want = f64::from(reference.scalar("dpo.loss"));
    let gap = (result.metrics.loss - want).abs();
    assert!(
        gap <= 1e-6,
        "DPO loss {} vs TRL's {want}",
        result.metrics.loss
    );
    check_metrics("DPO", &result.metrics, &summary()["metrics"]["dpo"], 1e-5);
    let worst = check_grads(&model, &result, &reference, "dpo");
    eprintln!(
        "DPO on 8 pairs: loss {:.7} (TRL {want:.7}, gap {gap:.1e}), reward accuracy {}, \
         worst LoRA gradient gap {worst:.1e}",
        result.metrics.loss, result.metrics.rewards_accuracy
    );

    // Invariants: two micro-batches of 3 and 5 pairs, and checkpointing, change nothing.
    let pairs = trl_pairs();
    let split = [
        PairBatch::new(&pairs[..3], 128),
        PairBatch::new(&pairs[3..], 128),
    ];
    let accumulated = step(&model, Some(&base), &split, Objective::Dpo { beta });
    let checkpointed = preference_forward_backward(
        &model,
        Some(&base),
        std::slice::from_ref(&batch),
        Objective::Dpo { beta },
        &StepOptions::default().with_checkpointing(true),
    )
    .unwrap();
    // The chunked loss: the policy's and the reference's logits 7 rows at a time.
    let chunked = preference_forward_backward(
        &model,
        Some(&base),
        std::slice::from_ref(&batch),
        Objective::Dpo { beta },
        &StepOptions::default().with_loss_chunk_rows(Some(7)),
    )
    .unwrap();
    for chunk in [None, Some(7)] {
        let held = preference_metrics(
            &model.valid(),
            Some(&base),
            std::slice::from_ref(&batch),
            Objective::Dpo { beta },
            chunk,
        )
        .unwrap();
        assert!(
            (held.loss - result.metrics.loss).abs() <= 1e-6
                && (held.rewards_margin - result.metrics.rewards_margin).abs() <= 1e-6,
            "held-out metrics, chunks {chunk:?}: {held:?} against {:?}",
            result.metrics
        );
    }
    for (what, other) in [
        ("3 + 5 pairs", &accumulated),
        ("checkpointed", &checkpointed),
        ("chunked loss, 7 rows", &chunked),
    ] {
        assert!(
            (other.metrics.loss - result.metrics.loss).abs() <= 1e-6,
            "{what}: loss"
        );
        let mut worst = 0f32;
        for (_, _, adapter) in model.lora_adapters() {
            for param in [&adapter.lora_a, &adapter.lora_b] {
                let a = to_f32_vec(other.grads.get(param.id).unwrap().clone());
                let b = to_f32_vec(result.grads.get(param.id).unwrap().clone());
                worst = worst.max(assert_close(what, &a, &b, 1e-6, 1e-5));
            }
        }
        eprintln!("DPO {what}: worst gradient gap to one batch {worst:.1e}");
    }

    // A reference equal to the policy (the adapter the run starts from): every log ratio is 0.
    let same = step(
        &model,
        Some(&model.valid()),
        std::slice::from_ref(&batch),
        Objective::Dpo { beta },
    );
    assert!(
        (same.metrics.loss - std::f64::consts::LN_2).abs() <= 1e-6,
        "{}",
        same.metrics.loss
    );
    assert!(same.metrics.rewards_margin.abs() <= 1e-6);
}

#[test]
fn orpo_matches_trl_loss_metrics_and_gradients() {
    let reference = Reference::open_file(&corpus().join("reference.safetensors"));
    let model = policy();
    let batch = PairBatch::new(&trl_pairs(), 128);
    let lambda = summary()["beta"].as_f64().unwrap();
    let result = step(
        &model,
        None,
        std::slice::from_ref(&batch),
        Objective::Orpo { lambda },
    );
    let want = f64::from(reference.scalar("orpo.loss"));
    let gap = (result.metrics.loss - want).abs();
    assert!(
        gap <= 1e-5,
        "ORPO loss {} vs TRL's {want}",
        result.metrics.loss
    );
    let nll = f64::from(reference.scalar("orpo.nll"));
    assert!(
        (result.metrics.nll - nll).abs() <= 1e-5,
        "NLL {} vs {nll}",
        result.metrics.nll
    );
    let trl = &summary()["metrics"]["orpo"];
    check_metrics("ORPO", &result.metrics, trl, 1e-5);
    for (name, value) in [
        ("log_odds_ratio", result.metrics.log_odds_ratio),
        ("log_odds_chosen", result.metrics.log_odds_chosen),
    ] {
        let expected = trl[name].as_f64().unwrap();
        assert!(
            (value - expected).abs() <= 1e-5,
            "{name} {value} vs {expected}"
        );
    }
    let worst = check_grads(&model, &result, &reference, "orpo");
    eprintln!(
        "ORPO on 8 pairs: loss {:.7} (TRL {want:.7}, gap {gap:.1e}), NLL {:.5}, \
         worst LoRA gradient gap {worst:.1e}",
        result.metrics.loss, result.metrics.nll
    );
    // The chunked loss (5 logits rows at a time) against TRL too.
    let chunked = preference_forward_backward(
        &model,
        None,
        std::slice::from_ref(&batch),
        Objective::Orpo { lambda },
        &StepOptions::default().with_loss_chunk_rows(Some(5)),
    )
    .unwrap();
    assert!(
        (chunked.metrics.loss - want).abs() <= 1e-5,
        "chunked ORPO loss {} vs TRL's {want}",
        chunked.metrics.loss
    );
    check_metrics("ORPO chunked", &chunked.metrics, trl, 1e-5);
    let worst = check_grads(&model, &chunked, &reference, "orpo");
    eprintln!("ORPO chunked 5 rows: worst LoRA gradient gap to TRL {worst:.1e}");
}
