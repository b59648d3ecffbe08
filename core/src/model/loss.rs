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
    let shifted = shift_labels(logits.dims(), labels, None)?;
    let tokens = shifted.weights.iter().filter(|&&w| w > 0.0).count();
    let sum = weighted_nll(logits, &shifted)?;
    Ok(LossSum { sum, tokens })
}

/// `Σ wₜ·(−log p(labelₜ))`: the shifted cross-entropy with a weight of its own on every label,
/// the surrogate whose backward gives a sequence-level objective's gradient (a preference
/// loss weighs each token by its sequence's share, `train/preference.rs`). Ignored labels
/// count nothing whatever their weight.
///
/// # Shapes
/// - `logits`: `[B, T, V]` → `[1]`
/// - `labels`, `weights`: `B·T` values, row-major `[B, T]` (a label's weight sits beside it)
pub fn weighted_lm_loss(logits: Tensor<3>, labels: &[i64], weights: &[f32]) -> Result<Tensor<1>> {
    let shifted = shift_labels(logits.dims(), labels, Some(weights))?;
    weighted_nll(logits, &shifted)
}

/// `log p(labelₜ)` under the logits at `t − 1`, for every label (0 at each row's first
/// position and at ignored labels), read back to the host. Runs outside any graph: the fused
/// kernels read the logits in place (CPU) or write two `[B·T]` buffers (GPU); elsewhere burn's
/// log-softmax makes its `[B, T − 1, V]` transients.
///
/// # Shapes
/// - `logits`: `[B, T, V]`; `labels`: `B·T` → `B·T` values, row-major `[B, T]`
pub fn label_log_probs(logits: Tensor<3>, labels: &[i64]) -> Result<Vec<f32>> {
    let [b, t, v] = logits.dims();
    let shifted = shift_labels([b, t, v], labels, None)?;
    // Per logits row `r·T + p` (p < T − 1): the log-probability of label `r·T + p + 1`.
    let per_row = row_log_probs(logits, &shifted)?;
    let mut out = vec![0.0; b * t];
    for row in 0..b {
        for pos in 1..t {
            if shifted.weights[row * (t - 1) + pos - 1] != 0.0 {
                out[row * t + pos] = per_row[row * t + pos - 1];
            }
        }
    }
    Ok(out)
}

/// `log p(label)` at every logits row that predicts a counted label (0 elsewhere), outside
/// any graph: row `b·T + t` predicting label `b·(T − 1) + t` of `shifted`.
///
/// # Shapes
/// - `logits`: `[B, T, V]` → `B·T` values
pub(super) fn row_log_probs(logits: Tensor<3>, shifted: &ShiftedLabels) -> Result<Vec<f32>> {
    match crate::kernels::cpu::fused::cross_entropy::label_log_probs(&logits, shifted) {
        Some(values) => Ok(values),
        None => rows_by_ops(logits, shifted),
    }
}

/// [`label_log_probs`]' per-row values off the CPU: the cubecl kernel's `[B·T]` NLLs on a GPU,
/// burn's log-softmax and gather elsewhere.
fn rows_by_ops(logits: Tensor<3>, shifted: &ShiftedLabels) -> Result<Vec<f32>> {
    let [b, t, _] = logits.dims();
    let logits = logits.inner();
    let device = logits.device();
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    let logits = if crate::device::is_gpu(&device) && logits.dtype() == burn::tensor::DType::F32 {
        let (classes, weights) = uploaded_labels(shifted, b * (t - 1), &device);
        match crate::kernels::gpu::fused::cross_entropy::row_nll(logits, &classes, &weights) {
            // Counted rows weigh 1: the NLL is −log p.
            Ok(nll) => {
                return Ok(crate::kernels::values::to_f32_vec(nll)
                    .into_iter()
                    .map(|x| -x)
                    .collect());
            }
            Err(logits) => logits,
        }
    } else {
        logits
    };
    let targets: Vec<i64> = shifted.targets.iter().map(|&c| i64::from(c)).collect();
    let targets: Tensor<3, Int> = link::upload(
        TensorData::new(targets, [b, t - 1, 1]),
        &device,
        Traffic::Data,
    );
    let log_probs = log_softmax(logits.narrow(1, 0, t - 1), 2); // [B, T−1, V]
    let picked = crate::kernels::values::to_f32_vec(log_probs.gather(2, targets)); // [B·(T−1)]
    // Laid out as the logits' rows: row `r·T + p` for p < T − 1, 0 at each row's last.
    let mut per_row = vec![0.0; b * t];
    for row in 0..b {
        per_row[row * t..row * t + t - 1]
            .copy_from_slice(&picked[row * (t - 1)..(row + 1) * (t - 1)]);
    }
    Ok(per_row)
}

/// The targets and weights the loss reads: labels shifted left by one; ignored ones point at
/// class 0 with weight 0; the others weigh 1, or `weights`' value beside the label.
pub(super) fn shift_labels(
    [b, t, v]: [usize; 3],
    labels: &[i64],
    weights: Option<&[f32]>,
) -> Result<ShiftedLabels> {
    if labels.len() != b * t || weights.is_some_and(|w| w.len() != b * t) {
        return Err(Error::Input(format!(
            "{} labels and {} weights for logits of shape [{b}, {t}, {v}]: expected {} each",
            labels.len(),
            weights.map_or(labels.len(), <[f32]>::len),
            b * t
        )));
    }
    if t < 2 {
        return Err(Error::Input(
            "a causal-LM loss needs sequences of at least 2 tokens".into(),
        ));
    }
    let mut targets = Vec::with_capacity(b * (t - 1));
    let mut shifted_weights = Vec::with_capacity(b * (t - 1));
    for (r, row) in labels.chunks(t).enumerate() {
        for (pos, &label) in row.iter().enumerate().skip(1) {
            if label == IGNORE_INDEX {
                targets.push(0u32);
                shifted_weights.push(0.0f32);
            } else if label < 0 || label as usize >= v {
                return Err(Error::Input(format!(
                    "label {label} is outside the vocabulary of {v}"
                )));
            } else {
                targets.push(label as u32);
                shifted_weights.push(weights.map_or(1.0, |w| w[r * t + pos]));
            }
        }
    }
    Ok(ShiftedLabels {
        targets: targets.into(),
        weights: shifted_weights.into(),
    })
}

/// `Σ w·(−log softmax(x)[label])` over the first `T − 1` positions: the fused kernel where
/// the logits allow it, burn's ops elsewhere.
pub(super) fn weighted_nll(logits: Tensor<3>, shifted: &ShiftedLabels) -> Result<Tensor<1>> {
    let [b, t, _] = logits.dims();
    let logits = match summed_nll(logits, shifted) {
        Ok(sum) => return Ok(sum),
        Err(logits) => logits,
    };
    let device = logits.device();
    // The GPU backends: the same sum and keeps as cubecl kernels, the labels uploaded as two f32
    // tensors (the bytes burn's ops upload for them).
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    let logits = if crate::device::is_gpu(&device) && logits.dtype() == burn::tensor::DType::F32 {
        let (classes, weights) = uploaded_labels(shifted, b * (t - 1), &device);
        match crate::kernels::gpu::fused::cross_entropy::summed_nll(logits, &classes, &weights) {
            Ok(sum) => return Ok(sum),
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
    Ok((picked * weights).sum().neg()) // [1]
}

/// The shifted labels as the GPU kernels take them: two f32 `[rows]` tensors on `device`, the
/// class (exact in f32 below 2²⁴) and its weight (the bytes burn's ops upload for them).
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn uploaded_labels(
    shifted: &ShiftedLabels,
    rows: usize,
    device: &burn::tensor::Device,
) -> (Tensor<1>, Tensor<1>) {
    let [classes, weights] = columns(shifted, rows);
    let upload = |data| -> Tensor<1> { link::upload(data, device, Traffic::Data) };
    (upload(classes), upload(weights))
}

/// The GPU loss kernel's two label columns, `[rows]` f32 each: the class (exact in f32 below
/// 2²⁴; 0 where ignored) and the weight.
pub(super) fn columns(labels: &ShiftedLabels, rows: usize) -> [TensorData; 2] {
    let classes: Vec<f32> = labels.targets.iter().map(|&c| c as f32).collect();
    [
        TensorData::new(classes, [rows]),
        TensorData::new(labels.weights.to_vec(), [rows]),
    ]
}

/// The label columns the GPU loss kernel reads for logits of shape `dims` (`[B, T, V]`), every
/// counted label weighing `weight`: a captured step's loss is then `Σ weight·(−log p)`, its
/// token-weighted share of the step with no scalar baked into the graph. `[B·(T − 1)]` f32
/// each, or with `per_logits_row` (the chunked loss, `model/chunked_loss.rs`) `[B·T]`, a class
/// and a weight per logits row, weight 0 on each sequence's last row.
pub(crate) fn weighted_label_columns(
    dims: [usize; 3],
    labels: &[i64],
    weight: f32,
    per_logits_row: bool,
) -> Result<[TensorData; 2]> {
    let [b, t, _] = dims;
    let weights = vec![weight; labels.len()];
    let shifted = shift_labels(dims, labels, Some(&weights))?;
    Ok(match per_logits_row {
        true => columns(&super::chunked_loss::row_labels(&shifted, b, t), b * t),
        false => columns(&shifted, b * t.saturating_sub(1)),
    })
}

/// `Σ w·(−log p(label))` by the GPU loss kernel, from label columns already on the device
/// ([`weighted_label_columns`]'s); an error where the kernel does not take the logits (not f32
/// on a cubecl device).
pub(crate) fn summed_nll_on_device(
    logits: Tensor<3>,
    classes: &Tensor<1>,
    weights: &Tensor<1>,
) -> Result<Tensor<1>> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    let outcome = crate::kernels::gpu::fused::cross_entropy::summed_nll(logits, classes, weights);
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    let outcome: std::result::Result<Tensor<1>, Tensor<3>> = {
        let _ = (classes, weights);
        Err(logits)
    };
    outcome.map_err(|logits| {
        Error::Input(format!(
            "the GPU loss kernel does not take {:?} logits on this device",
            logits.dtype()
        ))
    })
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Distribution, Tensor, activation::log_softmax};

    use super::{IGNORE_INDEX, label_log_probs, weighted_lm_loss};
    use crate::device::DeviceKind;
    use crate::kernels::values::{scalar, to_f32_vec};

    /// The fused read of each label's log-probability equals burn's log-softmax at the label,
    /// on every CPU backend, tracked or not; the first position and ignored labels read 0; and
    /// weighting the loss by −1 per token gives minus their sum.
    #[test]
    fn label_log_probs_are_the_log_softmax_at_each_label() {
        let (b, t, v) = (2, 6, 300);
        let labels: Vec<i64> = vec![
            3,
            17,
            299,
            0,
            42,
            7, //
            IGNORE_INDEX,
            5,
            5,
            IGNORE_INDEX,
            250,
            1,
        ];
        for kind in DeviceKind::cpu_backends() {
            for device in [kind.open().unwrap(), kind.open().unwrap().autodiff()] {
                let logits =
                    Tensor::<3>::random([b, t, v], Distribution::Normal(0.0, 3.0), &device);
                let got = label_log_probs(logits.clone(), &labels).unwrap();
                let log_probs = to_f32_vec(log_softmax(logits.clone(), 2));
                for row in 0..b {
                    for pos in 0..t {
                        let label = labels[row * t + pos];
                        let want = if pos == 0 || label == IGNORE_INDEX {
                            0.0
                        } else {
                            log_probs[(row * t + pos - 1) * v + label as usize]
                        };
                        let have = got[row * t + pos];
                        assert!(
                            (have - want).abs() < 1e-5,
                            "{kind} [{row}, {pos}]: {have} vs {want}"
                        );
                    }
                }
                let weights = vec![-1.0; b * t];
                let surrogate = scalar(weighted_lm_loss(logits, &labels, &weights).unwrap());
                let sum: f32 = got.iter().sum();
                assert!(
                    (surrogate - sum).abs() < 1e-4,
                    "{kind}: {surrogate} vs {sum}"
                );
            }
        }
    }
}
