//! A LoRA adapter: `Δy = s · (dropout(x) Aᵀ) Bᵀ` with `A: [r, in]`, `B: [out, r]`.
//!
//! Only A and B are trainable; the frozen base output is added unscaled (the classic bug of
//! scaling `base + BAx` as a whole is what the merge-by-value test guards against).

use burn::module::{Module, Param};
use burn::nn::{Dropout, DropoutConfig};
use burn::tensor::{Device, Distribution, Tensor};

use super::autocast::linear_matmul;
use super::dropout_draw;

/// The low-rank pair of one adapted linear layer.
#[derive(Module, Debug)]
pub struct LoraAdapter {
    /// A: `[r, in]`, peft's `lora_A.weight`.
    pub lora_a: Param<Tensor<2>>,
    /// B: `[out, r]`, peft's `lora_B.weight`.
    pub lora_b: Param<Tensor<2>>,
    /// s = α/r (or α/√r).
    pub scaling: f64,
    /// Dropout on the adapter's input (training only).
    pub dropout: Dropout,
}

impl LoraAdapter {
    /// peft's default initialisation: A ~ kaiming-uniform(a=√5) = U(−1/√in, 1/√in), B = 0, so
    /// the adapted model starts equal to the base. Call `device.seed(..)` first to fix A.
    pub fn init(
        out: usize,
        inp: usize,
        r: usize,
        scaling: f64,
        dropout: f64,
        device: &Device,
    ) -> Self {
        let bound = 1.0 / (inp as f64).sqrt();
        let a = Tensor::random([r, inp], Distribution::Uniform(-bound, bound), device);
        let b = Tensor::zeros([out, r], device);
        Self::from_weights(a, b, scaling, dropout)
    }

    /// An adapter with given A `[r, in]` and B `[out, r]`.
    pub fn from_weights(a: Tensor<2>, b: Tensor<2>, scaling: f64, dropout: f64) -> Self {
        LoraAdapter {
            lora_a: Param::from_tensor(a),
            lora_b: Param::from_tensor(b),
            scaling,
            dropout: DropoutConfig::new(dropout).init(),
        }
    }

    /// r.
    pub fn rank(&self) -> usize {
        self.lora_a.shape().dims::<2>()[0]
    }

    /// `s · B(A x)`, with the scaling applied to the `[N, r]` product rather than the
    /// `[N, out]` one (the same values; r/out of the work, forward and backward).
    ///
    /// # Shapes
    /// - `x`: `[N, in]` → `[N, out]` (through `[N, r]`)
    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        linear_matmul(self.down(x) * self.scaling, self.lora_b.val()) // [N, out]
    }

    /// `base + s · B(A x)`: on a GPU one fused sum with the scale on the `[N, out]` product
    /// (peft's order; `kernels::gpu::fused::scaled_add`), elsewhere [`LoraAdapter::forward`]
    /// added to `base`.
    ///
    /// # Shapes
    /// - `base`: `[N, out]`, `x`: `[N, in]` → `[N, out]`
    pub fn add_to(&self, base: Tensor<2>, x: Tensor<2>) -> Tensor<2> {
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        if crate::device::is_gpu(&base.device()) && base.dtype() == burn::tensor::DType::F32 {
            let low = linear_matmul(self.down(x), self.lora_b.val()); // [N, out]
            return match crate::kernels::gpu::fused::scaled_add::add_scaled(base, low, self.scaling)
            {
                Ok(y) => y,
                Err((base, low)) => base + low * self.scaling,
            };
        }
        base + self.forward(x)
    }

    /// The first half of the path, `dropout(x) Aᵀ`.
    ///
    /// # Shapes
    /// - `x`: `[N, in]` → `[N, r]`
    pub fn down(&self, x: Tensor<2>) -> Tensor<2> {
        linear_matmul(self.dropped(x), self.lora_a.val())
    }

    /// Dropout on the adapter's input. In a training step ([`dropout_draw::drawing`]) the mask
    /// is the stream's next draw, so a checkpointed block's recomputation drops what its first
    /// forward dropped; the step's graph-free forward drops too (its model is `valid()`, whose
    /// dropout flag burn clears). Elsewhere burn's `Dropout`: a mask only where a backward is
    /// possible. The ops are burn's, in its order (`x · mask`, then `· 1/(1 − p)`): what they
    /// keep for the backward is what the predictor replays.
    ///
    /// # Shapes
    /// - `x`: `[N, in]` → `[N, in]`
    fn dropped(&self, x: Tensor<2>) -> Tensor<2> {
        let p = self.dropout.prob;
        if p == 0.0 {
            return x;
        }
        match dropout_draw::next_seed() {
            Some(seed) => {
                x.device().seed(seed);
                let keep = x.random_like(Distribution::Bernoulli(1.0 - p));
                x * keep * (1.0 / (1.0 - p))
            }
            None => self.dropout.forward(x),
        }
    }

    /// s · B A: the dense `[out, in]` update that merging adds to the base weight.
    pub fn delta_weight(&self) -> Tensor<2> {
        self.lora_b.val().matmul(self.lora_a.val()) * self.scaling
    }
}
