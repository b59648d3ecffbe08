//! 8-bit AdamW as bitsandbytes' `AdamW8bit` does it: both moments are stored blockwise
//! quantized ([`Blockwise8`], 256 values per f32 absmax), the first with the signed dynamic
//! map, the second with the unsigned one. Each step dequantizes the moments, performs the
//! ordinary AdamW update in f32, and quantizes them again.
//!
//! State bytes per trainable value: 2 + 8/256 ≈ 2.03 instead of 8. Like bitsandbytes
//! (`min_8bit_size = 4096`), tensors with fewer than [`MIN_8BIT_SIZE`] values keep f32 moments.
//!
//! The update runs on the host (the moments live there as bytes), so on a GPU it also
//! behaves like an offloaded optimizer.

use std::collections::HashMap;

use burn::module::{Module, ParamId};
use burn::tensor::{Tensor, TensorData};

use super::adamw::AdamWConfig;
use super::grads::{ParamGrads, update_parameters};
use crate::kernels::values::to_f32_vec;
use crate::quant::blockwise8::Blockwise8;
use crate::quant::dynamic_map::{dynamic_map_signed, dynamic_map_unsigned};

pub use crate::quant::blockwise8::MIN_8BIT_SIZE;

/// The moments of one parameter.
#[derive(Debug, Clone, PartialEq)]
pub enum Moments8 {
    /// Quantized m (signed map) and v (unsigned map).
    Quantized {
        /// m.
        exp_avg: Blockwise8,
        /// v.
        exp_avg_sq: Blockwise8,
    },
    /// A small tensor: f32 m and v.
    Full {
        /// m.
        exp_avg: Vec<f32>,
        /// v.
        exp_avg_sq: Vec<f32>,
    },
}

impl Moments8 {
    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        match self {
            Moments8::Quantized {
                exp_avg,
                exp_avg_sq,
            } => exp_avg.bytes() + exp_avg_sq.bytes(),
            Moments8::Full { exp_avg, .. } => 8 * exp_avg.len() as u64,
        }
    }
}

/// 8-bit AdamW and its state.
#[derive(Debug, Clone)]
pub struct AdamW8bit {
    /// Hyper-parameters (as AdamW).
    pub config: AdamWConfig,
    /// Steps taken so far.
    pub steps: u64,
    pub(crate) moments: HashMap<ParamId, Moments8>,
    signed: [f32; 256],
    unsigned: [f32; 256],
}

impl AdamW8bit {
    /// A fresh optimizer.
    pub fn new(config: AdamWConfig) -> Self {
        AdamW8bit {
            config,
            steps: 0,
            moments: HashMap::new(),
            signed: dynamic_map_signed(),
            unsigned: dynamic_map_unsigned(),
        }
    }

    /// One step over every parameter of `module` with a gradient. The update runs on the
    /// host over the dequantized moments.
    pub fn step<M: Module>(&mut self, module: M, grads: &ParamGrads, lr: f64) -> M {
        self.begin_step();
        update_parameters(module, grads, |id, p, g| self.update(id, p, g, lr))
    }

    /// Counts one more step (the bias corrections use it).
    pub fn begin_step(&mut self) {
        self.steps += 1;
    }

    /// One parameter's update: `p` and `g` are `[numel]`; the result is on `p`'s device.
    pub fn update(&mut self, id: ParamId, p: Tensor<1>, g: Tensor<1>, lr: f64) -> Tensor<1> {
        let (c, t) = (self.config, self.steps as i32);
        let (b1, b2) = (c.beta1 as f32, c.beta2 as f32);
        let decay = (1.0 - lr * c.weight_decay) as f32;
        let step_size = (lr / (1.0 - c.beta1.powi(t))) as f32;
        let bias2 = (1.0 - c.beta2.powi(t)).sqrt() as f32;
        let eps = c.eps as f32;
        let device = p.device();
        let mut p = to_f32_vec(p);
        let g = to_f32_vec(g);
        let previous = self.moments.remove(&id);
        let (mut m, mut v) = self.load(previous, p.len());
        for i in 0..p.len() {
            m[i] = b1 * m[i] + (1.0 - b1) * g[i];
            v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
            p[i] = p[i] * decay - step_size * m[i] / (v[i].sqrt() / bias2 + eps);
        }
        let stored = self.store(m, v);
        self.moments.insert(id, stored);
        let n = p.len();
        Tensor::from_data(TensorData::new(p, [n]), &device)
    }

    /// Bytes of state held.
    pub fn state_bytes(&self) -> u64 {
        self.moments.values().map(Moments8::bytes).sum()
    }

    /// Predicted state bytes for a tensor of `n` values.
    pub fn predicted_bytes(n: usize) -> u64 {
        crate::quant::blockwise8::adamw8bit_state_bytes(n)
    }

    fn load(&self, moments: Option<Moments8>, n: usize) -> (Vec<f32>, Vec<f32>) {
        match moments {
            Some(Moments8::Quantized {
                exp_avg,
                exp_avg_sq,
            }) => (
                exp_avg.dequantize(&self.signed),
                exp_avg_sq.dequantize(&self.unsigned),
            ),
            Some(Moments8::Full {
                exp_avg,
                exp_avg_sq,
            }) => (exp_avg, exp_avg_sq),
            None => (vec![0.0; n], vec![0.0; n]),
        }
    }

    fn store(&self, m: Vec<f32>, v: Vec<f32>) -> Moments8 {
        if m.len() < MIN_8BIT_SIZE {
            Moments8::Full {
                exp_avg: m,
                exp_avg_sq: v,
            }
        } else {
            Moments8::Quantized {
                exp_avg: Blockwise8::quantize(&m, &self.signed),
                exp_avg_sq: Blockwise8::quantize(&v, &self.unsigned),
            }
        }
    }
}
