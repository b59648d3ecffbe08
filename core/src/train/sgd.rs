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
        self.steps += 1;
        let (momentum, weight_decay) = (self.momentum, self.weight_decay);
        update_parameters(module, grads, |id, p, mut g| {
            if weight_decay != 0.0 {
                g = g + p.clone() * weight_decay;
            }
            let direction = if momentum != 0.0 {
                let buffer = match self.buffers.remove(&id) {
                    Some(b) => b * momentum + g,
                    None => g,
                };
                self.buffers.insert(id, buffer.clone());
                buffer
            } else {
                g
            };
            p - direction * lr
        })
    }

    /// Bytes of state: the momentum buffers.
    pub fn state_bytes(&self) -> u64 {
        self.buffers.values().map(|b| 4 * b.dims()[0] as u64).sum()
    }
}
