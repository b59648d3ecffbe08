//! A training step's forward and backward captured once as a device graph
//! (`burn::tensor::capture`: a CUDA graph on CUDA, recorded pipelines and bindings on wgpu) and
//! replayed, beside the same work launched op by op: what the host's launching costs a whole
//! step (`gpu_launch.rs` gives it per op).
//!
//! A replay reads the buffers it recorded, so the batch's uploads are made before the capture:
//! the embedded tokens (the base is frozen, LoRA or QLoRA, so the lookup is outside the graph),
//! the RoPE tables, the attention mask, the loss's targets and weights. The loss is the
//! causal-LM sum with burn's ops, as `model/loss.rs` computes it on the GPU backends. It is not
//! yet the trainer's step: no checkpointing, no optimizer update, no read of the loss — what a
//! captured trainer still needs is listed in docs/performance.md.

use burn::tensor::activation::log_softmax;
use burn::tensor::{Device, Int, Tensor, TensorData, capture};
use napkin_core::error::{Error, Result};
use napkin_core::measure::{random_model, synthetic_micro_batches};
use napkin_core::model::IGNORE_INDEX;
use napkin_core::model::autocast::{autocast, half_dtype};
use napkin_core::predict::inventory::Scenario;
use napkin_core::train::grads::ParamGrads;
use serde::Serialize;

use super::gpu_launch::time_to_sync;
use super::spread;

/// The largest relative difference between the replayed and op-by-op gradients' global norms
/// that counts as the same step.
const SAME_GRADIENTS: f64 = 1e-6;

/// Step times launched op by op and replayed, and whether the replay is the same step.
#[derive(Debug, Clone, Serialize)]
pub struct CaptureFigures {
    pub case: String,
    pub eager_median_seconds: f64,
    /// None when the backend recorded no graph (a replay would re-run the ops).
    pub replayed_median_seconds: Option<f64>,
    /// The replayed gradients' global norm equals the op-by-op step's within [`SAME_GRADIENTS`].
    pub same_gradients: bool,
    /// The relative difference between the two global norms.
    pub gradient_norm_difference: f64,
}

/// Times `runs` steps of `s` (LoRA or QLoRA; its checkpointing and accumulation are ignored)
/// both ways on `device`, after one untimed step that compiles the kernels.
pub fn run(device: &Device, name: &str, s: &Scenario, runs: usize) -> Result<CaptureFigures> {
    // With `--dtype bf16|f16` the products run in 16 bits, as in `measure`'s steps.
    let _precision = autocast(s.half_compute.then(|| half_dtype(device)));
    let train = device.clone().autodiff();
    train.seed(7);
    let model = random_model(s, &train)?;
    let micro = synthetic_micro_batches(&Scenario {
        accumulation: 1,
        ..s.clone()
    })?
    .into_iter()
    .next()
    .ok_or_else(|| Error::Input("the captured step needs a micro-batch".into()))?;
    let batch = &micro.batch;
    let context = model.context(batch);
    let embedded = model.embed(batch).detach(); // [B, T, D]
    let [b, t, _] = embedded.dims();
    // Labels shifted left by one: position p predicts label p + 1; ignored ones weigh 0.
    let (mut targets, mut weights) = (Vec::new(), Vec::new());
    for row in micro.labels.chunks(t) {
        for &label in &row[1..] {
            let counted = label != IGNORE_INDEX;
            targets.push(if counted { label } else { 0 });
            weights.push(if counted { 1.0f32 } else { 0.0 });
        }
    }
    let targets: Tensor<3, Int> =
        Tensor::from_data(TensorData::new(targets, [b, t - 1, 1]), &train);
    let weights: Tensor<3> = Tensor::from_data(TensorData::new(weights, [b, t - 1, 1]), &train);
    let step = || {
        let mut x = embedded.clone();
        for layer in &model.layers {
            x = layer.forward(x, &context.rope, &context.mask);
        }
        let log_probs = log_softmax(model.head(x).narrow(1, 0, t - 1), 2); // [B, T−1, V]
        let loss = (log_probs.gather(2, targets.clone()) * weights.clone())
            .sum()
            .neg();
        let mut backward = loss.backward();
        ParamGrads::from_backward(&model, &mut backward)
    };
    let expected = step().global_norm();
    let eager: Vec<f64> = (0..runs)
        .map(|_| time_to_sync(device, || drop(step())))
        .collect();
    let mut graph = capture(device, step);
    let recorded = graph.is_hardware();
    let replayed: Vec<f64> = (0..runs)
        .map(|_| {
            time_to_sync(device, || {
                // SAFETY: every buffer the recorded step touches is held by this function
                // (model, batch tensors) or by the graph (its output) until it returns, nothing
                // else runs on the device meanwhile, and the sync in `time_to_sync` waits for
                // each replay's work.
                unsafe {
                    graph.replay();
                }
            })
        })
        .collect();
    // The kernels autotuned during the first steps may sum in another order than the ones
    // recorded: equal to rounding, not to the bit (1.6e-10 relative on lavapipe).
    let difference =
        (graph.output().global_norm() - expected).abs() / expected.abs().max(f64::MIN_POSITIVE);
    let same_gradients = difference <= SAME_GRADIENTS;
    let (eager_s, eager_lo, eager_hi) = spread(&eager).unwrap_or_default();
    let (replay_s, replay_lo, replay_hi) = spread(&replayed).unwrap_or_default();
    println!("\n{name}: forward and backward (no checkpointing, no optimizer), median of {runs}:");
    println!(
        "  launched op by op: {:.1} ms ({:.1}–{:.1})",
        1e3 * eager_s,
        1e3 * eager_lo,
        1e3 * eager_hi
    );
    if recorded {
        println!(
            "  captured once as a device graph and replayed: {:.1} ms ({:.1}–{:.1}; {:.2}× the \
             op-by-op time; the gradients' global norm {} the op-by-op step's, {difference:.1e} \
             apart)",
            1e3 * replay_s,
            1e3 * replay_lo,
            1e3 * replay_hi,
            replay_s / eager_s,
            if same_gradients { "is" } else { "is NOT" }
        );
    } else {
        println!("  captured as a device graph: this backend recorded none");
    }
    Ok(CaptureFigures {
        case: name.to_string(),
        eager_median_seconds: eager_s,
        replayed_median_seconds: recorded.then_some(replay_s),
        same_gradients,
        gradient_norm_difference: difference,
    })
}
