//! SGD with momentum, PyTorch's semantics (`torch.optim.SGD`, dampening 0, not Nesterov):
//! `g ← g + wd·p; b ← μ·b + g (b = g at the first step); p ← p − lr·b`.
//! State: one f32 buffer per trainable value (4 bytes), none without momentum.

use std::collections::HashMap;

use burn::module::{Module, ParamId};
use burn::tensor::Tensor;

use super::grads::{ParamGrads, update_parameters};

/// SGD and its momentum buffers.
#[derive(Debug, Clone)]
pub struct Sgd {
    /// μ (0: plain SGD, no state).
    pub momentum: f64,
    /// Coupled weight decay (added to the gradient, as torch does).
    pub weight_decay: f64,
    /// Steps taken so far.
    pub steps: u64,
    pub(crate) buffers: HashMap<ParamId, Tensor<1>>,
}

impl Sgd {
    /// A fresh optimizer.
    pub fn new(momentum: f64, weight_decay: f64) -> Self {
        Sgd {
            momentum,
            weight_decay,
            steps: 0,
            buffers: HashMap::new(),
        }
    }

    /// One step over every parameter of `module` with a gradient.
    pub fn step<M: Module>(&mut self, module: M, grads: &ParamGrads, lr: f64) -> M {
        self.begin_step();
        update_parameters(module, grads, |id, p, g| self.update(id, p, g, lr))
    }

    /// Counts one more step.
    pub fn begin_step(&mut self) {
        self.steps += 1;
    }

    /// One parameter's update: `p` and `g` are `[numel]` on the device its buffer lives on.
    pub fn update(&mut self, id: ParamId, p: Tensor<1>, mut g: Tensor<1>, lr: f64) -> Tensor<1> {
        if self.weight_decay != 0.0 {
            g = g + p.clone() * self.weight_decay;
        }
        let direction = if self.momentum != 0.0 {
            let buffer = match self.buffers.remove(&id) {
                Some(b) => b * self.momentum + g,
                None => g,
            };
            self.buffers.insert(id, buffer.clone());
            buffer
        } else {
            g
        };
        p - direction * lr
    }

    /// Bytes of state: the momentum buffers.
    pub fn state_bytes(&self) -> u64 {
        self.buffers.values().map(|b| 4 * b.dims()[0] as u64).sum()
    }
}
