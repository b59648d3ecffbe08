//! Causal-LM cross-entropy with Hugging Face's conventions: logits at position t predict the
//! label at t+1, and labels equal to [`IGNORE_INDEX`] do not count.
//!
//! The loss is returned as a sum and a token count, so gradient accumulation can weight
//! micro-batches by their number of label tokens (see `train/`).

use burn::tensor::{Int, Tensor, TensorData, activation::log_softmax};

use crate::device::link::{self, Traffic};
use crate::error::{Error, Result};
use crate::kernels::cpu::fused::cross_entropy::{ShiftedLabels, summed_nll};

/// Labels with this value are skipped (PyTorch's `ignore_index`).
pub const IGNORE_INDEX: i64 = -100;

/// The summed negative log-likelihood of a batch and how many label tokens it covers.
#[derive(Debug, Clone)]
pub struct LossSum {
    /// `[1]`: Σ −log p(label) over the counted tokens.
    pub sum: Tensor<1>,
    /// How many labels counted (not [`IGNORE_INDEX`], not the first position).
    pub tokens: usize,
}

impl LossSum {
    /// The HF loss: mean over counted tokens (NaN-free: 0 when nothing counts).
    pub fn mean(&self) -> Tensor<1> {
        self.sum.clone() / self.tokens.max(1) as f64
    }
}

/// Shifted cross-entropy.
///
/// # Shapes
/// - `logits`: `[B, T, V]`
/// - `labels`: `B·T` values, row-major `[B, T]`
pub fn causal_lm_loss(logits: Tensor<3>, labels: &[i64]) -> Result<LossSum> {
    let [b, t, v] = logits.dims();
    if labels.len() != b * t {
        return Err(Error::Input(format!(
            "{} labels for logits of shape [{b}, {t}, {v}]: expected {}",
            labels.len(),
            b * t
        )));
    }
    if t < 2 {
        return Err(Error::Input(
            "a causal-LM loss needs sequences of at least 2 tokens".into(),
        ));
    }
    // Targets: labels shifted left by one; ignored ones point at class 0 with weight 0.
    let mut targets = Vec::with_capacity(b * (t - 1));
    let mut weights = Vec::with_capacity(b * (t - 1));
    for row in labels.chunks(t) {
        for &label in &row[1..] {
            if label == IGNORE_INDEX {
                targets.push(0u32);
                weights.push(0.0f32);
            } else if label < 0 || label as usize >= v {
                return Err(Error::Input(format!(
                    "label {label} is outside the vocabulary of {v}"
                )));
            } else {
                targets.push(label as u32);
                weights.push(1.0);
            }
        }
    }
    let tokens = weights.iter().filter(|&&w| w > 0.0).count();
    let shifted = ShiftedLabels {
        targets: targets.into(),
        weights: weights.into(),
    };
    let logits = match summed_nll(logits, &shifted) {
        Ok(sum) => return Ok(LossSum { sum, tokens }),
        Err(logits) => logits,
    };
    let device = logits.device();
    // The GPU backends: the same sum and keeps as cubecl kernels, the labels uploaded as two f32
    // tensors (the bytes burn's ops upload for them).
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    let logits = if crate::device::is_gpu(&device) && logits.dtype() == burn::tensor::DType::F32 {
        let rows = b * (t - 1);
        let classes: Vec<f32> = shifted.targets.iter().map(|&c| c as f32).collect();
        let upload = |values: Vec<f32>| -> Tensor<1> {
            link::upload(TensorData::new(values, [rows]), &device, Traffic::Data)
        };
        let (classes, weights) = (upload(classes), upload(shifted.weights.to_vec()));
        match crate::kernels::gpu::fused::cross_entropy::summed_nll(logits, &classes, &weights) {
            Ok(sum) => return Ok(LossSum { sum, tokens }),
            Err(logits) => logits,
        }
    } else {
        logits
    };
    // Other backends: the same sum with burn's ops.
    let targets: Vec<i64> = shifted.targets.iter().map(|&c| i64::from(c)).collect();
    let targets: Tensor<3, Int> = link::upload(
        TensorData::new(targets, [b, t - 1, 1]),
        &device,
        Traffic::Data,
    );
    let weights: Tensor<3> = link::upload(
        TensorData::new(shifted.weights.to_vec(), [b, t - 1, 1]),
        &device,
        Traffic::Data,
    );
    let log_probs = log_softmax(logits.narrow(1, 0, t - 1), 2); // [B, T−1, V]
    let picked = log_probs.gather(2, targets); // [B, T−1, 1]
    let sum = (picked * weights).sum().neg(); // [1]
    Ok(LossSum { sum, tokens })
}
