//! The SwiGLU feed-forward network: `down(silu(gate(x)) ⊙ up(x))`.

use burn::module::Module;
use burn::tensor::{Device, Tensor};

use super::linear::Linear;
use crate::config::LlamaConfig;
use crate::kernels::swiglu;

/// The MLP half of a decoder block.
#[derive(Module, Debug)]
pub struct Mlp {
    /// `[F, D]`.
    pub gate_proj: Linear,
    /// `[F, D]`.
    pub up_proj: Linear,
    /// `[D, F]`.
    pub down_proj: Linear,
}

impl Mlp {
    /// Fresh projections with HF's N(0, 0.02) initialisation.
    pub fn init(config: &LlamaConfig, device: &Device) -> Self {
        let (d, f) = (config.hidden_size, config.intermediate_size);
        Mlp {
            gate_proj: Linear::init(f, d, device),
            up_proj: Linear::init(f, d, device),
            down_proj: Linear::init(d, f, device),
        }
    }

    /// # Shapes
    /// - `x`: `[B, T, D]` → `[B, T, D]` (through `[B, T, F]`)
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let gate = self.gate_proj.forward(x.clone()); // [B, T, F]
        let up = self.up_proj.forward(x); // [B, T, F]
        // Generation's new token on a GPU: one launch instead of eight.
        let hidden = match crate::kernels::gpu::swiglu_rows::few_rows(&gate, &up) {
            Some(hidden) => hidden,
            None => swiglu(gate, up),
        };
        self.down_proj.forward(hidden)
    }
}
