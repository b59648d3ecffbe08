//! SGD with momentum, PyTorch's semantics (`torch.optim.SGD`, dampening 0, not Nesterov):
//! `g ← g + wd·p; b ← μ·b + g (b = g at the first step); p ← p − lr·b`.
//! State: one f32 buffer per trainable value (4 bytes), none without momentum.

use std::collections::HashMap;

use burn::module::{Module, ModuleMapper, Param, ParamId};
use burn::tensor::Tensor;

use super::grads::ParamGrads;

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
        module.map(&mut SgdUpdate {
            optim: self,
            grads,
            lr,
        })
    }

    /// Bytes of state: the momentum buffers.
    pub fn state_bytes(&self) -> u64 {
        self.buffers.values().map(|b| 4 * b.dims()[0] as u64).sum()
    }
}

struct SgdUpdate<'a> {
    optim: &'a mut Sgd,
    grads: &'a ParamGrads,
    lr: f64,
}

impl ModuleMapper for SgdUpdate<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let id = param.id;
        let Some(grad) = self.grads.get(id).cloned() else {
            return param;
        };
        let value = param.val();
        let dims = value.dims();
        let n = dims.iter().product::<usize>();
        let p = value.inner().reshape([n]); // [numel]
        let mut g = grad;
        if self.optim.weight_decay != 0.0 {
            g = g + p.clone() * self.optim.weight_decay;
        }
        let direction = if self.optim.momentum != 0.0 {
            let buffer = match self.optim.buffers.remove(&id) {
                Some(b) => b * self.optim.momentum + g,
                None => g,
            };
            self.optim.buffers.insert(id, buffer.clone());
            buffer
        } else {
            g
        };
        let p = p - direction * self.lr;
        param.map(|_| Tensor::from_inner(p.reshape(dims)).require_grad())
    }
}
