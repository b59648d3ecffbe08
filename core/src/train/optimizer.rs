//! The optimizer a run uses, chosen by name, and its state as named tensors for checkpoints.
//!
//! State is keyed by the trainable parameters' order in the module tree (burn's parameter ids
//! are fresh each time a model is loaded), with shapes checked on resume.

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::tensor::{Device, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use super::adamw::{AdamW, AdamWConfig, Moments};
use super::adamw8bit::{AdamW8bit, Moments8};
use super::grads::{ParamGrads, update_parameters};
use super::offload::HostOffload;
use super::sgd::Sgd;
pub use crate::config::OptimizerKind;
use crate::error::{Error, Result};
use crate::kernels::values::to_f32_vec;
use crate::quant::blockwise8::Blockwise8;

/// Hyper-parameters of every optimizer (each reads the ones it uses).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OptimizerConfig {
    /// Which optimizer.
    pub kind: OptimizerKind,
    /// AdamW's β1, β2, ε and weight decay (SGD uses the weight decay).
    pub adamw: AdamWConfig,
    /// SGD momentum.
    pub momentum: f64,
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        OptimizerConfig {
            kind: OptimizerKind::AdamW,
            adamw: AdamWConfig::default(),
            momentum: 0.9,
        }
    }
}

/// A running optimizer: its update rule, and where its state lives (beside the parameters,
/// or in host memory with [`HostOffload`]).
#[derive(Debug, Clone)]
pub struct Optimizer {
    rule: UpdateRule,
    offload: Option<HostOffload>,
}

/// The update rule and its state.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // one per optimizer
pub enum UpdateRule {
    /// f32 AdamW.
    AdamW(AdamW),
    /// 8-bit AdamW.
    AdamW8bit(AdamW8bit),
    /// SGD with momentum.
    Sgd(Sgd),
}

/// One tensor of optimizer state, for a checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct StateTensor {
    /// `{parameter ordinal}.{field}`.
    pub name: String,
    /// The values.
    pub data: StateData,
}

/// The values of a state tensor.
#[derive(Debug, Clone, PartialEq)]
pub enum StateData {
    /// f32 values.
    F32(Vec<f32>),
    /// 8-bit codes.
    U8(Vec<u8>),
}

impl UpdateRule {
    fn begin_step(&mut self) {
        match self {
            UpdateRule::AdamW(o) => o.begin_step(),
            UpdateRule::AdamW8bit(o) => o.begin_step(),
            UpdateRule::Sgd(o) => o.begin_step(),
        }
    }

    /// Ends a step: AdamW launches the GPU updates it queued (`AdamW::group_updates`).
    fn finish_step(&mut self) {
        if let UpdateRule::AdamW(o) = self {
            o.finish_step();
        }
    }

    fn update(&mut self, id: ParamId, p: Tensor<1>, g: Tensor<1>, lr: f64) -> Tensor<1> {
        match self {
            UpdateRule::AdamW(o) => o.update(id, p, g, lr),
            UpdateRule::AdamW8bit(o) => o.update(id, p, g, lr),
            UpdateRule::Sgd(o) => o.update(id, p, g, lr),
        }
    }
}

impl Optimizer {
    /// A fresh optimizer whose state lives beside the parameters.
    pub fn new(config: &OptimizerConfig) -> Self {
        let rule = match config.kind {
            OptimizerKind::AdamW => UpdateRule::AdamW(AdamW::new(config.adamw)),
            OptimizerKind::AdamW8bit => UpdateRule::AdamW8bit(AdamW8bit::new(config.adamw)),
            OptimizerKind::Sgd => {
                UpdateRule::Sgd(Sgd::new(config.momentum, config.adamw.weight_decay))
            }
        };
        Optimizer {
            rule,
            offload: None,
        }
    }

    /// A fresh optimizer whose state, and an f32 master copy of every trainable parameter,
    /// live on `host`: each step sends the gradients there, updates there, and sends the new
    /// values back (ZeRO-Offload on one device).
    pub fn offloaded(config: &OptimizerConfig, host: Device) -> Self {
        Optimizer {
            offload: Some(HostOffload::new(host)),
            ..Optimizer::new(config)
        }
    }

    /// AdamW, when it is the rule and its state lives beside the parameters.
    pub fn adamw_mut(&mut self) -> Option<&mut AdamW> {
        match (&mut self.rule, &self.offload) {
            (UpdateRule::AdamW(o), None) => Some(o),
            _ => None,
        }
    }

    /// The update rule and its state.
    pub fn rule(&self) -> &UpdateRule {
        &self.rule
    }

    /// The host half of an offloaded optimizer.
    pub fn offload(&self) -> Option<&HostOffload> {
        self.offload.as_ref()
    }

    /// The device the state lives on, for a model on `model_device` (its host when offloaded).
    pub fn state_device(&self, model_device: &Device) -> Device {
        self.offload
            .as_ref()
            .map_or_else(|| model_device.clone(), |o| o.host().clone())
    }

    /// One update of every parameter with a gradient.
    pub fn step<M: Module>(&mut self, module: M, grads: &ParamGrads, lr: f64) -> M {
        self.step_scaled(module, grads, lr, 1.0)
    }

    /// One update of every parameter with a gradient, each gradient taken as `g · factor`
    /// (gradient clipping's factor). AdamW multiplies each value as it reads it (no pass of
    /// its own over the gradients: on a GPU that was a launch per tensor); the other rules
    /// scale each gradient before their update. Either way the values are those of `g * factor`.
    pub fn step_scaled<M: Module>(
        &mut self,
        module: M,
        grads: &ParamGrads,
        lr: f64,
        factor: f64,
    ) -> M {
        self.rule.begin_step();
        let rule = &mut self.rule;
        let folds = match rule {
            UpdateRule::AdamW(o) => {
                o.set_grad_factor(factor);
                true
            }
            _ => false,
        };
        let scaled = |g: Tensor<1>| {
            if folds || factor == 1.0 {
                g
            } else {
                g * factor
            }
        };
        let module = match &mut self.offload {
            None => {
                if let UpdateRule::AdamW(o) = rule {
                    o.group_updates();
                }
                update_parameters(module, grads, |id, p, g| rule.update(id, p, scaled(g), lr))
            }
            Some(host) => update_parameters(module, grads, |id, p, g| {
                host.update(id, p, g, |p, g| rule.update(id, p, scaled(g), lr))
            }),
        };
        self.rule.finish_step();
        if let UpdateRule::AdamW(o) = &mut self.rule {
            o.set_grad_factor(1.0);
        }
        module
    }

    /// Switches AdamW on a GPU `device` to writing each update over the parameters and
    /// moments (`AdamW::set_in_place`), what a replayed step needs. False (nothing changed)
    /// for another rule, an offloaded optimizer, or a device that binds too few buffers.
    pub fn update_in_place(&mut self, device: &Device) -> bool {
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        if let (UpdateRule::AdamW(o), None) = (&mut self.rule, &self.offload)
            && crate::kernels::gpu::adamw::groups_fit_on(&device.clone().inner())
        {
            o.set_in_place(true);
            return true;
        }
        let _ = device;
        false
    }

    /// Whether a step reads values back to the host: 8-bit AdamW quantizes its moments there,
    /// an offloaded optimizer updates there. A caller that must not block on a device read
    /// (the browser on WebGPU) cannot use these.
    pub fn reads_back(&self) -> bool {
        matches!(self.rule, UpdateRule::AdamW8bit(_)) || self.offload.is_some()
    }

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        match &self.rule {
            UpdateRule::AdamW(o) => o.steps,
            UpdateRule::AdamW8bit(o) => o.steps,
            UpdateRule::Sgd(o) => o.steps,
        }
    }

    /// Bytes of state held (wherever it lives).
    pub fn state_bytes(&self) -> u64 {
        match &self.rule {
            UpdateRule::AdamW(o) => o.state_bytes(),
            UpdateRule::AdamW8bit(o) => o.state_bytes(),
            UpdateRule::Sgd(o) => o.state_bytes(),
        }
    }

    /// The state as named tensors; `ids` are the trainable parameters in module order
    /// ([`trainable_ids`]).
    pub fn export_state(&self, ids: &[(ParamId, Vec<usize>)]) -> Vec<StateTensor> {
        let mut out = Vec::new();
        let mut push = |name: String, data: StateData| out.push(StateTensor { name, data });
        for (i, (id, _)) in ids.iter().enumerate() {
            match &self.rule {
                UpdateRule::AdamW(o) => {
                    if let Some(m) = o.moments(*id) {
                        push(
                            format!("{i}.exp_avg"),
                            StateData::F32(to_f32_vec(m.exp_avg.clone())),
                        );
                        push(
                            format!("{i}.exp_avg_sq"),
                            StateData::F32(to_f32_vec(m.exp_avg_sq.clone())),
                        );
                    }
                }
                UpdateRule::AdamW8bit(o) => match o.moments.get(id) {
                    Some(Moments8::Quantized {
                        exp_avg,
                        exp_avg_sq,
                    }) => {
                        push(
                            format!("{i}.exp_avg.codes"),
                            StateData::U8(exp_avg.codes.clone()),
                        );
                        push(
                            format!("{i}.exp_avg.absmax"),
                            StateData::F32(exp_avg.absmax.clone()),
                        );
                        push(
                            format!("{i}.exp_avg_sq.codes"),
                            StateData::U8(exp_avg_sq.codes.clone()),
                        );
                        push(
                            format!("{i}.exp_avg_sq.absmax"),
                            StateData::F32(exp_avg_sq.absmax.clone()),
                        );
                    }
                    Some(Moments8::Full {
                        exp_avg,
                        exp_avg_sq,
                    }) => {
                        push(format!("{i}.exp_avg"), StateData::F32(exp_avg.clone()));
                        push(
                            format!("{i}.exp_avg_sq"),
                            StateData::F32(exp_avg_sq.clone()),
                        );
                    }
                    None => {}
                },
                UpdateRule::Sgd(o) => {
                    if let Some(b) = o.buffers.get(id) {
                        push(
                            format!("{i}.momentum"),
                            StateData::F32(to_f32_vec(b.clone())),
                        );
                    }
                }
            }
        }
        out
    }

    /// Restores state written by [`Optimizer::export_state`] for the same trainable
    /// parameters of a model on `model_device`, and the step count. An offloaded optimizer
    /// puts it on its host (the master copies are taken again at the next step).
    pub fn import_state(
        &mut self,
        ids: &[(ParamId, Vec<usize>)],
        model_device: &Device,
        state: &[StateTensor],
        steps: u64,
    ) -> Result<()> {
        let device = &self.state_device(model_device);
        let find = |name: String| state.iter().find(|t| t.name == name).map(|t| &t.data);
        let f32s = |name: String, n: usize| -> Result<Option<Vec<f32>>> {
            match find(name.clone()) {
                None => Ok(None),
                Some(StateData::F32(v)) if v.len() == n => Ok(Some(v.clone())),
                Some(_) => Err(Error::Input(format!(
                    "optimizer state `{name}`: expected {n} f32 values"
                ))),
            }
        };
        let u8s = |name: String, n: usize| -> Result<Option<Vec<u8>>> {
            match find(name.clone()) {
                None => Ok(None),
                Some(StateData::U8(v)) if v.len() == n => Ok(Some(v.clone())),
                Some(_) => Err(Error::Input(format!(
                    "optimizer state `{name}`: expected {n} 8-bit codes"
                ))),
            }
        };
        let tensor = |v: Vec<f32>| {
            let n = v.len();
            Tensor::<1>::from_data(TensorData::new(v, [n]), device)
        };
        for (i, (id, shape)) in ids.iter().enumerate() {
            let n: usize = shape.iter().product();
            match &mut self.rule {
                UpdateRule::AdamW(o) => {
                    o.steps = steps;
                    if let (Some(m), Some(v)) = (
                        f32s(format!("{i}.exp_avg"), n)?,
                        f32s(format!("{i}.exp_avg_sq"), n)?,
                    ) {
                        o.set_moments(
                            *id,
                            Moments {
                                exp_avg: tensor(m),
                                exp_avg_sq: tensor(v),
                            },
                        );
                    }
                }
                UpdateRule::AdamW8bit(o) => {
                    o.steps = steps;
                    let blocks = n.div_ceil(crate::quant::blockwise8::STATE_BLOCK);
                    if let (Some(mc), Some(ma), Some(vc), Some(va)) = (
                        u8s(format!("{i}.exp_avg.codes"), n)?,
                        f32s(format!("{i}.exp_avg.absmax"), blocks)?,
                        u8s(format!("{i}.exp_avg_sq.codes"), n)?,
                        f32s(format!("{i}.exp_avg_sq.absmax"), blocks)?,
                    ) {
                        o.moments.insert(
                            *id,
                            Moments8::Quantized {
                                exp_avg: Blockwise8 {
                                    codes: mc,
                                    absmax: ma,
                                },
                                exp_avg_sq: Blockwise8 {
                                    codes: vc,
                                    absmax: va,
                                },
                            },
                        );
                    } else if let (Some(m), Some(v)) = (
                        f32s(format!("{i}.exp_avg"), n)?,
                        f32s(format!("{i}.exp_avg_sq"), n)?,
                    ) {
                        o.moments.insert(
                            *id,
                            Moments8::Full {
                                exp_avg: m,
                                exp_avg_sq: v,
                            },
                        );
                    }
                }
                UpdateRule::Sgd(o) => {
                    o.steps = steps;
                    if let Some(b) = f32s(format!("{i}.momentum"), n)? {
                        o.buffers.insert(*id, tensor(b));
                    }
                }
            }
        }
        Ok(())
    }
}

/// The trainable (gradient-requiring) float parameters of `module`, in module order, with
/// their shapes.
pub fn trainable_ids<M: Module>(module: &M) -> Vec<(ParamId, Vec<usize>)> {
    struct Ids(Vec<(ParamId, Vec<usize>)>);
    impl ModuleVisitor for Ids {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let value = param.val();
            if value.is_require_grad() {
                self.0.push((param.id, value.dims().to_vec()));
            }
        }
    }
    let mut ids = Ids(Vec::new());
    module.visit(&mut ids);
    ids.0
}
