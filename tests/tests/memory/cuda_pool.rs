//! The predictor against device-pool bytes recorded on CUDA (`napkin measure --device cuda`,
//! kept in `tests/corpus/cuda_device_pool/measured.json`), with CUDA's pitched rows
//! (`predict/row_layout.rs`). Runs here without a GPU: the numbers are the device's.
//!
//! Parameters, gradients, optimizer state, the activations each block but the first keeps (one
//! forward with its graph, to the byte) and the whole forward's are compared. The cases marked `fitted` are the ones the
//! row model was worked out on (SmolLM2's 576-wide rows: the padding itself, then the copy
//! every linear's `[B, T, in] → [B·T, in]` reshape makes of a padded tensor); the others were
//! measured after the model was written and are held out.

use napkin_core::config::{AttentionKind, Kernels, LoraTarget, OptimizerKind};
use napkin_core::predict::inventory::kept_by_layer;
use napkin_core::predict::row_layout::RowLayout;
use serde_json::Value;

use super::*;

/// Parameters and gradients: their values' bytes and the allocations' rounding.
const STATE_TOLERANCE: f64 = 0.002;
/// The optimizer state is measured as the pool's growth over the first update, which also
/// replaces every trained parameter (new buffers, the old ones freed into the pool): a few
/// percent either way.
const OPTIMIZER_TOLERANCE: f64 = 0.06;
/// The whole forward (head, logits and loss included): within 1.5 KB of 0.14–4.1 GB recorded.
const FORWARD_TOLERANCE: f64 = 0.001;

fn recorded() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/corpus/cuda_device_pool/measured.json"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The scenario `napkin measure` ran, with CUDA's element-wise ops and rows.
fn scenario(case: &Value) -> Scenario {
    let s = &case["scenario"];
    let text = |k: &str| s[k].as_str().unwrap_or_else(|| panic!("{k}"));
    let number = |k: &str| s[k].as_u64().unwrap_or_else(|| panic!("{k}")) as usize;
    let flag = |k: &str| s[k].as_bool().unwrap_or_else(|| panic!("{k}"));
    let config = LlamaConfig::preset(text("preset")).unwrap();
    let r = number("lora_r");
    let lora = (r > 0).then(|| LoraConfig {
        r,
        alpha: 2.0 * r as f64,
        targets: LoraTarget::parse_list(text("lora_targets")).unwrap(),
        ..LoraConfig::default()
    });
    Scenario {
        lora,
        nf4: flag("nf4").then_some(Nf4Config {
            block_size: 64,
            double_quant: flag("double_quant"),
        }),
        optimizer: text("optimizer").parse::<OptimizerKind>().unwrap(),
        checkpointing: flag("checkpointing"),
        attention: text("attention").parse::<AttentionKind>().unwrap(),
        half_compute: text("dtype") != "f32",
        kernels: Kernels::BurnOps,
        rows: RowLayout::CUDA,
        ..Scenario::new(config, number("micro_batch"), number("seq_len"))
    }
}

fn within(what: &str, predicted: u64, measured: u64, tolerance: f64, failures: &mut Vec<String>) {
    let ratio = measured as f64 / predicted as f64;
    let line = format!("{what}: predicted {predicted}, measured {measured}, ratio {ratio:.4}");
    println!("{line}");
    if (ratio - 1.0).abs() > tolerance {
        failures.push(line);
    }
}

#[test]
fn the_prediction_with_pitched_rows_matches_the_bytes_cuda_held() {
    // No tensors here, but its allocations would show in another test's counted peak.
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let recorded = recorded();
    let cases = recorded["cases"].as_array().expect("cases");
    assert!(
        cases.iter().any(|c| c["fitted"] == false),
        "no held-out case"
    );
    let mut failures = Vec::new();
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let s = scenario(case);
        let entries = inventory(&s);
        let kinds = totals_by_kind(&entries);
        let kind = |k: Kind| kinds.get(&k).copied().unwrap_or(0);
        let measured = &case["measured"];
        let m = |k: &str| {
            measured[k]
                .as_u64()
                .unwrap_or_else(|| panic!("{name}: {k}"))
        };
        let parameters = kind(Kind::Weights)
            + kind(Kind::QuantCodes)
            + kind(Kind::QuantScales)
            + kind(Kind::Adapters);
        let label = |what: &str| format!("{name} ({}): {what}", case["args"].as_str().unwrap());
        within(
            &label("parameters"),
            parameters,
            m("parameters"),
            STATE_TOLERANCE,
            &mut failures,
        );
        within(
            &label("gradients"),
            kind(Kind::Gradients),
            m("gradients"),
            STATE_TOLERANCE,
            &mut failures,
        );
        within(
            &label("optimizer state"),
            kind(Kind::OptimizerState),
            m("optimizer_state"),
            OPTIMIZER_TOLERANCE,
            &mut failures,
        );
        let kept = kept_by_layer(&entries);
        let layers = measured["layers"].as_array().unwrap();
        // What every block but the first keeps (one forward with its graph), to the byte: the
        // replay follows where the split into heads copies (B = 1) and where RoPE writes into
        // the padded projection (B > 1); before that the SmolLM2 blocks were 256 B a token off
        // (0.2 %), high at B = 1 and low at B > 1. Block 0 is not compared: measured as the
        // pool's growth over the block, it also loses the embedding's output, which only block
        // 0 frees (under LoRA nothing keeps it).
        for (l, measured) in layers.iter().enumerate().skip(1) {
            let measured = measured.as_u64().unwrap();
            if kept[&Some(l)] != measured {
                failures.push(format!(
                    "{}: predicted {}, measured {measured} (to the byte)",
                    label(&format!("layers.{l}")),
                    kept[&Some(l)]
                ));
            }
        }
        within(
            &label("the whole forward"),
            kind(Kind::SavedActivations) + kind(Kind::Logits),
            m("forward"),
            FORWARD_TOLERANCE,
            &mut failures,
        );
    }
    assert!(
        failures.is_empty(),
        "off by more than the tolerance:\n{}",
        failures.join("\n")
    );
}
