//! The optimizers beyond AdamW's fixture parity: SGD with momentum against torch's recurrence,
//! 8-bit AdamW against 32-bit AdamW over 20 training steps, clipping by global norm, and
//! optimizer state surviving an export/import (what a resumed run relies on).

use burn::module::Param;
use burn::tensor::Tensor;
use napkin_core::config::LoraConfig;
use napkin_core::data::MicroBatch;
use napkin_core::device::DeviceKind;
use napkin_core::io::load_hf_llama;
use napkin_core::kernels::values::to_f32_vec;
use napkin_core::model::Llama;
use napkin_core::train::adamw8bit::AdamW8bit;
use napkin_core::train::{
    AdamWConfig, Optimizer, OptimizerConfig, OptimizerKind, ParamGrads, StepOptions,
    forward_backward, trainable_ids,
};
use napkin_tests::{Reference, input_batch, model_dir};

/// The tiny SmolLM2-shaped fixture with fresh LoRA adapters of rank `r` (seeded).
fn tiny_smol_with_lora(r: usize) -> (Llama, MicroBatch) {
    tiny_smol_with_lora_on(r, DeviceKind::Cpu)
}

/// [`tiny_smol_with_lora`] on the backend `kind`.
fn tiny_smol_with_lora_on(r: usize, kind: DeviceKind) -> (Llama, MicroBatch) {
    let dir = model_dir("tiny-smol");
    let device = kind.open().unwrap().autodiff();
    device.seed(11);
    let lora = LoraConfig {
        r,
        alpha: 2.0 * r as f64,
        ..LoraConfig::default()
    };
    let model = load_hf_llama(&dir, &device)
        .unwrap()
        .with_lora(&lora)
        .unwrap();
    let (batch, labels) = input_batch(&Reference::open(&dir));
    (model, MicroBatch { batch, labels })
}

fn step_grads(model: &Llama, batch: &MicroBatch) -> (ParamGrads, f32) {
    let step = forward_backward(model, std::slice::from_ref(batch), &StepOptions::default())
        .unwrap()
        .read();
    (step.grads, step.loss)
}

/// Every trainable parameter's values, in module order.
fn trainable_values(model: &Llama) -> Vec<Vec<f32>> {
    model
        .lora_adapters()
        .iter()
        .flat_map(|(_, _, a)| [&a.lora_a, &a.lora_b])
        .map(|p: &Param<Tensor<2>>| to_f32_vec(p.val()))
        .collect()
}

#[test]
fn sgd_with_momentum_follows_torchs_recurrence() {
    let (mut model, batch) = tiny_smol_with_lora(4);
    // One fixed gradient (taken once, after a first AdamW step makes B non-zero, so that every
    // adapter has a non-zero gradient), applied for three SGD steps.
    let (g, _) = step_grads(&model, &batch);
    model = Optimizer::new(&OptimizerConfig::default()).step(model, &g, 1e-2);
    let (grads, _) = step_grads(&model, &batch);
    let ids = trainable_ids(&model);
    let g: Vec<Vec<f64>> = ids
        .iter()
        .map(|(id, _)| {
            to_f32_vec(grads.get(*id).unwrap().clone())
                .into_iter()
                .map(f64::from)
                .collect()
        })
        .collect();
    let (lr, momentum, wd) = (0.05, 0.9, 0.01);
    let mut p: Vec<Vec<f64>> = trainable_values(&model)
        .into_iter()
        .map(|v| v.into_iter().map(f64::from).collect())
        .collect();
    let mut buffers: Vec<Option<Vec<f64>>> = vec![None; p.len()];

    let config = OptimizerConfig {
        kind: OptimizerKind::Sgd,
        momentum,
        adamw: AdamWConfig {
            weight_decay: wd,
            ..AdamWConfig::default()
        },
    };
    let mut sgd = Optimizer::new(&config);
    for _ in 0..3 {
        model = sgd.step(model, &grads, lr);
        for ((p, g), b) in p.iter_mut().zip(&g).zip(buffers.iter_mut()) {
            let d: Vec<f64> = p.iter().zip(g).map(|(p, g)| g + wd * p).collect();
            let next: Vec<f64> = match b.take() {
                None => d,
                Some(b) => b.iter().zip(&d).map(|(b, d)| momentum * b + d).collect(),
            };
            p.iter_mut().zip(&next).for_each(|(p, b)| *p -= lr * b);
            *b = Some(next);
        }
    }
    let got = trainable_values(&model);
    let worst = got
        .iter()
        .zip(&p)
        .flat_map(|(a, b)| a.iter().zip(b).map(|(a, b)| (f64::from(*a) - b).abs()))
        .fold(0.0, f64::max);
    assert!(
        worst < 1e-6,
        "SGD parameters differ from the f64 recurrence by {worst:e}"
    );
    assert_eq!(
        sgd.state_bytes(),
        4 * ids
            .iter()
            .map(|(_, s)| s.iter().product::<usize>() as u64)
            .sum::<u64>()
    );
}

#[test]
fn adamw_8bit_stays_close_to_adamw_over_20_steps() {
    // r = 32 makes most adapters ≥ 4096 values, so they take the 8-bit path.
    let (start, batch) = tiny_smol_with_lora(32);
    let run = |kind: OptimizerKind| {
        let mut model = start.clone();
        let mut optim = Optimizer::new(&OptimizerConfig {
            kind,
            ..OptimizerConfig::default()
        });
        let mut losses = Vec::new();
        for _ in 0..20 {
            let (grads, loss) = step_grads(&model, &batch);
            losses.push(loss);
            model = optim.step(model, &grads, 2e-3);
        }
        (losses, trainable_values(&model), optim.state_bytes())
    };
    let (loss32, p32, bytes32) = run(OptimizerKind::AdamW);
    let (loss8, p8, bytes8) = run(OptimizerKind::AdamW8bit);

    assert!(
        loss32[19] < loss32[0] - 0.5,
        "32-bit run learns: {loss32:?}"
    );
    let worst_loss = loss32
        .iter()
        .zip(&loss8)
        .map(|(a, b)| ((a - b) / a).abs())
        .fold(0.0f32, f32::max);
    // How far the parameters moved, and how far apart the two runs ended.
    let p0 = trainable_values(&start);
    let (mut moved, mut apart) = (0.0f64, 0.0f64);
    for ((a, b), c) in p32.iter().zip(&p8).zip(&p0) {
        for ((a, b), c) in a.iter().zip(b).zip(c) {
            moved += f64::from(a - c).powi(2);
            apart += f64::from(a - b).powi(2);
        }
    }
    let relative = (apart / moved).sqrt();
    eprintln!(
        "8-bit vs 32-bit AdamW, 20 steps: max relative loss gap {worst_loss:.2e}, \
         parameter updates differ by {relative:.3} of their size; state {bytes8} vs {bytes32} bytes"
    );
    assert!(
        worst_loss < 0.01,
        "loss curves diverge: {loss32:?} vs {loss8:?}"
    );
    assert!(relative < 0.05, "parameters diverge: {relative}");

    let ids = trainable_ids(&start);
    let predicted: u64 = ids
        .iter()
        .map(|(_, s)| AdamW8bit::predicted_bytes(s.iter().product()))
        .sum();
    assert_eq!(bytes8, predicted, "8-bit state bytes as predicted");
    assert!(
        (bytes8 as f64) < 0.3 * bytes32 as f64,
        "{bytes8} vs {bytes32}"
    );
}

#[test]
fn clipping_scales_the_global_norm_down_to_the_limit() {
    let (mut model, batch) = tiny_smol_with_lora(4);
    let (g, _) = step_grads(&model, &batch);
    model = Optimizer::new(&OptimizerConfig::default()).step(model, &g, 1e-2);
    let (mut grads, _) = step_grads(&model, &batch);
    let by_hand: f64 = trainable_ids(&model)
        .iter()
        .flat_map(|(id, _)| to_f32_vec(grads.get(*id).unwrap().clone()))
        .map(|g| f64::from(g).powi(2))
        .sum::<f64>()
        .sqrt();
    let norm = grads.global_norm();
    assert!((norm - by_hand).abs() <= 1e-6 * by_hand);
    let before = grads.clip_global_norm(norm / 4.0);
    assert_eq!(before, norm);
    let after = grads.global_norm();
    assert!(
        (after - norm / 4.0).abs() <= 1e-5 * norm,
        "{after} vs {}",
        norm / 4.0
    );
    // A limit above the norm leaves the gradients alone.
    grads.clip_global_norm(norm);
    assert!((grads.global_norm() - after).abs() <= 1e-9 * norm);
}

#[test]
fn optimizer_state_survives_export_and_import() {
    for kind in [
        OptimizerKind::AdamW,
        OptimizerKind::AdamW8bit,
        OptimizerKind::Sgd,
    ] {
        let (mut model, batch) = tiny_smol_with_lora(32);
        let config = OptimizerConfig {
            kind,
            ..OptimizerConfig::default()
        };
        let mut optim = Optimizer::new(&config);
        for _ in 0..2 {
            let (grads, _) = step_grads(&model, &batch);
            model = optim.step(model, &grads, 1e-3);
        }
        let ids = trainable_ids(&model);
        let state = optim.export_state(&ids);
        assert!(!state.is_empty());
        let mut restored = Optimizer::new(&config);
        restored
            .import_state(&ids, &model.device().inner(), &state, optim.steps())
            .unwrap();
        assert_eq!(restored.state_bytes(), optim.state_bytes());

        let (grads, _) = step_grads(&model, &batch);
        let continued = trainable_values(&optim.step(model.clone(), &grads, 1e-3));
        let resumed = trainable_values(&restored.step(model, &grads, 1e-3));
        assert_eq!(
            continued, resumed,
            "{kind:?}: a restored optimizer takes the same step"
        );
    }
}

/// Optimizer offload moves the state, not the arithmetic: with the model on burn Flex and the
/// state plus master weights on the other CPU backend (NdArray), three steps of each
/// optimizer give the parameters the plain optimizer gives, the state lives on the host
/// device, and the link carries exactly 4 bytes per trainable value each way per step (plus
/// the first step's master copies).
#[test]
fn offloaded_optimizer_steps_like_the_plain_one() {
    let (start, batch) = tiny_smol_with_lora_on(32, DeviceKind::Flex);
    let model_device = DeviceKind::Flex.open().unwrap();
    let host = DeviceKind::Ndarray.open().unwrap();
    let ids = trainable_ids(&start);
    let n: u64 = ids
        .iter()
        .map(|(_, s)| s.iter().product::<usize>() as u64)
        .sum();
    for kind in [
        OptimizerKind::AdamW,
        OptimizerKind::AdamW8bit,
        OptimizerKind::Sgd,
    ] {
        let config = OptimizerConfig {
            kind,
            ..OptimizerConfig::default()
        };
        let run = |mut optim: Optimizer| {
            let mut model = start.clone();
            for _ in 0..3 {
                let (grads, _) = step_grads(&model, &batch);
                model = optim.step(model, &grads, 2e-3);
            }
            (trainable_values(&model), optim)
        };
        let (plain, _) = run(Optimizer::new(&config));
        let (offloaded, optim) = run(Optimizer::offloaded(&config, host.clone()));
        let worst = plain
            .iter()
            .zip(&offloaded)
            .flat_map(|(a, b)| a.iter().zip(b).map(|(a, b)| (a - b).abs()))
            .fold(0.0f32, f32::max);
        assert!(
            worst <= 1e-6,
            "{kind:?}: offloaded parameters differ by {worst:e}"
        );

        let offload = optim.offload().expect("an offloaded optimizer");
        assert_eq!(offload.master_bytes(), 4 * n, "{kind:?}: master copies");
        let traffic = offload.traffic();
        assert_eq!(
            traffic.to_host,
            4 * n * (3 + 1),
            "{kind:?}: gradients + first masters"
        );
        assert_eq!(traffic.to_device, 4 * n * 3, "{kind:?}: updated parameters");
        if let napkin_core::train::UpdateRule::AdamW(adamw) = optim.rule() {
            let moments = adamw.moments(ids[0].0).expect("stepped");
            assert_eq!(
                moments.exp_avg.device(),
                host,
                "the state lives on the host"
            );
        }
        assert_eq!(optim.state_device(&model_device), host);
    }
}
