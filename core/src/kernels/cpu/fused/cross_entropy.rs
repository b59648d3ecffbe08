//! The causal-LM cross-entropy over the logits in one op: per counted row, the log-sum-exp
//! and the label's logit, summed with the label weights.
//!
//! - forward: `Σ_rows w·(lse − x[label])`, with `lse = m + ln Σ exp(x − m)`, `m` the row's
//!   maximum; keeps the logits and one `lse` per row (burn's log-softmax keeps the shifted
//!   logits, a copy of the same size, and the row sums);
//! - backward: `∂x = ∂loss·w·(exp(x − lse) − onehot(label))` on counted rows, 0 on the last
//!   position of each sequence (it predicts nothing), written over the kept logits.

use std::sync::Arc;

use burn::tensor::{Device, Tensor};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_backend::tensor::FloatTensor;
use burn_dispatch::{DispatchKindConversion, DispatchTensor};
use rayon::prelude::*;

use super::{
    CpuKernel, CpuValues, backend_tensor, exp_in_place, host_values, is_f32, max_of, on_cpu, owned,
    read_on_cpu, sum_of_exp, tracked_or_plain,
};

/// The labels of a batch as the loss reads them: for each row `b` and position `t < T − 1`,
/// the class at `t + 1` and its weight (0: ignored).
#[derive(Debug, Clone)]
pub struct ShiftedLabels {
    /// `[B, T − 1]` class indices (0 where ignored), row-major.
    pub targets: Arc<[u32]>,
    /// `[B, T − 1]` weights, 1 or 0.
    pub weights: Arc<[f32]>,
}

/// `Σ w·(−log softmax(x)[label])` over the first `T − 1` positions, or the logits back when
/// they do not live on a CPU backend in f32.
///
/// # Shapes
/// - `logits`: `[B, T, V]` → `[1]`
pub fn summed_nll(logits: Tensor<3>, labels: &ShiftedLabels) -> Result<Tensor<1>, Tensor<3>> {
    if !is_f32(&logits) {
        return Err(logits);
    }
    on_cpu(&SummedNll { labels }, logits)
}

/// The fused op on one CPU backend.
struct SummedNll<'a> {
    labels: &'a ShiftedLabels,
}

impl CpuKernel for SummedNll<'_> {
    type Inputs = Tensor<3>;
    type Output = Tensor<1>;

    fn on_backend<B: CpuValues>(&self, logits: Tensor<3>) -> Result<Tensor<1>, Tensor<3>>
    where
        DispatchTensor: DispatchKindConversion<B> + DispatchKindConversion<Autodiff<B>>,
    {
        let shape = logits.dims();
        tracked_or_plain::<B, _, _>(
            logits,
            |x| Tensor::from_primitive::<Autodiff<B>>(tracked::<B>(x, shape, self.labels)),
            |x| {
                let (x, device) = host_values::<B, 3>(x);
                let (_, sum) = forward(&x, shape, self.labels);
                Tensor::from_primitive::<B>(backend_tensor::<B, 1>(vec![sum], [1], &device))
            },
        )
    }
}

/// `log p(label)` read at every logits row that predicts a counted label (weight ≠ 0), 0
/// elsewhere, when the logits are f32 on a CPU backend (None otherwise): one pass over the
/// logits in place, with no `[B, T, V]` copy (burn's log-softmax writes two). A graph the
/// logits belong to is not touched.
///
/// # Shapes
/// - `logits`: `[B, T, V]` → `B·T` values, row `b·T + t` predicting label `b·(T − 1) + t`
pub fn label_log_probs(logits: &Tensor<3>, labels: &ShiftedLabels) -> Option<Vec<f32>> {
    let shape = logits.dims();
    let plain = logits.clone().inner();
    read_on_cpu(&[&plain], |values| {
        values[0]
            .par_chunks(shape[2])
            .enumerate()
            .map(|(row, x)| match label_of(row, shape[1], labels) {
                Some((target, weight)) if weight != 0.0 => {
                    let max = max_of(x);
                    x[target] - (max + sum_of_exp(x, max).ln())
                }
                _ => 0.0,
            })
            .collect()
    })
}

/// Where row `row` of the `[B·T, V]` logits finds its label: `Some((target, weight))` for
/// positions before the last of their sequence.
fn label_of(row: usize, seq: usize, labels: &ShiftedLabels) -> Option<(usize, f32)> {
    let (b, t) = (row / seq, row % seq);
    (t + 1 < seq).then(|| {
        let i = b * (seq - 1) + t;
        (labels.targets[i] as usize, labels.weights[i])
    })
}

/// Each row's log-sum-exp (0 on rows that predict nothing) and the summed weighted NLL.
pub fn forward(
    logits: &[f32],
    [_, seq, vocab]: [usize; 3],
    labels: &ShiftedLabels,
) -> (Vec<f32>, f32) {
    let per_row: Vec<(f32, f64)> = logits
        .par_chunks(vocab)
        .enumerate()
        .map(|(row, x)| match label_of(row, seq, labels) {
            Some((target, weight)) => {
                let max = max_of(x);
                let sum = sum_of_exp(x, max);
                let lse = max + sum.ln();
                (lse, f64::from(weight) * f64::from(lse - x[target]))
            }
            None => (0.0, 0.0),
        })
        .collect();
    let total = per_row.iter().map(|&(_, nll)| nll).sum::<f64>();
    (
        per_row.into_iter().map(|(lse, _)| lse).collect(),
        total as f32,
    )
}

/// Overwrites the logits with `∂loss/∂logits` for an upstream `grad_sum`.
pub fn backward_in_place(
    logits: &mut [f32],
    lse: &[f32],
    [_, seq, vocab]: [usize; 3],
    labels: &ShiftedLabels,
    grad_sum: f32,
) {
    logits
        .par_chunks_mut(vocab)
        .enumerate()
        .for_each(|(row, x)| match label_of(row, seq, labels) {
            Some((target, weight)) if weight != 0.0 => {
                let scale = grad_sum * weight;
                exp_in_place(x, lse[row], scale);
                x[target] -= scale;
            }
            _ => x.fill(0.0),
        });
}

/// The kept logits, the row log-sum-exps, the labels, the shape and the device.
type Saved = (
    Arc<Vec<f32>>,
    Arc<Vec<f32>>,
    ShiftedLabels,
    [usize; 3],
    Device,
);

#[derive(Debug)]
struct CrossEntropyBackward;

impl<B: CpuValues> Backward<B, 1> for CrossEntropyBackward
where
    DispatchTensor: DispatchKindConversion<B>,
{
    type State = Saved;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (logits, lse, labels, shape, device) = ops.state;
        let (grad_sum, _) = host_values::<B, 1>(grads.consume::<B>(&ops.node));
        let [parent] = ops.parents;
        let Some(node) = parent else { return };
        let mut grad = owned(logits);
        backward_in_place(&mut grad, &lse, shape, &labels, grad_sum[0]);
        grads.register::<B>(node.id, backend_tensor::<B, 3>(grad, shape, &device));
    }
}

fn tracked<B: CpuValues>(
    logits: FloatTensor<Autodiff<B>>,
    shape: [usize; 3],
    labels: &ShiftedLabels,
) -> FloatTensor<Autodiff<B>>
where
    DispatchTensor: DispatchKindConversion<B>,
{
    let prep = CrossEntropyBackward
        .prepare::<NoCheckpointing>([logits.node()])
        .compute_bound()
        .stateful();
    let (x, device) = host_values::<B, 3>(logits.into_primitive());
    let (lse, sum) = forward(&x, shape, labels);
    let out = backend_tensor::<B, 1>(vec![sum], [1], &device);
    match prep {
        OpsKind::Tracked(prep) => prep.finish(
            (Arc::new(x), Arc::new(lse), labels.clone(), shape, device),
            out,
        ),
        OpsKind::UnTracked(prep) => prep.finish(out),
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Distribution, Int, Tensor, TensorData, activation::log_softmax};

    use super::{ShiftedLabels, summed_nll};
    use crate::device::DeviceKind;
    use crate::kernels::values::{max_abs_diff, scalar};

    /// B = 2, T = 5, V = 3000; the second row ignores two labels.
    fn labels() -> ShiftedLabels {
        let targets: Vec<u32> = vec![7, 2999, 0, 1500, 42, 0, 0, 2048];
        let weights = vec![1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0];
        ShiftedLabels {
            targets: targets.into(),
            weights: weights.into(),
        }
    }

    /// burn's log-softmax, gather and weighted sum.
    fn reference(logits: Tensor<3>, labels: &ShiftedLabels) -> Tensor<1> {
        let [b, t, _] = logits.dims();
        let device = logits.device();
        let targets: Vec<i64> = labels.targets.iter().map(|&c| i64::from(c)).collect();
        let targets = Tensor::<3, Int>::from_data(TensorData::new(targets, [b, t - 1, 1]), &device);
        let weights = Tensor::<3>::from_data(
            TensorData::new(labels.weights.to_vec(), [b, t - 1, 1]),
            &device,
        );
        let picked = log_softmax(logits.narrow(1, 0, t - 1), 2).gather(2, targets);
        (picked * weights).sum().neg()
    }

    /// The sum and the logits' gradient (under an upstream factor of 0.37) match burn's ops on
    /// every CPU backend, with and without a graph; the last position's gradient is 0.
    #[test]
    fn sum_and_gradient_match_burns_log_softmax() {
        let labels = labels();
        for kind in DeviceKind::cpu_backends() {
            let device = kind.open().unwrap().autodiff();
            let x0 = Tensor::<3>::random([2, 5, 3000], Distribution::Normal(0.0, 4.0), &device);
            let run = |fused: bool| {
                let x = x0.clone().require_grad();
                let sum = if fused {
                    summed_nll(x.clone(), &labels).unwrap()
                } else {
                    reference(x.clone(), &labels)
                };
                let grads = (sum.clone() * 0.37).backward();
                (scalar(sum.inner()), x.grad(&grads).unwrap())
            };
            let ((sum, grad), (sum_ref, grad_ref)) = (run(true), run(false));
            assert!(
                (sum - sum_ref).abs() < 1e-3 * sum_ref.abs(),
                "{kind}: {sum} vs {sum_ref}"
            );
            // Gradients are at most 0.37 in size; f32 rounding of a log-sum-exp near 16 is 1e-6.
            let diff = max_abs_diff(grad.clone(), grad_ref);
            assert!(diff < 1e-5, "{kind}: gradient off by {diff}");
            let last = grad.narrow(1, 4, 1).abs().max();
            assert_eq!(scalar(last.reshape([1])), 0.0);

            let plain = kind.open().unwrap();
            let x = Tensor::<3>::from_data(x0.clone().into_data(), &plain);
            let untracked = scalar(summed_nll(x, &labels).unwrap());
            assert!((untracked - sum_ref).abs() < 1e-3 * sum_ref.abs(), "{kind}");
        }
    }
}
