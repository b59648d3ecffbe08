//! A bias-free linear layer in Hugging Face layout: `y = x Wᵀ` with `W: [out, in]`.
//!
//! burn's own `nn::Linear` stores `[in, out]`; keeping HF's layout means checkpoints load
//! without a transpose and LoRA/NF4 shapes read the same as in peft and bitsandbytes.

use burn::module::{Module, Param};
use burn::tensor::{Device, Distribution, Tensor};

/// `y = x Wᵀ`.
#[derive(Module, Debug)]
pub struct Linear {
    /// `[out, in]`.
    pub weight: Param<Tensor<2>>,
}

impl Linear {
    /// Wraps an existing `[out, in]` weight.
    pub fn from_weight(weight: Tensor<2>) -> Self {
        Linear {
            weight: Param::from_tensor(weight),
        }
    }

    /// A fresh layer with HF's initialisation, N(0, 0.02).
    pub fn init(out_features: usize, in_features: usize, device: &Device) -> Self {
        let weight = Tensor::random(
            [out_features, in_features],
            Distribution::Normal(0.0, 0.02),
            device,
        );
        Self::from_weight(weight)
    }

    /// `[out, in]`.
    pub fn dims(&self) -> [usize; 2] {
        self.weight.shape().dims()
    }

    /// # Shapes
    /// - `x`: `[B, T, in]` → `[B, T, out]`
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let [b, t, d_in] = x.dims();
        let [d_out, _] = self.dims();
        // One 2-D GEMM over all tokens is faster than a batched one on every backend.
        let y = x
            .reshape([b * t, d_in])
            .matmul(self.weight.val().transpose()); // [B·T, out]
        y.reshape([b, t, d_out])
    }
}
