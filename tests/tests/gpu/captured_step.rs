//! `napkin train`'s step captured as a device graph and replayed (`train/captured.rs`) against
//! the same run launched op by op (`capture = false`), on the tiny-smol fixture on wgpu:
//!
//! - 20 LoRA steps, held-out evaluations between them (other device work between replays);
//! - 12 QLoRA steps (NF4 + double quantization) with checkpointing and two micro-batches a step.
//!
//! The captured run replays from its second step, AdamW's update and the gradients' norm inside
//! the graph (napkin launches neither from the host from step 3 on, counted at the launch); its
//! host submits only its writes into the recorded inputs, the replay and one read (9 with one
//! micro-batch); its losses equal the op-by-op run's within
//! 1e-6 (relative) at every step, and its adapter's relative L2 distance from the op-by-op
//! adapter is at most 1e-6 (seen: 0.9–1.7e-7 and 1.2e-7). Not to the bit: the op-by-op run is
//! not reproducible to the bit itself on lavapipe (cubecl picks its product kernels by timing;
//! two op-by-op runs of the first case differ as much), and the captured loss weighs each
//! label by `1 / label tokens` in the kernel instead of scaling the sum.

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::tensor::Tensor;
use napkin_core::chat::BuiltInChat;
use napkin_core::device::DeviceKind;
use napkin_core::train::TrainConfig;
use napkin_core::train::trainer::Trainer;
use napkin_tests::fixture_root;

use super::ONE_AT_A_TIME;

/// Steps' losses, whether the run replayed, the adapter's values in module order, and the
/// launches of napkin's update and norm kernels issued from the host in each step.
struct Run {
    losses: Vec<f32>,
    replayed: bool,
    adapter: Vec<Vec<f32>>,
    host_launches: Vec<u64>,
    /// What the last replayed step submitted from the host.
    submissions: Option<usize>,
}

/// AdamW's and the global norm's kernel launches so far, counted at each launch (a recording
/// counts the launches it records; a replay counts none).
fn napkin_launches() -> u64 {
    napkin_core::kernels::gpu::adamw::launches()
        + napkin_core::kernels::gpu::sum_of_squares::launches()
}

fn run(capture: bool, out: &Path, settings: impl Fn(&mut TrainConfig)) -> Run {
    let fixtures = fixture_root();
    let mut config = TrainConfig {
        model: fixtures.join("tiny-smol"),
        tokenizer: Some(fixtures.join("tokenizer/tokenizer.json")),
        chat_format: Some(BuiltInChat::ChatMl),
        data: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data/napkin-instruct.jsonl"),
        out: out.to_path_buf(),
        device: DeviceKind::Wgpu,
        lora_r: 8,
        lr: 3e-3,
        seq_len: 64,
        save_every: 0,
        capture,
        ..TrainConfig::default()
    };
    settings(&mut config);
    let (mut trainer, _) = Trainer::new(config, false).expect("the trainer starts");
    let (mut losses, mut host_launches) = (Vec::new(), Vec::new());
    while !trainer.is_done() {
        let before = napkin_launches();
        losses.push(trainer.train_step().expect("a step").loss);
        host_launches.push(napkin_launches() - before);
        if trainer.eval_due() {
            let report = trainer.evaluate().expect("an evaluation");
            if let Some(report) = report {
                trainer.record_eval(&report).expect("recorded");
            }
        }
    }
    let mut adapter = Vec::new();
    trainer.model.visit(&mut Collect(&mut adapter));
    Run {
        losses,
        replayed: trainer.is_replaying(),
        adapter,
        host_launches,
        submissions: trainer.replay_submissions(),
    }
}

/// Every trainable tensor's values, in module order.
struct Collect<'a>(&'a mut Vec<Vec<f32>>);

impl burn::module::ModuleVisitor for Collect<'_> {
    fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<D>>) {
        let t = param.val();
        if t.is_require_grad() {
            let values = t
                .inner()
                .into_data()
                .try_to_vec::<f32>()
                .expect("f32 values");
            self.0.push(values);
        }
    }
}

fn compare(name: &str, submissions: usize, settings: impl Fn(&mut TrainConfig) + Copy) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = std::env::temp_dir().join(format!(
        "napkin-captured-step-{}-{}",
        std::process::id(),
        name.len()
    ));
    let captured = run(true, &dir.join("captured"), settings);
    let eager = run(false, &dir.join("eager"), settings);
    std::fs::remove_dir_all(&dir).ok();
    assert!(captured.replayed, "{name}: the captured run never replayed");
    assert!(!eager.replayed, "{name}: --no-capture replayed");
    assert_eq!(captured.losses.len(), eager.losses.len());
    let loss_gap = captured
        .losses
        .iter()
        .zip(&eager.losses)
        .map(|(a, b)| (a - b).abs() / b.abs())
        .fold(0.0f32, f32::max);
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (a, b) in captured.adapter.iter().zip(&eager.adapter) {
        for (x, y) in a.iter().zip(b) {
            diff += f64::from(x - y).powi(2);
            norm += f64::from(*y).powi(2);
        }
    }
    let adapter_gap = (diff / norm).sqrt();
    println!(
        "{name}: {} steps, losses {:.4} → {:.4}; captured against op by op: worst loss gap \
         {loss_gap:.2e}, adapter (relative L2) {adapter_gap:.2e}",
        eager.losses.len(),
        eager.losses[0],
        eager.losses[eager.losses.len() - 1]
    );
    assert!(loss_gap <= 1e-6, "{name}: losses {loss_gap:e} apart");
    // Step 1 op by op, step 2 recorded: from step 3 on, the update and the norm are in the
    // graph and the host launches neither.
    assert!(
        eager.host_launches.iter().all(|&n| n > 0),
        "{name}: op by op launches them"
    );
    assert_eq!(
        captured.host_launches[2..].iter().sum::<u64>(),
        0,
        "{name}: a replayed step launched AdamW or the norm from the host: {:?}",
        captured.host_launches
    );
    println!(
        "{name}: a replayed step submits {:?} from the host (op by op it launched {} of \
         napkin's update and norm kernels alone)",
        captured.submissions, eager.host_launches[2]
    );
    assert_eq!(
        captured.submissions,
        Some(submissions),
        "{name}: host submissions"
    );
    assert!(
        adapter_gap <= 1e-6,
        "{name}: adapters {adapter_gap:e} apart"
    );
}

#[test]
fn a_replayed_lora_step_trains_as_op_by_op_with_evaluations_between() {
    // One micro-batch: six writes (ids, RoPE cos and sin, mask, two label columns) and AdamW's
    // scalars, the replay, the read.
    compare("LoRA r 8, eval every 5", 9, |c| {
        c.steps = Some(20);
        c.val_fraction = 0.1;
        c.eval_every = 5;
    });
}

#[test]
fn a_replayed_qlora_step_with_checkpointing_and_accumulation_trains_as_op_by_op() {
    // Two micro-batches, the same nine: each kind of input is one buffer for both
    // (`train/captured_inputs.rs`; a buffer a micro-batch made it 15).
    compare("QLoRA r 8 NF4+DQ, checkpointing, 2 micro-batches", 9, |c| {
        c.steps = Some(12);
        c.nf4 = true;
        c.double_quant = true;
        c.checkpointing = true;
        c.accumulation = 2;
    });
}

#[test]
fn a_replayed_step_with_the_chunked_loss_trains_as_op_by_op() {
    // Two rows of 64 in chunks of 20 (the label columns' chunks start at offsets that are not
    // multiples of the device's alignment: copies inside the graph), the same nine.
    compare("LoRA r 8, chunked loss (chunks of 20), B = 2", 9, |c| {
        c.steps = Some(12);
        c.micro_batch = 2;
        c.chunked_loss = true;
        c.loss_chunk_rows = Some(20);
    });
}

/// What a replayed step holds for the run (`measure_with`'s capture on lavapipe): the
/// gradients (which a step op by op frees after its update), the kept inputs and AdamW's
/// scalars, `predict::link::held_by_recorded_step` beside the pool's bytes in use. The rule was
/// written from `bench gpu --smoke`'s QLoRA case (1.004); the first two cases were chosen before
/// they were first run (2026-12-07) and held out until the inputs were packed into one buffer a
/// kind: with two micro-batches the graph then copies the label columns (1.0126 before the rule
/// counted the copies, so the tiny-mha case drove it). The third case was chosen after that
/// change and before its first run (2026-12-07), three micro-batches with parts of odd sizes:
/// its first run missed (0.866) because the rule assumed a 256-byte alignment where lavapipe's
/// is smaller (its RoPE parts were views), so it drove the rule's reading of the device's own
/// alignment and is fitted too. The fourth was chosen after that, before its first run
/// (2026-12-07). Held within 2 %.
#[test]
fn what_a_replayed_step_holds_is_predicted() {
    use napkin_core::config::{LlamaConfig, LoraConfig, Nf4Config};
    use napkin_core::measure::{MachineProbe, measure_with, random_model};
    use napkin_core::predict::inventory::Scenario;

    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = super::wgpu_device();
    let probe = MachineProbe {
        gemm_n: 64,
        copy_bytes: 1 << 20,
    };
    let cases = [
        (
            "tiny-gqa LoRA r 4, B = 2, T = 200",
            Scenario {
                lora: Some(LoraConfig {
                    r: 4,
                    ..LoraConfig::default()
                }),
                ..Scenario::new(LlamaConfig::tiny_gqa(), 2, 200)
            },
        ),
        (
            "tiny-mha QLoRA r 16 NF4+DQ, checkpointing, T = 128, 2 micro-batches",
            Scenario {
                lora: Some(LoraConfig {
                    r: 16,
                    ..LoraConfig::default()
                }),
                nf4: Some(Nf4Config {
                    double_quant: true,
                    ..Nf4Config::default()
                }),
                checkpointing: true,
                accumulation: 2,
                ..Scenario::new(LlamaConfig::tiny_mha(), 1, 128)
            },
        ),
        (
            "tiny-smol QLoRA r 8 NF4+DQ, B = 3, T = 77, 3 micro-batches",
            Scenario {
                lora: Some(LoraConfig {
                    r: 8,
                    ..LoraConfig::default()
                }),
                nf4: Some(Nf4Config {
                    double_quant: true,
                    ..Nf4Config::default()
                }),
                accumulation: 3,
                ..Scenario::new(LlamaConfig::tiny_smol(), 3, 77)
            },
        ),
        (
            "tiny-gqa QLoRA r 4 NF4, checkpointing, B = 2, T = 99, 2 micro-batches",
            Scenario {
                lora: Some(LoraConfig {
                    r: 4,
                    ..LoraConfig::default()
                }),
                nf4: Some(Nf4Config::default()),
                checkpointing: true,
                accumulation: 2,
                ..Scenario::new(LlamaConfig::tiny_gqa(), 2, 99)
            },
        ),
    ];
    println!(
        "the device's memory alignment: {:?} bytes",
        napkin_core::device::memory_alignment(&device)
    );
    for (what, s) in cases {
        let train = device.clone().autodiff();
        let report = measure_with(&s, &device, 3, probe, None, true, || {
            train.seed(7);
            random_model(&s, &train)
        })
        .expect("measured steps");
        assert_eq!(report.replayed_steps, 2, "{what}: steps 2 and 3 replayed");
        let held = report.held_by_graph.expect("a device pool's reading");
        println!(
            "{what}: held while replaying, predicted {} B, measured {} B ({:.4})",
            held.predicted, held.measured, held.ratio
        );
        assert!(
            (held.ratio - 1.0).abs() <= 0.02,
            "{what}: held {:.4} of the prediction",
            held.ratio
        );
    }
}
