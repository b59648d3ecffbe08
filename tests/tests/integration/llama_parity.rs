//! The burn Llama against Hugging Face transformers on every fixture model: RoPE tables,
//! logits, loss, every hidden state and layer-0 intermediate, and the full gradients.
//!
//! Tolerances are those of `shared/fixtures/README.md` (f32: ~1e-5 on logits, 1e-5 on the
//! loss, gradients 1e-5 abs or 1e-4 relative). Both attentions (eager and the tiled,
//! memory-efficient one) must reach them.

use napkin_core::config::{AttentionKind, LlamaConfig};
use napkin_core::device::DeviceKind;
use napkin_core::io::load_hf_llama;
use napkin_core::kernels::values::{scalar, to_f32_vec};
use napkin_core::model::rope::{inverse_frequencies, tables};
use napkin_core::model::{Llama, causal_lm_loss};
use napkin_tests::{Reference, assert_close, input_batch, model_dirs};

#[test]
fn rope_tables_match_transformers() {
    for dir in model_dirs() {
        let reference = Reference::open(&dir);
        let config = LlamaConfig::from_hf_file(&dir.join("config.json")).unwrap();
        let (shape, want_cos) = reference.f32("rope.cos");
        let (_, want_sin) = reference.f32("rope.sin");
        let positions: Vec<u32> = (0..shape[0] as u32).collect();
        let (cos, sin) = tables(&inverse_frequencies(&config), &positions);
        assert_close(
            &format!("{}: rope.cos", reference.name),
            &cos,
            &want_cos,
            1e-6,
            0.0,
        );
        assert_close(
            &format!("{}: rope.sin", reference.name),
            &sin,
            &want_sin,
            1e-6,
            0.0,
        );
    }
}

/// Every (fixture model, CPU backend, attention): each backend must reach HF parity on its
/// own, with either attention.
fn cases() -> Vec<(std::path::PathBuf, DeviceKind, AttentionKind)> {
    let backends = DeviceKind::cpu_backends();
    assert!(!backends.is_empty(), "no CPU backend compiled in");
    let mut cases = Vec::new();
    for dir in model_dirs() {
        for &kind in &backends {
            for attention in [AttentionKind::Eager, AttentionKind::Efficient] {
                cases.push((dir.clone(), kind, attention));
            }
        }
    }
    cases
}

/// A fixture model on a device, with the given attention.
fn load(dir: &std::path::Path, device: &burn::tensor::Device, attention: AttentionKind) -> Llama {
    let mut model = load_hf_llama(dir, device).unwrap();
    model.attention = attention;
    model
}

#[test]
fn logits_and_loss_match_transformers() {
    for (dir, kind, attention) in cases() {
        let reference = Reference::open(&dir);
        let model = load(&dir, &kind.open().unwrap(), attention);
        let (batch, labels) = input_batch(&reference);
        let logits = model.forward(&batch);
        let loss = scalar(causal_lm_loss(logits.clone(), &labels).unwrap().mean());
        let logits = to_f32_vec(logits);

        let worst = assert_close(
            &format!("{}: logits", reference.name),
            &logits,
            &reference.f32("logits").1,
            1e-5,
            0.0,
        );
        // The float64 oracle is tighter still: it removes the reference's own f32 rounding.
        let logits_f64: Vec<f32> = reference
            .f64("logits_f64")
            .iter()
            .map(|&v| v as f32)
            .collect();
        let worst_f64 = assert_close(
            &format!("{}: logits vs f64", reference.name),
            &logits,
            &logits_f64,
            1e-5,
            0.0,
        );
        let want_loss = reference.scalar("loss");
        assert!(
            (loss - want_loss).abs() <= 1e-5,
            "{}: loss {loss} vs {want_loss}",
            reference.name
        );
        eprintln!(
            "{} on {kind}, {attention} attention: max |logits − HF| = {worst:.2e} (f64 oracle {worst_f64:.2e}), loss {loss} vs {want_loss}",
            reference.name
        );
    }
}

#[test]
fn hidden_states_and_layer0_intermediates_match_transformers() {
    for (dir, kind, attention) in cases() {
        let reference = Reference::open(&dir);
        let model = load(&dir, &kind.open().unwrap(), attention);
        let (batch, _) = input_batch(&reference);
        let ctx = model.context(&batch);
        let name = |what: &str| {
            format!(
                "{} on {kind}, {attention} attention: {what}",
                reference.name
            )
        };
        let check = |what: &str, got: Vec<f32>| {
            assert_close(&name(what), &got, &reference.f32(what).1, 2e-5, 1e-4);
        };

        let mut x = model.embed(&batch);
        check("hidden.embed", to_f32_vec(x.clone()));

        // Layer 0, step by step, in the order of the math.
        let block = &model.layers[0];
        let normed = block.input_layernorm.forward(x.clone());
        check("layer0.input_layernorm.out", to_f32_vec(normed.clone()));
        check(
            "layer0.self_attn.q_proj.out",
            to_f32_vec(block.self_attn.q_proj.forward(normed.clone())),
        );
        check(
            "layer0.self_attn.k_proj.out",
            to_f32_vec(block.self_attn.k_proj.forward(normed.clone())),
        );
        check(
            "layer0.self_attn.v_proj.out",
            to_f32_vec(block.self_attn.v_proj.forward(normed.clone())),
        );
        let attn = block.self_attn.forward(normed, &ctx.rope, &ctx.mask);
        check("layer0.self_attn.out", to_f32_vec(attn.clone()));
        let mid = x.clone() + attn;
        let normed2 = block.post_attention_layernorm.forward(mid);
        check(
            "layer0.post_attention_layernorm.out",
            to_f32_vec(normed2.clone()),
        );
        check("layer0.mlp.out", to_f32_vec(block.mlp.forward(normed2)));

        for (i, layer) in model.layers.iter().enumerate() {
            x = layer.forward(x, &ctx.rope, &ctx.mask);
            check(&format!("hidden.layers.{i}"), to_f32_vec(x.clone()));
        }
        check("hidden.final_norm", to_f32_vec(model.norm.forward(x)));
    }
}

#[test]
fn full_gradients_match_transformers() {
    for (dir, kind, attention) in cases() {
        let reference = Reference::open(&dir);
        let model = load(&dir, &kind.open().unwrap().autodiff(), attention);
        let (batch, labels) = input_batch(&reference);
        let loss = causal_lm_loss(model.forward(&batch), &labels)
            .unwrap()
            .mean();
        let grads = loss.backward();

        let params = model.hf_parameters();
        let expected = reference.names_with_prefix("full.grad.");
        assert_eq!(
            params.len(),
            expected.len(),
            "{}: one reference gradient per parameter",
            reference.name
        );
        let mut worst = 0.0f32;
        for (hf_name, param) in &params {
            let grad = param
                .grad(&grads)
                .unwrap_or_else(|| panic!("{}: no gradient for {hf_name}", reference.name))
                .to_vec();
            let (_, want) = reference.f32(&format!("full.grad.{hf_name}"));
            let what = format!(
                "{} on {kind}, {attention} attention: grad {hf_name}",
                reference.name
            );
            worst = worst.max(assert_close(&what, &grad, &want, 1e-5, 1e-4));
        }
        let n = params.len();
        eprintln!(
            "{} on {kind}, {attention} attention: {n} gradients, max |grad − HF| = {worst:.2e}",
            reference.name
        );
    }
}
