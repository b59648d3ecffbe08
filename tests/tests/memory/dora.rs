//! DoRA's memory against the predictor: the step peak above the resident model, the
//! gradients held after it and the activations a plain forward keeps, measured by the counting
//! allocator beside the inventory of the same scenario (`LoraConfig::use_dora`: a trainable
//! magnitude per adapted linear, its gradient and AdamW state; per linear the kept `[n, out]`
//! sum the magnitude's gradient reads, the norm and the factor; no weight-sized buffer, since
//! `model/lora.rs` takes the row norms from the base's kept squares and `A·Wᵀ`).
//!
//! The fit cases are the small config's, LoRA r 8 on every linear, NF4 and checkpointing on
//! and off: the rule was written and checked on them. The held-out cases (other shapes, ranks,
//! targets, dropout, accumulation, the efficient attention) were chosen on 2026-12-07 before
//! they ran.

use super::lora_case::{Case, check_within_5_percent};
use super::*;
use napkin_core::config::{AttentionKind, LoraTarget};

fn cases() -> Vec<Case> {
    let dora = |r: usize, targets: &[LoraTarget], dropout: f64| LoraConfig {
        r,
        alpha: 2.0 * r as f64,
        dropout,
        targets: targets.to_vec(),
        use_dora: true,
        ..LoraConfig::default()
    };
    let mut out = Vec::new();
    for nf4 in [None, Some(Nf4Config::default())] {
        for checkpointing in [false, true] {
            out.push(Case {
                label: match (nf4.is_some(), checkpointing) {
                    (false, false) => "small DoRA r8 all",
                    (false, true) => "small DoRA r8 all ckpt",
                    (true, false) => "small QDoRA r8 all",
                    (true, true) => "small QDoRA r8 all ckpt",
                }
                .into(),
                config: LlamaConfig::small(),
                lora: dora(8, &LoraTarget::ALL, 0.0),
                nf4,
                batch: 1,
                seq: 64,
                checkpointing,
                accumulation: 1,
                attention: AttentionKind::Eager,
                held_out: false,
            });
        }
    }
    use LoraTarget::*;
    out.extend([
        Case {
            label: "tiny-smol QDoRA(DQ) r16 q,v,down dropout ckpt B=2 T=48 accum 2".into(),
            config: LlamaConfig::tiny_smol(),
            lora: dora(16, &[QProj, VProj, DownProj], 0.1),
            nf4: Some(Nf4Config {
                block_size: 64,
                double_quant: true,
            }),
            batch: 2,
            seq: 48,
            checkpointing: true,
            accumulation: 2,
            attention: AttentionKind::Eager,
            held_out: true,
        },
        Case {
            label: "small DoRA r4 k,o,gate,up T=128".into(),
            config: LlamaConfig::small(),
            lora: dora(4, &[KProj, OProj, GateProj, UpProj], 0.0),
            nf4: None,
            batch: 1,
            seq: 128,
            checkpointing: false,
            accumulation: 1,
            attention: AttentionKind::Eager,
            held_out: true,
        },
        Case {
            label: "tiny-smol QDoRA r8 all efficient ckpt T=96".into(),
            config: LlamaConfig::tiny_smol(),
            lora: dora(8, &LoraTarget::ALL, 0.0),
            nf4: Some(Nf4Config::default()),
            batch: 1,
            seq: 96,
            checkpointing: true,
            accumulation: 1,
            attention: AttentionKind::Efficient,
            held_out: true,
        },
    ]);
    out
}

#[test]
fn dora_step_peak_gradients_and_kept_activations_are_within_5_percent() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    check_within_5_percent(&cases());
}
