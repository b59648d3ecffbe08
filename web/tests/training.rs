//! The page's training run, natively: the same code the Web Worker runs. One test function,
//! because the counting allocator is process-wide and measurements must not overlap.

use napkin_core::memory::CountingAllocator;
use napkin_core::train::OptimizerKind;
use napkin_web::import::measurement_from_json;
use napkin_web::state::{Action, SandboxState, reduce};
use napkin_web::training::{TrainBackend, TrainEvent, TrainRequest, ready_now, run_training};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn request(actions: &[Action]) -> TrainRequest {
    let mut settings = reduce(
        &SandboxState::default(),
        Action::SelectPreset("tiny-smol".into()),
    );
    settings = reduce(&settings, Action::SetSeqLen(64));
    for a in actions {
        settings = reduce(&settings, a.clone());
    }
    TrainRequest {
        steps: 12,
        ..TrainRequest::new(settings)
    }
}

fn run(request: &TrainRequest) -> Vec<TrainEvent> {
    let mut events = Vec::new();
    ready_now(run_training(
        request,
        &napkin_core::device::cpu(),
        "test",
        &mut |e| events.push(e),
    ))
    .expect("training runs");
    events
}

fn losses(events: &[TrainEvent]) -> Vec<f32> {
    events
        .iter()
        .filter_map(|e| match e {
            TrainEvent::Step { loss, .. } => Some(*loss),
            _ => None,
        })
        .collect()
}

#[test]
fn training_in_the_page() {
    // QLoRA with checkpointing, as a learner toggles it: every block is measured within 10 %
    // of its prediction (the grid test holds the engine to 5 %; here T = 64 and a tiny
    // model), the losses fall, and every event survives the JSON of postMessage.
    let events = run(&request(&[
        Action::SetLora(true),
        Action::SetRank(8),
        Action::SetDoubleQuant(true),
        Action::SetCheckpointing(true),
    ]));
    assert!(matches!(events[0], TrainEvent::Started { .. }));
    let TrainEvent::Measured { report } = &events[1] else {
        panic!("second event: {:?}", events[1]);
    };
    let checked: Vec<_> = report
        .layers
        .iter()
        .filter(|c| c.name.starts_with("layers."))
        .chain(
            report
                .kinds
                .iter()
                .filter(|c| !c.name.starts_with("parameters")),
        )
        .collect();
    for c in &checked {
        assert!((0.9..1.1).contains(&c.ratio), "{c:?}");
    }
    // The step peak of this 1.7 MB step: 1.03 in the browser (one thread, no SIMD), 1.106
    // natively on a 2-core AMD EPYC (184 KB over, the same with one thread; not traced yet).
    // The grid test holds larger steps to 5 %.
    let peak = &report.step_peak;
    assert!((0.9..1.15).contains(&peak.ratio), "{peak:?}");
    // A 1 MB model's parameters carry the loader's bookkeeping (names, ids, the NF4
    // double-quantization tables): within 25 % here, 0.6 % for SmolLM2 (README).
    let params = &report.kinds[0];
    assert!((0.95..1.25).contains(&params.ratio), "{params:?}");
    let l = losses(&events);
    assert_eq!(l.len(), 12);
    assert!(l[11] < 0.8 * l[0], "losses {l:?}");
    assert!(matches!(events.last(), Some(TrainEvent::Finished { .. })));
    let Some(TrainEvent::Resident {
        predicted_bytes,
        measured_bytes,
        host_side_bytes,
    }) = events.iter().rev().nth(1).cloned()
    else {
        panic!(
            "no resident event before the end: {:?}",
            events.iter().rev().nth(1)
        );
    };
    // Weights, NF4 codes and scales, adapters and AdamW's moments stay between steps
    // (measured 1.045 here: the model's bookkeeping, as for the parameters above).
    let ratio = measured_bytes as f64 / predicted_bytes as f64;
    assert!(
        (0.95..1.1).contains(&ratio),
        "resident {measured_bytes} / {predicted_bytes}"
    );
    assert_eq!(host_side_bytes, 0, "on the CPU nothing is kept aside");
    for e in &events {
        let json = serde_json::to_string(e).unwrap();
        assert_eq!(&serde_json::from_str::<TrainEvent>(&json).unwrap(), e);
    }

    // The report `napkin measure --json` writes loads in the page as it was written
    // ("this machine" has no memory bound: JSON writes infinity as null).
    let json = serde_json::to_string_pretty(report).unwrap();
    assert!(json.contains("\"memory\": null"));
    assert_eq!(&measurement_from_json("m.json", &json).unwrap(), &**report);
    let err = measurement_from_json("m.json", "{\"kinds\": 3}").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("m.json: not the JSON of `napkin measure --json`"),
        "{err}"
    );

    // The WebGPU path (no per-block measurement, the model built on the CPU and moved, the
    // loss awaited after the update), run here on the CPU device: the very losses of the CPU
    // path. On WebGPU itself the browser test compares the two.
    let qlora = request(&[
        Action::SetLora(true),
        Action::SetRank(8),
        Action::SetDoubleQuant(true),
        Action::SetCheckpointing(true),
    ]);
    let gpu_path = run(&TrainRequest {
        backend: TrainBackend::WebGpu,
        ..qlora.clone()
    });
    assert!(
        !gpu_path
            .iter()
            .any(|e| matches!(e, TrainEvent::Measured { .. }))
    );
    assert_eq!(losses(&gpu_path), l);
    // 8-bit AdamW reads its state back every step: refused on WebGPU, by name.
    let adamw8 = TrainRequest {
        backend: TrainBackend::WebGpu,
        ..request(&[
            Action::SetLora(true),
            Action::SetOptimizer(OptimizerKind::AdamW8bit),
        ])
    };
    let err = ready_now(run_training(
        &adamw8,
        &napkin_core::device::cpu(),
        "test",
        &mut |_| {},
    ))
    .expect_err("refused");
    assert!(err.to_string().contains("8-bit AdamW"), "{err}");

    // Full fine-tuning starts at chance (ln V) and learns the cycle. Its step peak is within
    // 10 % of the prediction (1.050 measured; 1.483 while burn Flex copied every gradient that
    // was still shared with burn's gradient container, see `ParamGrads::from_backward`).
    let full = run(&request(&[Action::SetLora(false)]));
    let TrainEvent::Measured { report } = &full[1] else {
        panic!("second event: {:?}", full[1]);
    };
    let peak = &report.step_peak;
    assert!((0.9..1.1).contains(&peak.ratio), "{peak:?}");
    let l = losses(&full);
    let chance = (512f32).ln();
    assert!((l[0] - chance).abs() < 1.0, "first loss {} vs ln V", l[0]);
    assert!(l[11] < 0.8 * l[0], "losses {l:?}");
}
