//! AdamW with PyTorch's semantics (`torch.optim.AdamW`, single-tensor path), for the trainable
//! parameters of any module: with LoRA, only the adapters have gradients, so only they get
//! state — two f32 moments per trainable value, 8 bytes each.
//!
//! One step, per parameter p with gradient g (t counts steps from 1):
//! `p ← p·(1 − lr·wd); m ← m + (1−β1)(g − m); v ← β2·v + (1−β2)·g²;`
//! `p ← p − (lr / (1−β1ᵗ)) · m / (√v / √(1−β2ᵗ) + ε)`.

use std::collections::HashMap;

use burn::module::{Module, ParamId};
use burn::tensor::Tensor;

use super::grads::{ParamGrads, update_parameters};

/// AdamW hyper-parameters (torch's defaults except the learning rate).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AdamWConfig {
    /// β1: decay of the first moment.
    pub beta1: f64,
    /// β2: decay of the second moment.
    pub beta2: f64,
    /// ε added to the denominator.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

/// The two moments of one parameter, flattened, on the parameter's device (no autodiff).
#[derive(Debug, Clone)]
pub struct Moments {
    /// m: `[numel]`.
    pub exp_avg: Tensor<1>,
    /// v: `[numel]`.
    pub exp_avg_sq: Tensor<1>,
}

/// AdamW and its state.
#[derive(Debug, Clone)]
pub struct AdamW {
    /// Hyper-parameters.
    pub config: AdamWConfig,
    /// Steps taken so far.
    pub steps: u64,
    moments: HashMap<ParamId, Moments>,
    /// Between [`AdamW::begin_step`] and [`AdamW::finish_step`]: GPU updates queued to be
    /// launched a group at a time.
    pending: Pending,
    /// Every gradient of the current step is taken as `g · grad_factor` (gradient clipping's
    /// factor, applied inside the update instead of as a pass of its own; 1 for none).
    grad_factor: f64,
}

impl AdamW {
    /// A fresh optimizer (no state until the first step).
    pub fn new(config: AdamWConfig) -> Self {
        AdamW {
            config,
            steps: 0,
            moments: HashMap::new(),
            pending: Pending::default(),
            grad_factor: 1.0,
        }
    }

    /// Updates every parameter of `module` that has a gradient in `grads`, with learning rate
    /// `lr`, and returns the updated module. Parameters without a gradient are untouched.
    pub fn step<M: Module>(&mut self, module: M, grads: &ParamGrads, lr: f64) -> M {
        self.begin_step();
        self.group_updates();
        let module = update_parameters(module, grads, |id, p, g| self.update(id, p, g, lr));
        self.finish_step();
        module
    }

    /// Counts one more step (the bias corrections use it); [`AdamW::update`] then updates
    /// each parameter of that step.
    pub fn begin_step(&mut self) {
        self.steps += 1;
    }

    /// From here to [`AdamW::finish_step`], [`AdamW::update`] may queue GPU updates and launch
    /// them a group at a time; whoever calls this must call `finish_step` before the
    /// parameters or moments are read.
    pub fn group_updates(&mut self) {
        self.pending.open = true;
    }

    /// Launches the GPU updates still queued (see [`AdamW::group_updates`]); the parameters
    /// and moments of the step hold their values from here on.
    pub fn finish_step(&mut self) {
        self.pending.flush();
        self.pending.open = false;
        // The step's uploaded scalars are not held past it: a buffer allocated after a step was
        // recorded and held across its replays could alias the graph's intermediates.
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        {
            self.pending.uploaded = None;
        }
    }

    /// One parameter's update: `p` and `g` are `[numel]` on the device its moments live on.
    /// On the CPU backends (f32) it runs as one parallel pass over the values
    /// ([`super::fused_adamw`]); on a GPU as one cubecl kernel (`kernels/gpu/adamw.rs`), which
    /// between [`AdamW::group_updates`] and [`AdamW::finish_step`] takes
    /// `kernels::gpu::adamw::GROUP` parameters a launch where the device binds enough buffers
    /// (the tensors returned are then written by the time the step finishes); elsewhere as
    /// burn's tensor ops.
    pub fn update(&mut self, id: ParamId, p: Tensor<1>, g: Tensor<1>, lr: f64) -> Tensor<1> {
        let scalars = self.scalars(lr);
        let state = self.moments.remove(&id);
        let pending = &mut self.pending;
        let (p, moments) = match super::fused_adamw::update(p, g, state, &scalars)
            .or_else(|(p, g, state)| on_gpu(p, g, state, &scalars, pending))
        {
            Ok(updated) => updated,
            Err((p, g, state)) => update_with_tensor_ops(p, g, state, &scalars),
        };
        self.moments.insert(id, moments);
        p
    }

    /// The scalars of the current step at learning rate `lr`.
    fn scalars(&self, lr: f64) -> StepScalars {
        let (c, t) = (self.config, self.steps as i32);
        StepScalars {
            decay: 1.0 - lr * c.weight_decay,
            one_minus_beta1: 1.0 - c.beta1,
            beta2: c.beta2,
            one_minus_beta2: 1.0 - c.beta2,
            step_size: lr / (1.0 - c.beta1.powi(t)),
            bias_correction2_sqrt: (1.0 - c.beta2.powi(t)).sqrt(),
            eps: c.eps,
            grad_factor: self.grad_factor,
        }
    }

    /// With `true`, a GPU step's updates (between [`AdamW::group_updates`] and
    /// [`AdamW::finish_step`], where the device binds a group's buffers) are written over the
    /// parameters and moments themselves instead of into new buffers, moments starting at
    /// zeros: what a step captured as a device graph needs, since its replays read the
    /// buffers they recorded. The values are the same either way.
    pub fn set_in_place(&mut self, in_place: bool) {
        self.pending.in_place = in_place;
    }

    /// One update of every parameter of `module` with a gradient in `grads`, written in place
    /// ([`AdamW::set_in_place`] must be on) with the scalars read from the device tensor
    /// `scalars` (`[kernels::gpu::adamw::DEVICE_SCALARS]`, f32): a step recorded as a device
    /// graph, whose learning rate, bias corrections and clipping factor change each replay.
    /// The caller counts the step ([`AdamW::begin_step`]) before each replay. An error where a
    /// parameter would not be updated in place (it would then be a new buffer each replay).
    pub fn step_on_device<M: Module>(
        &mut self,
        module: M,
        grads: &ParamGrads,
        scalars: &Tensor<1>,
    ) -> crate::error::Result<M> {
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        {
            let device_scalars = scalars
                .clone()
                .try_into_primitive::<burn::backend::Cube>()
                .ok()
                .filter(|_| self.pending.in_place);
            let Some(device_scalars) = device_scalars else {
                return Err(crate::error::Error::Internal(
                    "AdamW's device scalars need an in-place GPU update".into(),
                ));
            };
            self.pending.device_scalars = Some(device_scalars);
            self.pending.in_place_updates = 0;
            self.group_updates();
            let mut updated = 0;
            let module = update_parameters(module, grads, |id, p, g| {
                updated += 1;
                self.update(id, p, g, 0.0)
            });
            self.finish_step();
            let in_place = self.pending.in_place_updates;
            self.pending.device_scalars = None;
            if in_place != updated {
                return Err(crate::error::Error::Internal(format!(
                    "{} of {updated} parameters were not updated in place",
                    updated - in_place
                )));
            }
            Ok(module)
        }
        #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
        {
            let _ = (module, grads, scalars);
            Err(crate::error::Error::Internal(
                "AdamW's device scalars need a GPU backend".into(),
            ))
        }
    }

    /// This step's scalars at `lr` as the first seven of `kernels::gpu::adamw::DEVICE_SCALARS`
    /// (the gradient's factor and apply come after them), f32.
    pub fn host_scalars(&self, lr: f64) -> [f32; 7] {
        let s = self.scalars(lr);
        [
            s.decay as f32,
            s.one_minus_beta1 as f32,
            s.beta2 as f32,
            s.one_minus_beta2 as f32,
            s.step_size as f32,
            s.bias_correction2_sqrt as f32,
            s.eps as f32,
        ]
    }

    /// Until the next call, every update takes its gradient as `g · factor` (1: as given).
    /// The update multiplies each value as it reads it, in f32, as `g * factor` on the tensor
    /// would: the same values as scaling the gradients first, without a pass over them.
    pub fn set_grad_factor(&mut self, factor: f64) {
        self.grad_factor = factor;
    }

    /// The moments of a parameter, if it has been stepped.
    pub fn moments(&self, id: ParamId) -> Option<&Moments> {
        self.moments.get(&id)
    }

    /// Sets the moments of a parameter (resuming from a checkpoint).
    pub fn set_moments(&mut self, id: ParamId, moments: Moments) {
        self.moments.insert(id, moments);
    }

    /// Bytes of optimizer state held: 8 per trainable value (two f32 moments).
    pub fn state_bytes(&self) -> u64 {
        self.moments
            .values()
            .map(|m| 4 * (m.exp_avg.dims()[0] + m.exp_avg_sq.dims()[0]) as u64)
            .sum()
    }
}

/// The scalars of one step, as both implementations of the update use them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StepScalars {
    /// `1 − lr·wd` (decoupled weight decay).
    pub decay: f64,
    /// `1 − β1`: how far m moves toward g.
    pub one_minus_beta1: f64,
    /// β2.
    pub beta2: f64,
    /// `1 − β2`.
    pub one_minus_beta2: f64,
    /// `lr / (1 − β1ᵗ)`.
    pub step_size: f64,
    /// `√(1 − β2ᵗ)`.
    pub bias_correction2_sqrt: f64,
    /// ε.
    pub eps: f64,
    /// The gradient is taken as `g · grad_factor` (gradient clipping; 1 for none).
    pub grad_factor: f64,
}

/// The update as burn tensor ops (any device; fresh moments are zeros):
/// `p·decay − step_size · m / (√v / √(1−β2ᵗ) + ε)`.
/// The update as one kernel launch on a cubecl backend (wgpu, WebGPU, CUDA): every tensor
/// f32, contiguous, on the same GPU device. The inputs back otherwise.
fn on_gpu(
    p: Tensor<1>,
    g: Tensor<1>,
    state: Option<Moments>,
    s: &StepScalars,
    pending: &mut Pending,
) -> Result<(Tensor<1>, Moments), super::fused_adamw::NotFused> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        use crate::kernels::gpu::adamw::{
            AdamWScalars, GroupMember, groups_fit, new_outputs, update,
        };
        use burn::backend::Cube;
        let cube = |t: &Tensor<1>| {
            t.clone()
                .try_into_primitive::<Cube>()
                .ok()
                .filter(|c| c.dtype == burn::tensor::DType::F32 && c.is_contiguous())
        };
        let moments = match &state {
            None => Some(None),
            Some(m) => cube(&m.exp_avg).zip(cube(&m.exp_avg_sq)).map(Some),
        };
        let (Some(param), Some(grad), Some(moments)) = (cube(&p), cube(&g), moments) else {
            return Err((p, g, state));
        };
        if param.device != grad.device {
            return Err((p, g, state));
        }
        let scalars = AdamWScalars {
            decay: s.decay as f32,
            one_minus_beta1: s.one_minus_beta1 as f32,
            beta2: s.beta2 as f32,
            one_minus_beta2: s.one_minus_beta2 as f32,
            step_size: s.step_size as f32,
            bias_correction2_sqrt: s.bias_correction2_sqrt as f32,
            eps: s.eps as f32,
            grad_factor: s.grad_factor as f32,
        };
        if pending.in_place && pending.open && groups_fit(&param) {
            // Written over the parameter and its moments (zeros on the first step): the
            // tensors handed back are the ones given.
            let zeros = || Tensor::<1>::zeros([param.meta.shape().num_elements()], &p.device());
            let state = state.unwrap_or_else(|| Moments {
                exp_avg: zeros(),
                exp_avg_sq: zeros(),
            });
            let (Some(m), Some(v)) = (cube(&state.exp_avg), cube(&state.exp_avg_sq)) else {
                return Err((p, g, Some(state)));
            };
            if pending.device_scalars.is_none() {
                // Op by op: this step's scalars uploaded once, for every group of the step.
                let stale = pending.uploaded.as_ref().is_none_or(|(s, _)| *s != scalars);
                if stale {
                    let values = scalars.device_values().to_vec();
                    let n = values.len();
                    let uploaded: Tensor<1> = crate::device::link::upload(
                        burn::tensor::TensorData::new(values, [n]),
                        &p.device(),
                        crate::device::link::Traffic::Optimizer,
                    );
                    let Some(uploaded) = cube(&uploaded) else {
                        return Err((p, g, Some(state)));
                    };
                    pending.flush();
                    pending.uploaded = Some((scalars, uploaded));
                }
            }
            pending.push_in_place(
                crate::kernels::gpu::adamw::InPlaceMember {
                    p: param,
                    g: grad,
                    m,
                    v,
                },
                scalars,
            );
            return Ok((p, state));
        }
        let (p, m, v) = match pending.open && groups_fit(&param) {
            true => {
                let out = new_outputs(&param);
                let member = GroupMember {
                    p: param,
                    g: grad,
                    moments,
                    out: out.clone(),
                };
                pending.push(member, scalars);
                out
            }
            false => update(param, grad, moments, &scalars),
        };
        Ok((
            Tensor::from_primitive::<Cube>(p),
            Moments {
                exp_avg: Tensor::from_primitive::<Cube>(m),
                exp_avg_sq: Tensor::from_primitive::<Cube>(v),
            },
        ))
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = (s, pending);
        Err((p, g, state))
    }
}

/// GPU updates queued during a step, launched [`crate::kernels::gpu::adamw::GROUP`] at a time: a
/// group is launched when it is full, when the next member differs in its moments (the first
/// step has none), its device or its scalars, and when the step finishes.
#[derive(Clone, Default)]
struct Pending {
    /// Inside a step: updates may be queued.
    open: bool,
    /// Updates are written over the parameters and moments ([`AdamW::set_in_place`]).
    in_place: bool,
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    group: Vec<crate::kernels::gpu::adamw::GroupMember>,
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    in_place_group: Vec<crate::kernels::gpu::adamw::InPlaceMember>,
    /// The in-place updates' scalars on the device, set by [`AdamW::step_on_device`] (a
    /// recorded step's, computed on the device).
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    device_scalars: Option<burn_cubecl::tensor::CubeTensor>,
    /// Op by op: the scalars last uploaded for the in-place updates, and their tensor.
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    uploaded: Option<(
        crate::kernels::gpu::adamw::AdamWScalars,
        burn_cubecl::tensor::CubeTensor,
    )>,
    /// In-place updates queued since the count was last taken.
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    in_place_updates: usize,
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    scalars: Option<crate::kernels::gpu::adamw::AdamWScalars>,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        let queued = self.group.len();
        #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
        let queued = 0;
        f.debug_struct("Pending")
            .field("open", &self.open)
            .field("queued", &queued)
            .finish()
    }
}

impl Pending {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    fn push(
        &mut self,
        member: crate::kernels::gpu::adamw::GroupMember,
        scalars: crate::kernels::gpu::adamw::AdamWScalars,
    ) {
        let fits = self.group.first().is_none_or(|first| {
            first.moments.is_some() == member.moments.is_some()
                && first.p.device == member.p.device
                && self.scalars == Some(scalars)
        });
        if !fits {
            self.flush();
        }
        self.scalars = Some(scalars);
        self.group.push(member);
        if self.group.len() == crate::kernels::gpu::adamw::GROUP {
            self.flush();
        }
    }

    /// Queues an update written in place (see [`Pending::push`]).
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    fn push_in_place(
        &mut self,
        member: crate::kernels::gpu::adamw::InPlaceMember,
        scalars: crate::kernels::gpu::adamw::AdamWScalars,
    ) {
        let fits = self
            .in_place_group
            .first()
            .is_none_or(|first| first.p.device == member.p.device && self.scalars == Some(scalars));
        if !fits {
            self.flush();
        }
        self.scalars = Some(scalars);
        self.in_place_updates += 1;
        self.in_place_group.push(member);
        if self.in_place_group.len() == crate::kernels::gpu::adamw::GROUP {
            self.flush();
        }
    }

    /// Launches the queued group, if any.
    fn flush(&mut self) {
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        if let Some(scalars) = self.scalars.take() {
            let group = std::mem::take(&mut self.group);
            if !group.is_empty() {
                crate::kernels::gpu::adamw::update_group(group, &scalars);
            }
            let group = std::mem::take(&mut self.in_place_group);
            let on_device = self
                .device_scalars
                .as_ref()
                .or(self.uploaded.as_ref().map(|(_, t)| t));
            if let (false, Some(on_device)) = (group.is_empty(), on_device) {
                crate::kernels::gpu::adamw::update_group_in_place(group, on_device);
            }
        }
    }
}

pub(crate) fn update_with_tensor_ops(
    p: Tensor<1>,
    g: Tensor<1>,
    state: Option<Moments>,
    s: &StepScalars,
) -> (Tensor<1>, Moments) {
    let state = state.unwrap_or_else(|| Moments {
        exp_avg: p.zeros_like(),
        exp_avg_sq: p.zeros_like(),
    });
    let g = if s.grad_factor == 1.0 {
        g
    } else {
        g * s.grad_factor
    };
    let p = p * s.decay;
    let m = state.exp_avg.clone() + (g.clone() - state.exp_avg) * s.one_minus_beta1; // lerp toward g
    let v = state.exp_avg_sq * s.beta2 + g.clone() * g * s.one_minus_beta2;
    let denom = v.clone().sqrt() / s.bias_correction2_sqrt + s.eps;
    let p = p - m.clone() / denom * s.step_size;
    (
        p,
        Moments {
            exp_avg: m,
            exp_avg_sq: v,
        },
    )
}
