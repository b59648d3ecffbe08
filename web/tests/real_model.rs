//! The page's real-model mode, natively: SmolLM2-135M-Instruct taught the shipped lesson with
//! QLoRA on one thread, by the code the Web Worker runs. Needs `models/` (scripts/test.sh
//! fetches it). One test function: the counting allocator is process-wide.

use std::path::PathBuf;

use napkin_core::memory::CountingAllocator;
use napkin_web::real_model::{REAL_MODEL_FILE, RealModelRequest, run_real_model};
use napkin_web::training::{AnswerStage, TrainError, TrainEvent, ready_now};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn model_bytes() -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models")
        .join(REAL_MODEL_FILE);
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run scripts/fetch/smollm2.sh (scripts/test.sh does)",
            path.display()
        )
    })
}

fn run(request: &RealModelRequest, bytes: Vec<u8>) -> Result<Vec<TrainEvent>, TrainError> {
    let mut events = Vec::new();
    ready_now(run_real_model(
        request,
        REAL_MODEL_FILE,
        bytes,
        &napkin_core::device::cpu(),
        "test",
        &mut |e| {
            eprintln!("{}", serde_json::to_string(&e).unwrap_or_default());
            events.push(e)
        },
    ))?;
    Ok(events)
}

#[test]
fn smollm2_learns_the_lesson_in_the_page() {
    // Bad requests are refused by field before the file is read.
    let empty = RealModelRequest {
        pairs: Vec::new(),
        ..RealModelRequest::default()
    };
    let err = run(&empty, Vec::new()).expect_err("refused");
    assert!(err.to_string().starts_with("pairs: "), "{err}");
    let long = RealModelRequest {
        seq_len: 4096,
        ..RealModelRequest::default()
    };
    let err = run(&long, Vec::new()).expect_err("refused");
    assert!(err.to_string().contains("seq_len: 4096"), "{err}");
    // Not a GGUF: the file's name and what was expected.
    let err = run(&RealModelRequest::default(), b"<html>404</html>".to_vec()).expect_err("refused");
    assert!(
        err.to_string().contains(REAL_MODEL_FILE) && err.to_string().contains("not a GGUF"),
        "{err}"
    );

    // One thread, as in the page.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("pool");
    let request = RealModelRequest::default();
    let events = pool
        .install(|| run(&request, model_bytes()))
        .expect("the lesson runs");

    let TrainEvent::Measured { report } = &events[1] else {
        panic!("second event: {:?}", events[1]);
    };
    // Every block of the real model within 10 % of its prediction (the bound).
    for c in report
        .layers
        .iter()
        .filter(|c| c.name.starts_with("layers."))
    {
        assert!((0.9..1.1).contains(&c.ratio), "{c:?}");
    }
    // The step's peak too (1.71× while burn Flex allocated each product's output twice; see
    // napkin-core's kernels/cpu/fused/x_wt.rs).
    let peak = &report.step_peak;
    assert!((0.95..1.05).contains(&peak.ratio), "{peak:?}");
    let answers: Vec<(AnswerStage, String, Option<f64>)> = events
        .iter()
        .filter_map(|e| match e {
            TrainEvent::Answer {
                stage,
                answer,
                taught_answer_loss,
                ..
            } => Some((*stage, answer.clone(), *taught_answer_loss)),
            _ => None,
        })
        .collect();
    assert_eq!(answers.len(), 2, "{answers:?}");
    let (before, after) = (&answers[0], &answers[1]);
    assert_eq!(
        (before.0, after.0),
        (AnswerStage::Before, AnswerStage::After)
    );
    assert!(!before.1.contains("Otto"), "knew it already: {}", before.1);
    assert!(after.1.contains("Otto"), "did not learn it: {}", after.1);
    // The question is not one of the pairs' (a seventh phrasing): no taught-answer loss.
    assert_eq!((before.2, after.2), (None, None));
    let losses: Vec<f32> = events
        .iter()
        .filter_map(|e| match e {
            TrainEvent::Step { loss, .. } => Some(*loss),
            _ => None,
        })
        .collect();
    assert_eq!(losses.len(), request.steps);
    assert!(losses[losses.len() - 1] < 0.5 * losses[0], "{losses:?}");
    let Some(TrainEvent::Resident {
        predicted_bytes,
        measured_bytes,
        ..
    }) = events.iter().rev().nth(1).cloned()
    else {
        panic!("no resident event: {:?}", events.iter().rev().nth(1));
    };
    let ratio = measured_bytes as f64 / predicted_bytes as f64;
    assert!(
        (0.95..1.05).contains(&ratio),
        "resident {measured_bytes} / {predicted_bytes}"
    );
    for e in &events {
        let json = serde_json::to_string(e).unwrap();
        assert_eq!(&serde_json::from_str::<TrainEvent>(&json).unwrap(), e);
    }
}
