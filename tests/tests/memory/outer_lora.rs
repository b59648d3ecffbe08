//! LoRA on the token embedding and the LM head against the predictor: the step peak above the
//! resident model, the gradients and the kept activations, as `dora.rs` measures them. An
//! embedding adapter makes the first block's input need a gradient (the blocks keep more); a
//! head adapter keeps the head's input and, as measured, holds its `[B·T, V]` product beside the
//! base's before they are added: the step's peak then (`forward.lm_head.lora`). With
//! checkpointing the head's input (the last block's output) is alive from the head's forward to
//! its backward (`head.checkpoint_input`).
//!
//! The fit cases are the small config's, r 8 on q, v with the embedding, the head or both,
//! checkpointing on and off: the rules were written on them. The held-out cases were chosen on
//! 2026-12-07 before they ran. The first of them, an adapter on the head alone (no block
//! linear adapted), failed: 2.49× the prediction, because the checkpointed step recomputed
//! blocks that train nothing. The engine now runs such a step plainly (`train/step.rs`,
//! `below_head_trains`) and the predictor follows (`Scenario::checkpoints_blocks`), but the
//! case still measures 1.66× its prediction: with nothing below the head trained, the step's
//! peak is set by transients the predictor does not replay (the untracked blocks' forward and
//! the head's, growing with T: 1.09–1.10× on the small config, 1.5–2.2× on tiny-mha). It is a
//! known gap, held apart below (`an_adapter_on_the_head_alone_is_a_known_gap`) so that a change
//! either way shows. The third held-out case first asked for DoRA with the embedding adapter,
//! which napkin refuses (DoRA on `embed_tokens`); it runs DoRA on q, v and the head instead, a
//! change made before it produced a figure.

use super::lora_case::{Case, check_within_5_percent, measure};
use super::*;
use napkin_core::config::{AttentionKind, LoraTarget};

fn cases() -> Vec<Case> {
    use LoraTarget::*;
    let mut out = Vec::new();
    for (embedding, head) in [(true, false), (false, true), (true, true)] {
        for checkpointing in [false, true] {
            out.push(Case {
                label: format!("small r8 q,v embed={embedding} head={head} ckpt={checkpointing}"),
                config: LlamaConfig::small(),
                lora: LoraConfig {
                    r: 8,
                    targets: vec![QProj, VProj],
                    embedding,
                    head,
                    ..LoraConfig::default()
                },
                nf4: None,
                batch: 1,
                seq: 64,
                checkpointing,
                accumulation: 1,
                attention: AttentionKind::Eager,
                held_out: false,
            });
        }
    }
    out.extend([
        Case {
            label: "small r4 embed + all linears, efficient, T=128 accum 2".into(),
            config: LlamaConfig::small(),
            lora: LoraConfig {
                r: 4,
                embedding: true,
                ..LoraConfig::default()
            },
            nf4: None,
            batch: 1,
            seq: 128,
            checkpointing: false,
            accumulation: 2,
            attention: AttentionKind::Efficient,
            held_out: true,
        },
        Case {
            label: "small DoRA r8 q,v + head, B=3 T=32".into(),
            config: LlamaConfig::small(),
            lora: LoraConfig {
                r: 8,
                targets: vec![QProj, VProj],
                use_dora: true,
                head: true,
                ..LoraConfig::default()
            },
            nf4: None,
            batch: 3,
            seq: 32,
            checkpointing: false,
            accumulation: 1,
            attention: AttentionKind::Eager,
            held_out: true,
        },
    ]);
    out
}

#[test]
fn embedding_and_head_adapters_step_memory_is_within_5_percent() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    check_within_5_percent(&cases());
}

/// The held-out case that failed (see the module's note): its gradients are predicted; its
/// step peak is 1.66× the prediction and its kept activations 1.89×, gaps held within bands
/// (1.5–1.8, 1.7–2.1) so that closing them, or widening them, fails here.
#[test]
fn an_adapter_on_the_head_alone_is_a_known_gap() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let case = Case {
        label: "tiny-mha QLoRA r16 head only, dropout, ckpt B=2 T=48".into(),
        config: LlamaConfig::tiny_mha(),
        lora: LoraConfig {
            r: 16,
            dropout: 0.1,
            targets: vec![],
            head: true,
            ..LoraConfig::default()
        },
        nf4: Some(Nf4Config::default()),
        batch: 2,
        seq: 48,
        checkpointing: true,
        accumulation: 1,
        attention: AttentionKind::Eager,
        held_out: true,
    };
    for (what, measured, predicted) in measure(&case) {
        let ratio = measured / predicted;
        eprintln!(
            "{} {what}: measured {measured} predicted {predicted} ratio {ratio:.4}",
            case.label
        );
        let band = match what {
            "step peak" => 1.5..=1.8,
            "kept activations" => 1.7..=2.1,
            _ => 0.95..=1.05,
        };
        assert!(
            band.contains(&ratio),
            "{} {what}: ratio {ratio}",
            case.label
        );
    }
}
