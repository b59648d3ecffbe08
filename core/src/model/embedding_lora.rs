//! A LoRA adapter on the token embedding, as peft's `Embedding` layer: each token's row of the
//! frozen table `E: [V, D]` gains `s · Aᵀ[id] Bᵀ`, with `A: [r, V]` (`lora_embedding_A`) and
//! `B: [D, r]` (`lora_embedding_B`). No dropout (peft applies none to token ids). peft starts
//! A at zero and B ~ N(0, 1), so the adapted model starts equal to the base.

use burn::module::{Module, Param};
use burn::tensor::{Device, Distribution, Int, Tensor, module::embedding};

use super::autocast::linear_matmul;

/// The low-rank pair of the embedding.
#[derive(Module, Debug)]
pub struct EmbeddingLora {
    /// A: `[r, V]`.
    pub lora_a: Param<Tensor<2>>,
    /// B: `[D, r]`.
    pub lora_b: Param<Tensor<2>>,
    /// s = α/r (or α/√r).
    pub scaling: f64,
}

impl EmbeddingLora {
    /// peft's initialisation: A = 0, B ~ N(0, 1). Call `device.seed(..)` first to fix B.
    pub fn init(vocab: usize, dim: usize, r: usize, scaling: f64, device: &Device) -> Self {
        let a = Tensor::zeros([r, vocab], device);
        let b = Tensor::random([dim, r], Distribution::Normal(0.0, 1.0), device);
        Self::from_weights(a, b, scaling)
    }

    /// An adapter with given A `[r, V]` and B `[D, r]`.
    pub fn from_weights(a: Tensor<2>, b: Tensor<2>, scaling: f64) -> Self {
        EmbeddingLora {
            lora_a: Param::from_tensor(a),
            lora_b: Param::from_tensor(b),
            scaling,
        }
    }

    /// The adapter's part of each token's embedding, `s · Aᵀ[id] Bᵀ`.
    ///
    /// # Shapes
    /// - `ids`: `[B, T]` → `[B, T, D]` (through `[B·T, r]`)
    pub fn forward(&self, ids: Tensor<2, Int>) -> Tensor<3> {
        let [b, t] = ids.dims();
        let rows = embedding(self.lora_a.val().transpose(), ids); // [B, T, r]
        let r = rows.dims()[2];
        let dim = self.lora_b.dims()[0];
        let rows = rows.reshape([b * t, r]) * self.scaling; // [B·T, r]
        linear_matmul(rows, self.lora_b.val()).reshape([b, t, dim]) // [B, T, D]
    }

    /// `s · (B A)ᵀ`: the `[V, D]` update merging adds to the embedding table.
    pub fn delta_weight(&self) -> Tensor<2> {
        self.lora_a
            .val()
            .transpose()
            .matmul(self.lora_b.val().transpose())
            * self.scaling
    }
}
