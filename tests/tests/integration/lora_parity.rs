//! LoRA against peft on every fixture model: logits, loss and every adapter gradient; merge by
//! value (α ≠ r, B ≠ 0) equals the unmerged model; the peft format round-trips bit for bit; QLoRA
//! equals float LoRA on the dequantized base.

use std::path::Path;

use napkin_core::config::{LlamaConfig, Nf4Config};
use napkin_core::device::DeviceKind;
use napkin_core::io::SafetensorsCheckpoint;
use napkin_core::io::load_hf_llama;
use napkin_core::io::peft::PEFT_PREFIX;
use napkin_core::kernels::values::{scalar, to_f32_vec};
use napkin_core::model::linear::BaseWeight;
use napkin_core::model::{Llama, causal_lm_loss};
use napkin_tests::{Reference, assert_close, input_batch, max_errors, model_dirs};

fn lora_model(dir: &Path, autodiff: bool) -> Llama {
    let device = DeviceKind::Cpu.open().unwrap();
    let device = if autodiff { device.autodiff() } else { device };
    let base = load_hf_llama(dir, &device).unwrap();
    base.load_lora(&dir.join("lora")).unwrap().0
}

#[test]
fn lora_logits_and_loss_match_peft() {
    for dir in model_dirs() {
        let reference = Reference::open(&dir);
        let model = lora_model(&dir, false);
        let (batch, labels) = input_batch(&reference);
        let logits = model.forward(&batch);
        let loss = scalar(causal_lm_loss(logits.clone(), &labels).unwrap().mean());
        let worst = assert_close(
            &format!("{}: lora.logits", reference.name),
            &to_f32_vec(logits),
            &reference.f32("lora.logits").1,
            1e-5,
            0.0,
        );
        let want = reference.scalar("lora.loss");
        assert!(
            (loss - want).abs() <= 1e-5,
            "{}: lora loss {loss} vs {want}",
            reference.name
        );
        eprintln!("{}: max |lora logits − peft| = {worst:.2e}", reference.name);
    }
}

#[test]
fn lora_gradients_match_peft_and_the_base_gets_none() {
    for dir in model_dirs() {
        let reference = Reference::open(&dir);
        let model = lora_model(&dir, true);
        let (batch, labels) = input_batch(&reference);
        let grads = causal_lm_loss(model.forward(&batch), &labels)
            .unwrap()
            .mean()
            .backward();

        let expected = reference.names_with_prefix("lora.grad.");
        let adapters = model.lora_adapters();
        assert_eq!(
            2 * adapters.len(),
            expected.len(),
            "{}: one gradient per A and B",
            reference.name
        );
        let mut worst = 0.0f32;
        for (path, _, adapter) in &adapters {
            for (name, param) in [("lora_A", &adapter.lora_a), ("lora_B", &adapter.lora_b)] {
                let key = format!("{PEFT_PREFIX}{path}.{name}.weight");
                let grad = param
                    .val()
                    .grad(&grads)
                    .unwrap_or_else(|| panic!("no gradient for {key}"));
                let what = format!("{}: grad {key}", reference.name);
                worst = worst.max(assert_close(
                    &what,
                    &to_f32_vec(grad),
                    &reference.f32(&format!("lora.grad.{key}")).1,
                    1e-5,
                    1e-4,
                ));
            }
        }
        // Memory truth: the frozen base has no gradient at all, not even a zero one.
        for (name, param) in model.hf_parameters() {
            assert!(
                param.grad(&grads).is_none(),
                "{}: frozen {name} got a gradient",
                reference.name
            );
        }
        eprintln!(
            "{}: {} adapter gradients, max |grad − peft| = {worst:.2e}",
            reference.name,
            expected.len()
        );
    }
}

#[test]
fn merged_equals_unmerged_by_value_and_unmerge_restores_the_base() {
    for dir in model_dirs() {
        let reference = Reference::open(&dir);
        let (batch, _) = input_batch(&reference);
        let model = lora_model(&dir, false);
        let adapted = to_f32_vec(model.forward(&batch));
        let (merged, adapters) = model.merge_lora();
        assert!(merged.lora_adapters().is_empty());
        let (abs, _) = max_errors(&to_f32_vec(merged.forward(&batch)), &adapted);
        assert!(
            abs <= 1e-5,
            "{}: merged vs unmerged logits differ by {abs}",
            reference.name
        );

        let restored = merged.unmerge_lora(adapters).unwrap();
        let base = load_hf_llama(&dir, &DeviceKind::Cpu.open().unwrap()).unwrap();
        for ((name, got), (_, want)) in restored.hf_parameters().iter().zip(base.hf_parameters()) {
            let (abs, _) = max_errors(&got.to_vec(), &want.to_vec());
            assert!(
                abs <= 1e-6,
                "{}: {name} after unmerge differs by {abs}",
                reference.name
            );
        }
        let (abs, _) = max_errors(&to_f32_vec(restored.forward(&batch)), &adapted);
        assert!(
            abs <= 1e-5,
            "{}: unmerged logits differ by {abs}",
            reference.name
        );
    }
}

#[test]
fn peft_round_trip_is_bit_identical() {
    for dir in model_dirs() {
        let model = load_hf_llama(&dir, &DeviceKind::Cpu.open().unwrap()).unwrap();
        let (model, config) = model.load_lora(&dir.join("lora")).unwrap();
        let out = std::env::temp_dir().join(format!(
            "napkin-peft-{}-{}",
            std::process::id(),
            dir.display().to_string().len()
        ));
        model.save_lora(&config, &out).unwrap();

        let original =
            SafetensorsCheckpoint::open(&dir.join("lora/adapter_model.safetensors")).unwrap();
        let written = SafetensorsCheckpoint::open(&out.join("adapter_model.safetensors")).unwrap();
        let names: Vec<&str> = original.names().collect();
        assert_eq!(names, written.names().collect::<Vec<_>>());
        for name in names {
            assert_eq!(
                original.read_raw(name).unwrap(),
                written.read_raw(name).unwrap(),
                "{name}"
            );
        }
        let reread = napkin_core::io::peft::read_adapter_config(&out).unwrap();
        assert_eq!(reread, config);
        std::fs::remove_dir_all(&out).unwrap();
    }
}

#[test]
fn trainable_parameter_counts_are_exact() {
    for dir in model_dirs() {
        let reference = Reference::open(&dir);
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
                .unwrap();
        let want = json["lora"]["trainable_params"]
            .as_u64()
            .expect("trainable_params");
        let (model, config) = lora_model(&dir, false)
            .load_lora(&dir.join("lora"))
            .unwrap();
        let llama = LlamaConfig::from_hf_file(&dir.join("config.json")).unwrap();
        assert_eq!(
            model.trainable_parameters(),
            want,
            "{}: counted on the model",
            reference.name
        );
        assert_eq!(
            config.trainable_parameters(&llama),
            want,
            "{}: napkin arithmetic",
            reference.name
        );
    }
}

#[test]
fn qlora_equals_float_lora_on_the_dequantized_base() {
    for dir in model_dirs() {
        let reference = Reference::open(&dir);
        let (batch, labels) = input_batch(&reference);
        for double_quant in [false, true] {
            let nf4 = Nf4Config {
                block_size: 64,
                double_quant,
            };
            let device = DeviceKind::Cpu.open().unwrap().autodiff();
            let quantized = load_hf_llama(&dir, &device)
                .unwrap()
                .quantize_nf4(&nf4)
                .unwrap();
            // The float twin: same weights, dequantized once, as a dense frozen base.
            let mut dequantized = load_hf_llama(&dir, &device).unwrap();
            for (q, d) in quantized
                .block_linears()
                .iter()
                .zip(dequantized.block_linears_mut())
            {
                assert!(q.linear.is_nf4());
                d.linear.base = BaseWeight::Dense(burn::module::Param::from_tensor(
                    q.linear.dense_weight(&device),
                ));
            }
            let (qlora, _) = quantized.load_lora(&dir.join("lora")).unwrap();
            let (flora, _) = dequantized.load_lora(&dir.join("lora")).unwrap();

            let q_loss = causal_lm_loss(qlora.forward(&batch), &labels)
                .unwrap()
                .mean();
            let f_loss = causal_lm_loss(flora.forward(&batch), &labels)
                .unwrap()
                .mean();
            let (ql, fl) = (scalar(q_loss.clone()), scalar(f_loss.clone()));
            assert!(
                (ql - fl).abs() <= 1e-5,
                "{} dq={double_quant}: loss {ql} vs {fl}",
                reference.name
            );
            let (qg, fg) = (q_loss.backward(), f_loss.backward());
            for ((path, _, qa), (_, _, fa)) in
                qlora.lora_adapters().iter().zip(flora.lora_adapters())
            {
                for (qp, fp) in [(&qa.lora_a, &fa.lora_a), (&qa.lora_b, &fa.lora_b)] {
                    let q = to_f32_vec(qp.val().grad(&qg).expect("qlora grad"));
                    let f = to_f32_vec(fp.val().grad(&fg).expect("lora grad"));
                    assert_close(
                        &format!("{} dq={double_quant}: {path}", reference.name),
                        &q,
                        &f,
                        1e-5,
                        1e-4,
                    );
                }
            }
        }
    }
}

#[test]
fn one_adamw_step_matches_torch_parameters_and_moments() {
    use napkin_core::train::{AdamW, AdamWConfig, ParamGrads};
    for dir in model_dirs() {
        let reference = Reference::open(&dir);
        let model = lora_model(&dir, true);
        let (batch, labels) = input_batch(&reference);
        // Step on exactly torch's gradients: Adam's first step is ≈ lr·sign(g), so where |g| is
        // near ε a 1e-7 difference in g would move the update; the gradients have their own test.
        let mut grads = ParamGrads::new();
        for (path, _, adapter) in model.lora_adapters() {
            for (name, param) in [("lora_A", &adapter.lora_a), ("lora_B", &adapter.lora_b)] {
                let (_, values) =
                    reference.f32(&format!("lora.grad.{PEFT_PREFIX}{path}.{name}.weight"));
                let device = param.val().device().inner();
                let n = values.len();
                let g = burn::tensor::Tensor::<1>::from_data(
                    burn::tensor::TensorData::new(values, [n]),
                    &device,
                );
                grads.insert(param.id, g);
            }
        }
        // The fixture's step: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.01.
        let mut adamw = AdamW::new(AdamWConfig {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        });
        let model = adamw.step(model, &grads, 1e-3);

        for (path, _, adapter) in model.lora_adapters() {
            for (name, param) in [("lora_A", &adapter.lora_a), ("lora_B", &adapter.lora_b)] {
                let key = format!("{PEFT_PREFIX}{path}.{name}.weight");
                let what = |t: &str| format!("{}: {t} {key}", reference.name);
                let moments = adamw
                    .moments(param.id)
                    .unwrap_or_else(|| panic!("no state for {key}"));
                assert_close(
                    &what("param"),
                    &to_f32_vec(param.val()),
                    &reference.f32(&format!("lora.adamw1.param.{key}")).1,
                    1e-7,
                    1e-6,
                );
                assert_close(
                    &what("exp_avg"),
                    &to_f32_vec(moments.exp_avg.clone()),
                    &reference.f32(&format!("lora.adamw1.exp_avg.{key}")).1,
                    1e-6,
                    1e-4,
                );
                assert_close(
                    &what("exp_avg_sq"),
                    &to_f32_vec(moments.exp_avg_sq.clone()),
                    &reference.f32(&format!("lora.adamw1.exp_avg_sq.{key}")).1,
                    1e-9,
                    1e-4,
                );
            }
        }
        let loss_after = scalar(
            causal_lm_loss(model.forward(&batch), &labels)
                .unwrap()
                .mean(),
        );
        let want = reference.scalar("lora.adamw1.loss_after");
        assert!(
            (loss_after - want).abs() <= 1e-5,
            "{}: loss after the step {loss_after} vs {want}",
            reference.name
        );
        // State only for the adapters: two f32 moments per trainable value.
        assert_eq!(
            adamw.state_bytes(),
            8 * model.trainable_parameters(),
            "{}",
            reference.name
        );
    }
}
