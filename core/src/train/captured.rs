//! A training step's forward and backward captured once as a device graph and replayed each
//! step after (burn's backend graph: a CUDA graph on CUDA, cubecl's recorded dispatches on wgpu).
//! Launched op by op a SmolLM2-135M LoRA step is ~3,450 kernel launches, each costing host time
//! (10–19 µs on an H200); a replay is one submission for all of them.
//!
//! A replay reads and writes the buffers its recording was given, so:
//! - the micro-batches' inputs (token ids, RoPE tables, mask, label columns) live in buffers
//!   kept for the run, one a kind for all micro-batches (`captured_inputs.rs`), and each new
//!   step's batch is written into them (`link::write_over`, once a kind) before the replay;
//!   the loss's token weight (`1 / label tokens of the step`) is in the label
//!   column, not a scalar of the graph;
//! - the update writes the parameters and moments over their own buffers
//!   (`AdamW::set_in_place`), so the next replay's forward reads the new weights;
//! - nothing inside reads the device: the step's loss and `Σ g²` come out as one `[2]` tensor,
//!   read once after the replay.
//!
//! One graph per step shape (micro-batches, B, T, packed or not, recomputed or not); a step of
//! another shape runs op by op. The first step runs op by op after `graph_prepare`, and its
//! buffers warm the pools the recording then reuses.
//!
//! # Shapes
//! - the K micro-batches' inputs: ids `[K·B, T]`, RoPE `[K·B, 1, T, Dh]` × 2, mask
//!   `[K·(1 or B), 1, T, T]`, label columns `[K·B·(T − 1)]` × 2; the figures `[2]`

use burn::tensor::{Device, Tensor, TensorData};
use burn_backend::Backend;
use burn_dispatch::Dispatch;

use super::captured_inputs::{KeptInputs, PackedInputs};
use super::grads::ParamGrads;
use super::step::micro_backward_on;
use crate::data::MicroBatch;
use crate::device::link::{Traffic, write_over};
use crate::error::{Error, Result};
use crate::kernels::gpu::sum_of_squares::sum_of_squares;
use crate::model::Llama;
use crate::model::chunked_loss::chunked_lm_loss_on_device;
use crate::model::loss::summed_nll_on_device;

/// What one graph is recorded for: a step of another shape cannot replay it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct StepShape {
    micro_batches: usize,
    batch: usize,
    seq: usize,
    packed: bool,
    recomputes: bool,
}

impl StepShape {
    fn of(micro: &[MicroBatch], recomputes: bool) -> Option<Self> {
        let first = &micro.first()?.batch;
        let shape = StepShape {
            micro_batches: micro.len(),
            batch: first.batch,
            seq: first.seq,
            packed: first.is_packed(),
            recomputes,
        };
        micro
            .iter()
            .all(|m| {
                m.batch.batch == shape.batch
                    && m.batch.seq == shape.seq
                    && m.batch.is_packed() == shape.packed
            })
            .then_some(shape)
    }
}

/// A recorded step and the buffers it reads and writes.
pub struct CapturedStep {
    shape: StepShape,
    /// The step's input buffers, one a kind (`captured_inputs.rs`); the graph recorded each
    /// micro-batch's views of them.
    packed: PackedInputs,
    graph: burn_backend::BackendGraph<Dispatch>,
    device: Device,
    /// The gradients the replay writes (the recording's own tensors).
    grads: ParamGrads,
    /// `[2]`: the step's mean loss over its label tokens, and `Σ g²`.
    figures: Tensor<1>,
    /// `[7]`: AdamW's scalars of the step (learning rate, bias corrections), written before
    /// each replay; the clipping factor and the apply flag are computed in the graph.
    scalars: Tensor<1>,
}

/// What a replayed step gives the trainer.
pub struct ReplayedStep {
    /// The step's gradients (written by the replay).
    pub grads: ParamGrads,
    /// Mean loss over the step's label tokens.
    pub loss: f32,
    /// The gradients' global norm.
    pub grad_norm: f64,
}

/// What the recorded update needs besides the gradients: the optimizer (AdamW, in place),
/// this step's learning rate and the clipping norm (0: none).
pub struct Update<'a> {
    pub optimizer: &'a mut super::optimizer::Optimizer,
    pub lr: f64,
    pub max_grad_norm: f64,
}

impl Update<'_> {
    /// Counts the step in AdamW and gives its scalars as host data (`[7]`).
    fn begin(&mut self) -> Result<TensorData> {
        let adamw = self
            .optimizer
            .adamw_mut()
            .ok_or_else(|| Error::Internal("a captured step's update is AdamW's".into()))?;
        adamw.begin_step();
        Ok(TensorData::new(adamw.host_scalars(self.lr).to_vec(), [7]))
    }

    /// Takes back [`Update::begin`]'s count (a recording that failed: the step runs op by op).
    fn uncount(&mut self) {
        if let Some(adamw) = self.optimizer.adamw_mut() {
            adamw.steps = adamw.steps.saturating_sub(1);
        }
    }
}

/// Readies `device` for a capture: called before the op-by-op step whose buffers the recording
/// will reuse. An error where the backend records no graph.
pub fn prepare(device: &Device) -> Result<()> {
    // The device under autodiff records nothing itself: its inner device does.
    Dispatch::graph_prepare(device.clone().inner().as_dispatch())
        .map_err(|e| Error::Input(format!("this device cannot capture a step: {e:?}")))
}

impl CapturedStep {
    /// Records the step of `micro` (its data written into buffers kept for the run) without
    /// running it: [`CapturedStep::replay`] runs it. `recomputes` as `step::recomputes_blocks`.
    pub fn record(
        model: &Llama,
        micro: &[MicroBatch],
        recomputes: bool,
        chunk_rows: Option<usize>,
        update: &mut Update<'_>,
    ) -> Result<Self> {
        let shape = StepShape::of(micro, recomputes)
            .ok_or_else(|| Error::Input("micro-batches of different shapes".into()))?;
        let (packed, contexts) = PackedInputs::upload(model, micro, recomputes, chunk_rows)?;
        let device = model.device().inner();
        // AdamW's scalars cross the link as optimizer traffic (the batch's inputs as data).
        let scalars: Tensor<1> =
            crate::device::link::upload(update.begin()?, &device, Traffic::Optimizer);
        let dispatch = device.as_dispatch();
        Dispatch::graph_start_capture(dispatch)
            .map_err(|e| Error::Input(format!("the device refused to record a step: {e:?}")))?;
        let kept = packed.views(contexts);
        let recorded = forward_backward(model, micro, &kept, recomputes, chunk_rows).and_then(
            |(grads, figures)| {
                let all = device_scalars(&figures, &scalars, update.max_grad_norm);
                update
                    .optimizer
                    .adamw_mut()
                    .ok_or_else(|| Error::Internal("a captured step's update is AdamW's".into()))?
                    .step_on_device(model.clone(), &grads, &all)?;
                Ok((grads, figures))
            },
        );
        // Stopped whatever the step gave, so the device leaves recording.
        let graph = Dispatch::graph_stop_capture(dispatch);
        let ((grads, figures), graph) = match (recorded, graph) {
            (Ok(outputs), Ok(graph)) => (outputs, graph),
            (recorded, graph) => {
                // Nothing recorded ran: the step is run op by op, and counted there.
                update.uncount();
                recorded?;
                return Err(Error::Input(format!(
                    "the device could not seal the step: {:?}",
                    graph.err()
                )));
            }
        };
        Ok(CapturedStep {
            shape,
            packed,
            graph,
            device,
            grads,
            figures,
            scalars,
        })
    }

    /// Whether `micro` has the recorded shape.
    pub fn fits(&self, micro: &[MicroBatch]) -> bool {
        StepShape::of(micro, self.shape.recomputes) == Some(self.shape)
    }

    /// Writes `micro`'s data and this step's AdamW scalars into the recorded buffers (the
    /// shapes must fit), counting the step in AdamW; the writes issued.
    pub fn refresh(
        &self,
        model: &Llama,
        micro: &[MicroBatch],
        update: &mut Update<'_>,
    ) -> Result<usize> {
        let writes_before = crate::device::link::writes();
        if !write_over(&self.scalars, update.begin()?, Traffic::Optimizer) {
            return Err(Error::Internal(
                "a captured step's scalars could not be written".into(),
            ));
        }
        if !self.packed.refresh(model, micro)? {
            return Err(Error::Internal(
                "a captured step's input buffer could not be written".into(),
            ));
        }
        // Counted where each write is issued (`link::write_over`).
        Ok((crate::device::link::writes() - writes_before) as usize)
    }

    /// Runs the recorded step on the buffers' current data (forward, backward and AdamW's
    /// update in place, skipped on a non-finite loss) and reads its loss and gradient norm (one
    /// read).
    pub fn replay(&self) -> Result<ReplayedStep> {
        // SAFETY: every buffer the recording touched is held by `self` (the inputs, the
        // gradients and figures it wrote) or by the model (weights, updated in place by the
        // optimizer, never swapped while a capture lives); the replay is issued from the
        // thread that recorded it, and the read below waits for it.
        unsafe { Dispatch::graph_replay(self.device.as_dispatch(), &self.graph) }
            .map_err(|e| Error::Input(format!("replaying the captured step failed: {e:?}")))?;
        let figures = crate::kernels::values::to_f32_vec(self.figures.clone());
        let (loss, squares) = match figures.as_slice() {
            [loss, squares] => (*loss, *squares),
            _ => {
                return Err(Error::Internal(
                    "a captured step's figures are not two".into(),
                ));
            }
        };
        Ok(ReplayedStep {
            grads: self.grads.clone(),
            loss,
            grad_norm: f64::from(squares).sqrt(),
        })
    }
}

/// `[DEVICE_SCALARS]`: `host` (`[7]`), then the clipping factor `min(1, max_norm / (‖g‖ +
/// 1e-6))` (1 without clipping) and apply (1 when the loss is finite), computed on the device
/// from `figures` (`[loss, Σ g²]`), as the trainer computes them on the host op by op.
fn device_scalars(figures: &Tensor<1>, host: &Tensor<1>, max_grad_norm: f64) -> Tensor<1> {
    let loss = figures.clone().narrow(0, 0, 1);
    let squares = figures.clone().narrow(0, 1, 1);
    let factor = if max_grad_norm > 0.0 {
        ((squares.sqrt() + 1e-6).recip() * max_grad_norm).clamp_max(1.0)
    } else {
        squares.ones_like()
    };
    let apply = loss.is_finite().float();
    Tensor::cat(vec![host.clone(), factor, apply], 0)
}

/// The recorded work: every micro-batch's forward and backward on the kept inputs, the
/// gradients summed, and the figures `[loss, Σ g²]`.
fn forward_backward(
    model: &Llama,
    micro: &[MicroBatch],
    kept: &[KeptInputs],
    recomputes: bool,
    chunk_rows: Option<usize>,
) -> Result<(ParamGrads, Tensor<1>)> {
    let mut grads = ParamGrads::new();
    let mut loss: Option<Tensor<1>> = None;
    for (m, k) in micro.iter().zip(kept) {
        let mut head_loss = |top: Tensor<3>| -> Result<(Tensor<1>, Tensor<1>)> {
            let share = match chunk_rows {
                Some(rows) => {
                    let (surrogate, share) =
                        chunked_lm_loss_on_device(model, top, &k.classes, &k.weights, rows)?;
                    return Ok((surrogate, share));
                }
                None => summed_nll_on_device(model.head(top), &k.classes, &k.weights)?,
            };
            let value = share.clone().inner();
            Ok((share, value))
        };
        let (g, value) = micro_backward_on(
            model,
            m,
            &k.inputs,
            recomputes,
            0,
            &mut || {},
            &mut head_loss,
        )?;
        grads.add(g);
        loss = Some(match loss {
            Some(sum) => sum + value,
            None => value,
        });
    }
    let loss = loss.ok_or_else(|| Error::Input("a step needs a micro-batch".into()))?;
    let tensors: Vec<&Tensor<1>> = grads.tensors().collect();
    let squares = sum_of_squares(&tensors)
        .ok_or_else(|| Error::Input("the gradients are not f32 on one GPU device".into()))?;
    let figures = Tensor::cat(vec![loss, squares], 0);
    Ok((grads, figures))
}

/// Where a run is with capturing its step (the trainer's side of this file).
pub struct Capturing {
    state: State,
    /// The chunked loss's rows a chunk (`model/chunked_loss.rs`), or the whole logits.
    chunk_rows: Option<usize>,
    /// Said once to the user: why the step runs op by op.
    note: Option<String>,
    /// What the last replayed step submitted from the host: its writes into the kept buffers,
    /// the replay and the read (counted as they are issued).
    submissions: Option<usize>,
}

enum State {
    /// Op by op for the rest of the run.
    Off,
    /// The next step runs op by op after [`prepare`], warming the pools.
    Warming,
    /// The next step is recorded, then replayed.
    Record,
    /// Replaying.
    Ready(Box<CapturedStep>),
}

impl std::fmt::Debug for Capturing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            State::Off => "off",
            State::Warming => "warming",
            State::Record => "record",
            State::Ready(_) => "replaying",
        };
        f.debug_struct("Capturing").field("state", &state).finish()
    }
}

/// What the run's settings say about capturing, before any step.
pub struct RunFacts<'a> {
    pub model: &'a Llama,
    pub on_gpu: bool,
    pub wanted: bool,
    pub supervised: bool,
    pub lora_dropout: f64,
    pub efficient_attention: bool,
    pub loss_chunk_rows: Option<usize>,
    pub loss_scaling: bool,
    pub adamw_on_device: bool,
}

impl Capturing {
    /// The plan for a run: capture from its second step, or op by op with the reason (none
    /// where the user asked for op by op or the device is a CPU).
    pub fn plan(facts: &RunFacts<'_>) -> Self {
        let reason = if !facts.on_gpu || !facts.wanted {
            return Capturing {
                state: State::Off,
                chunk_rows: None,
                note: None,
                submissions: None,
            };
        } else if !facts.supervised {
            Some("a preference objective")
        } else if facts.lora_dropout > 0.0 {
            Some("LoRA dropout (new masks each step)")
        } else if facts.efficient_attention {
            Some("--attention efficient (its tiles are chosen on the host)")
        } else if facts.loss_scaling {
            Some("f16's loss scaling (a step may be skipped)")
        } else if !facts.adamw_on_device {
            Some("an optimizer other than AdamW on the device")
        } else if facts.model.embed_tokens.val().is_require_grad()
            || facts.model.embed_lora.is_some()
        {
            Some("a trained embedding")
        } else {
            None
        };
        match reason {
            Some(why) => Capturing {
                state: State::Off,
                chunk_rows: None,
                note: Some(format!("the step runs op by op, not captured: {why}")),
                submissions: None,
            },
            None => Capturing {
                state: State::Warming,
                chunk_rows: facts.loss_chunk_rows,
                note: None,
                submissions: None,
            },
        }
    }

    /// A note for the user, once: why the step runs op by op, or that it is captured.
    pub fn take_note(&mut self) -> Option<String> {
        self.note.take()
    }

    /// What the last replayed step submitted from the host (writes, the replay, the read).
    pub fn submissions(&self) -> Option<usize> {
        self.submissions
    }

    /// Whether the next [`Capturing::step`] records the graph.
    pub fn will_record(&self) -> bool {
        matches!(self.state, State::Record)
    }

    /// Whether the step is replayed from a recorded graph.
    pub fn is_replaying(&self) -> bool {
        matches!(self.state, State::Ready(_))
    }

    /// This step through the recorded graph (recording it first when due), or `None`: run it
    /// op by op. `optimizer` is switched to updating in place when capturing starts; `world`
    /// is the data-parallel world size (several ranks run op by op).
    pub fn step(
        &mut self,
        model: &Llama,
        update: &mut Update<'_>,
        micro: &[MicroBatch],
        recomputes: bool,
        world: usize,
    ) -> Result<Option<ReplayedStep>> {
        // Without a GPU backend compiled in nothing records: the browser's CPU module links
        // none of the code below.
        if !cfg!(any(feature = "wgpu", feature = "cuda")) {
            return Ok(None);
        }
        match std::mem::replace(&mut self.state, State::Off) {
            State::Off => Ok(None),
            State::Warming => {
                if world > 1 {
                    self.note = Some("the step runs op by op, not captured: several ranks".into());
                    return Ok(None);
                }
                match prepare(&model.device()) {
                    Ok(()) if update.optimizer.update_in_place(&model.device()) => {
                        self.state = State::Record
                    }
                    Ok(()) => {
                        self.note = Some(
                            "the step runs op by op, not captured: this device binds too few \
                             buffers for AdamW's in-place update"
                                .into(),
                        )
                    }
                    Err(e) => self.note = Some(format!("the step runs op by op: {e}")),
                }
                Ok(None)
            }
            State::Record => {
                match CapturedStep::record(model, micro, recomputes, self.chunk_rows, update) {
                    Ok(captured) => {
                        let replayed = captured.replay()?;
                        self.state = State::Ready(Box::new(captured));
                        self.note = Some(
                        "the step is captured as a device graph and replayed (--no-capture: op \
                         by op)"
                            .into(),
                    );
                        Ok(Some(replayed))
                    }
                    Err(e) => {
                        self.note = Some(format!(
                            "the step runs op by op: recording it as a device graph failed ({e})"
                        ));
                        Ok(None)
                    }
                }
            }
            State::Ready(captured) => {
                if !captured.fits(micro) {
                    self.state = State::Ready(captured);
                    return Ok(None);
                }
                let writes = captured.refresh(model, micro, update)?;
                let replayed = captured.replay()?;
                // The writes, the replay and the read of the figures.
                self.submissions = Some(writes + 2);
                self.state = State::Ready(captured);
                Ok(Some(replayed))
            }
        }
    }
}
