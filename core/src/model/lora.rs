//! A LoRA adapter: `Δy = s · (dropout(x) Aᵀ) Bᵀ` with `A: [r, in]`, `B: [out, r]`.
//!
//! Only A and B are trainable; the frozen base output is added unscaled (the classic bug of
//! scaling `base + BAx` as a whole is what the merge-by-value test guards against).
//!
//! DoRA (Liu et al. 2024; peft's `use_dora`) adds a trainable magnitude `m: [out]`: the
//! adapted weight `W + s·BA` is used by direction only, each output row rescaled to `m`,
//! `y = (m / ‖W + s·BA‖) ⊙ (x Wᵀ + s·(x Aᵀ) Bᵀ)` (row norms over the input axis, taken without
//! a gradient as peft takes them). With dropout in training, peft rescales the dropped input's
//! path and keeps the undropped base: `y = x Wᵀ + f ⊙ (x_d Wᵀ + s·(x_d Aᵀ) Bᵀ) − x_d Wᵀ`,
//! `f = m / ‖W + s·BA‖`.

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
    /// DoRA's magnitude `m`: `[out]`, peft's `lora_magnitude_vector` (None: plain LoRA).
    pub magnitude: Option<Param<Tensor<1>>>,
    /// With DoRA, the frozen base's squared row norms `‖W_o‖²`, `[out]` (not trained).
    pub base_row_squares: Option<Param<Tensor<1>>>,
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
            magnitude: None,
            base_row_squares: None,
        }
    }

    /// The same adapter as DoRA over base `weight` (`[out, in]`), with magnitude `m`
    /// (`[out]`); the base's squared row norms are kept beside it (see [`Self::dora_norm`]).
    pub fn with_dora(mut self, magnitude: Tensor<1>, weight: Tensor<2>) -> Self {
        let autodiff = weight.is_autodiff();
        let [out, _] = weight.dims();
        let squares = weight.inner().powf_scalar(2.0).sum_dim(1).reshape([out]); // [out]
        let squares = match autodiff {
            true => Tensor::from_inner(squares),
            false => squares,
        };
        self.magnitude = Some(Param::from_tensor(magnitude));
        self.base_row_squares = Some(Param::from_tensor(squares).set_require_grad(false));
        self
    }

    /// `‖W + s·BA‖` over each output row of base `weight` (`[out, in]`), computed whole: DoRA's
    /// initial magnitude (with B = 0, the base's norms, as peft initialises it) and the merge.
    pub fn direct_norm(&self, weight: Tensor<2>) -> Tensor<1> {
        let autodiff = weight.is_autodiff();
        let delta = self.lora_b.val().inner().matmul(self.lora_a.val().inner()) * self.scaling; // [out, in]
        let adapted = weight.inner() + delta; // [out, in]
        let [out, _] = adapted.dims();
        let norm = adapted.powf_scalar(2.0).sum_dim(1).sqrt().reshape([out]); // [out]
        match autodiff {
            true => Tensor::from_inner(norm),
            false => norm,
        }
    }

    /// `‖W + s·BA‖` over each output row without the `[out, in]` matrix (peft builds it, and
    /// `W + s·BA` beside it: two weight-sized buffers per adapted linear and forward):
    /// `‖W_o‖² + 2s·B_o·(A W_oᵀ) + s²·B_o (A Aᵀ) B_oᵀ`, from the base's squared row norms (kept),
    /// one product `A·Wᵀ` through the base (`product`: `x ↦ x·Wᵀ`, so an NF4 base's codes
    /// serve) and `[out, r]`-sized terms. Without a graph, as peft's norm is detached.
    ///
    /// # Shapes
    /// - `product`: `[r, in]` → `[r, out]`; returns `[out]`
    pub fn dora_norm(&self, product: impl Fn(Tensor<2>) -> Tensor<2>) -> Option<Tensor<1>> {
        let squares = self.base_row_squares.as_ref()?.val();
        let autodiff = squares.is_autodiff();
        let (a, b) = (self.lora_a.val().inner(), self.lora_b.val().inner()); // [r, in], [out, r]
        let [out, _] = b.dims();
        let s = self.scaling;
        // A on the model's own backend (an untracked value where a graph is kept), so the base's
        // product runs as it runs for the inputs, with no conversion of the weight.
        let a_in = match autodiff {
            true => Tensor::from_inner(a.clone()),
            false => a.clone(),
        };
        let a_wt = product(a_in).inner(); // [r, out]
        let cross = (b.clone() * a_wt.transpose()).sum_dim(1).reshape([out]); // [out]
        let gram = a.clone().matmul(a.transpose()); // [r, r]
        let quad = (b.clone().matmul(gram) * b).sum_dim(1).reshape([out]); // [out]
        let norm = (squares.inner() + cross * (2.0 * s) + quad * (s * s)).sqrt(); // [out]
        Some(match autodiff {
            true => Tensor::from_inner(norm),
            false => norm,
        })
    }

    /// The weight this adapter makes of base `weight` (`[out, in]`), merged by value:
    /// `W + s·BA`, or for DoRA `(m / ‖W + s·BA‖) ⊙ (W + s·BA)` (peft's `merge`).
    pub fn merged_weight(&self, weight: Tensor<2>) -> Tensor<2> {
        let factor = self
            .magnitude
            .as_ref()
            .map(|m| m.val().detach() / self.direct_norm(weight.clone()));
        let adapted = weight + self.delta_weight(); // [out, in]
        match factor {
            Some(f) => adapted * f.unsqueeze_dim::<2>(1), // [out, 1]
            None => adapted,
        }
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
        linear_matmul(self.dropped(x).0, self.lora_a.val())
    }

    /// DoRA's output for `x` whose base product is `base` (`[N, out]`), with `product`
    /// computing `x·Wᵀ` for the norm's `A·Wᵀ` and a dropped input (see the module's note).
    ///
    /// # Shapes
    /// - `base`: `[N, out]`, `x`: `[N, in]` → `[N, out]`
    pub fn dora_output(
        &self,
        base: Tensor<2>,
        x: Tensor<2>,
        product: impl Fn(Tensor<2>) -> Tensor<2>,
    ) -> Tensor<2> {
        let (Some(magnitude), Some(norm)) = (self.magnitude.as_ref(), self.dora_norm(&product))
        else {
            return self.add_to(base, x);
        };
        let factor = (magnitude.val() / norm).unsqueeze_dim::<2>(0); // [1, out]
        let (dropped, applied) = self.dropped(x);
        let low = linear_matmul(
            linear_matmul(dropped.clone(), self.lora_a.val()),
            self.lora_b.val(),
        ) * self.scaling; // [N, out]
        if !applied {
            return (base + low) * factor;
        }
        let dropped_base = product(dropped); // [N, out]
        base + (dropped_base.clone() + low) * factor - dropped_base
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
    ///
    /// Also says whether a mask was applied (DoRA takes another path then).
    fn dropped(&self, x: Tensor<2>) -> (Tensor<2>, bool) {
        let p = self.dropout.prob;
        if p == 0.0 {
            return (x, false);
        }
        match dropout_draw::next_seed() {
            Some(seed) => {
                x.device().seed(seed);
                let keep = x.random_like(Distribution::Bernoulli(1.0 - p));
                (x * keep * (1.0 / (1.0 - p)), true)
            }
            None => {
                // burn's rule (`Dropout::forward`): a mask in training on an autodiff device.
                let applies = self.dropout.training.is_enabled() && x.device().is_autodiff();
                (self.dropout.forward(x), applies)
            }
        }
    }

    /// s · B A: the dense `[out, in]` update that merging adds to the base weight.
    pub fn delta_weight(&self) -> Tensor<2> {
        self.lora_b.val().matmul(self.lora_a.val()) * self.scaling
    }
}
