//! Gradients of the trainable parameters, keyed by parameter id, that can be summed across
//! several backward passes (micro-batches, checkpointed segments) before an optimizer step.

use std::collections::HashMap;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::{Gradients, IndexingUpdateOp, Int, Tensor, TensorData};

use rayon::prelude::*;

use crate::config::Kernels;
use crate::kernels::cpu::fused::{VALUES_PER_TASK, is_f32, kernels_on, read_on_cpu};
use crate::kernels::values::scalar;

/// Zeros of `shape` on `rows`' device and dtype. On the CPU backends in f32 they are a
/// `Vec<f32>` handed over as it is: burn Flex's own `zeros` allocates its buffer twice (a
/// `vec![0u8]` copied into an aligned one), a second `[V, D]` for an embedding's gradient
/// (measured: an untied SmolLM2-shaped slice's step peak 1.44× the prediction on Flex).
fn zeros_like_rows(shape: [usize; 2], rows: &Tensor<2>) -> Tensor<2> {
    let device = rows.device();
    if is_f32(rows) && kernels_on(&device) == Kernels::FusedCpu {
        let values = vec![0.0f32; shape[0] * shape[1]];
        return Tensor::from_data(TensorData::new(values, shape), &device);
    }
    Tensor::zeros(shape, (&device, rows.dtype()))
}

/// Flattened `[numel]` gradients on the parameters' device (outside autodiff).
#[derive(Debug, Clone, Default)]
pub struct ParamGrads {
    grads: HashMap<ParamId, Tensor<1>>,
}

impl ParamGrads {
    /// No gradients yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The gradients `grads` holds for the parameters of `module`, taken out of it: a
    /// gradient left shared with `grads` made burn Flex copy it when flattened, so every
    /// gradient existed twice at the end of a backward (measured: tiny-smol full fine-tuning,
    /// T = 64, step peak 7.42 MB against 5.26 MB once taken out).
    pub fn from_backward<M: Module>(module: &M, grads: &mut Gradients) -> Self {
        let mut collect = Collect {
            grads,
            out: ParamGrads::new(),
        };
        module.visit(&mut collect);
        collect.out
    }

    /// Adds `other` into `self`, parameter by parameter.
    pub fn add(&mut self, other: ParamGrads) {
        use std::collections::hash_map::Entry;
        // In place: removing and re-inserting leaves tombstones that made the map rehash into
        // twice the buckets (measured: +20 KB for 56 LoRA tensors, each bucket holds a tensor).
        for (id, g) in other.grads {
            match self.grads.entry(id) {
                Entry::Occupied(mut acc) => {
                    let sum = acc.get().clone() + g;
                    acc.insert(sum);
                }
                Entry::Vacant(slot) => {
                    slot.insert(g);
                }
            }
        }
    }

    /// Adds row `i` of `rows` into row `indices[i]` of the gradient of the `[R, W]` parameter
    /// `id` (an embedding's backward: `∂E[idsᵢ] += ∂xᵢ`), starting from zeros when it has none
    /// yet. The accumulator is updated in place on the CPU backends when nothing else holds it.
    ///
    /// # Shapes
    /// - `shape`: `[R, W]`; `indices`: `[N]`, each `< R`; `rows`: `[N, W]`
    pub fn add_rows(
        &mut self,
        id: ParamId,
        shape: [usize; 2],
        indices: Tensor<1, Int>,
        rows: Tensor<2>,
    ) {
        let accumulator = match self.grads.remove(&id) {
            Some(g) => g.reshape(shape),
            None => zeros_like_rows(shape, &rows),
        };
        let sum = accumulator.select_assign(0, indices, rows, IndexingUpdateOp::Add);
        self.grads.insert(id, sum.reshape([shape[0] * shape[1]]));
    }

    /// Sets one parameter's gradient (flattened).
    pub fn insert(&mut self, id: ParamId, grad: Tensor<1>) {
        self.grads.insert(id, grad);
    }

    /// One parameter's gradient (flattened), if it has one.
    pub fn get(&self, id: ParamId) -> Option<&Tensor<1>> {
        self.grads.get(&id)
    }

    /// How many parameters have a gradient.
    pub fn len(&self) -> usize {
        self.grads.len()
    }

    /// Every gradient, in no particular order.
    pub fn tensors(&self) -> impl Iterator<Item = &Tensor<1>> {
        self.grads.values()
    }

    /// Whether no parameter has a gradient.
    pub fn is_empty(&self) -> bool {
        self.grads.is_empty()
    }

    /// The global L2 norm over every gradient, `√Σ g²`: summed in f64 on the CPU backends, in
    /// f32 on a GPU (one kernel for six tensors, one read: `kernels/gpu/sum_of_squares.rs`).
    pub fn global_norm(&self) -> f64 {
        let grads: Vec<&Tensor<1>> = self.grads.values().collect();
        crate::kernels::gpu::sum_of_squares::global_norm(&grads)
            .unwrap_or_else(|| grads.into_iter().map(sum_of_squares).sum::<f64>().sqrt())
    }

    /// Gradient clipping by global norm, as `torch.nn.utils.clip_grad_norm_`: when the norm
    /// exceeds `max_norm`, every gradient is scaled by `max_norm / (norm + 1e-6)`. Returns the
    /// norm before clipping.
    pub fn clip_global_norm(&mut self, max_norm: f64) -> f64 {
        let norm = self.global_norm();
        self.clip_known_norm(max_norm, norm);
        norm
    }

    /// [`ParamGrads::clip_global_norm`] when the global norm is already known.
    pub fn clip_known_norm(&mut self, max_norm: f64, norm: f64) {
        let factor = clip_factor(max_norm, norm);
        if factor < 1.0 {
            self.scale(factor);
        }
    }

    /// Multiplies every gradient by `factor` (undoing a loss scale).
    pub fn scale(&mut self, factor: f64) {
        for g in self.grads.values_mut() {
            *g = g.clone() * factor;
        }
    }

    /// Bytes held (f32).
    pub fn bytes(&self) -> u64 {
        self.grads.values().map(|g| 4 * g.dims()[0] as u64).sum()
    }
}

struct Collect<'a> {
    grads: &'a mut Gradients,
    out: ParamGrads,
}

impl ModuleVisitor for Collect<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        // A tied weight is visited twice; its gradient is taken the first time.
        if let Some(g) = param.val().grad_remove(self.grads) {
            let n = g.shape().num_elements();
            self.out.grads.insert(param.id, g.reshape([n]));
        }
    }
}

/// Replaces every parameter of `module` that has a gradient by `update(id, value, grad)`, with
/// value and gradient flattened to `[numel]` and outside the autodiff graph; the result is
/// reshaped back and tracked again. Parameters without a gradient are untouched. Every
/// optimizer is one such update rule.
pub fn update_parameters<M: Module>(
    module: M,
    grads: &ParamGrads,
    update: impl FnMut(ParamId, Tensor<1>, Tensor<1>) -> Tensor<1>,
) -> M {
    module.map(&mut Update { grads, update })
}

struct Update<'a, F> {
    grads: &'a ParamGrads,
    update: F,
}

impl<F: FnMut(ParamId, Tensor<1>, Tensor<1>) -> Tensor<1>> ModuleMapper for Update<'_, F> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let id = param.id;
        let Some(grad) = self.grads.get(id).cloned() else {
            return param;
        };
        // The value is taken out of the parameter (not cloned), so an update that works in
        // place finds its buffer held by no one else.
        param.map(|value| {
            let dims = value.dims();
            let n = dims.iter().product::<usize>();
            debug_assert_eq!(grad.dims()[0], n);
            let updated = (self.update)(id, value.inner().reshape([n]), grad);
            Tensor::from_inner(updated.reshape(dims)).require_grad()
        })
    }
}

/// `Σ g²` of one gradient in f64. On the CPU backends one pass over the values in place, split
/// over rayon's threads; burn's ops would square into a new buffer (113 MB for SmolLM2's
/// embedding) on one thread and sum it in f32.
/// What gradient clipping multiplies every gradient by, as `torch.nn.utils.clip_grad_norm_`:
/// `max_norm / (norm + 1e-6)` when that is below 1, else 1.
pub fn clip_factor(max_norm: f64, norm: f64) -> f64 {
    let factor = max_norm / (norm + 1e-6);
    if factor < 1.0 { factor } else { 1.0 }
}

fn sum_of_squares(g: &Tensor<1>) -> f64 {
    let on_cpu = read_on_cpu(&[g], |values| {
        values[0]
            .par_chunks(VALUES_PER_TASK)
            .map(|chunk| {
                chunk
                    .iter()
                    .map(|&v| f64::from(v) * f64::from(v))
                    .sum::<f64>()
            })
            .sum::<f64>()
    });
    on_cpu.unwrap_or_else(|| f64::from(scalar(g.clone().powi_scalar(2).sum())))
}

#[cfg(test)]
mod tests {
    use burn::module::ParamId;
    use burn::tensor::{Int, Tensor, TensorData};

    use super::ParamGrads;
    use crate::device::DeviceKind;
    use crate::kernels::values::to_f32_vec;

    /// Rows land on their ids, repeated ids sum, and an existing gradient is added to.
    #[test]
    fn add_rows_scatters_and_sums_into_the_gradient() {
        let device = DeviceKind::Cpu.open().unwrap();
        let id = ParamId::new();
        let ids = || Tensor::<1, Int>::from_data(TensorData::new(vec![2i64, 0, 2], [3]), &device);
        let rows = || {
            Tensor::<2>::from_data(
                TensorData::new(vec![1.0f32, 2.0, 10.0, 20.0, 100.0, 200.0], [3, 2]),
                &device,
            )
        };
        let mut grads = ParamGrads::new();
        grads.add_rows(id, [4, 2], ids(), rows());
        let once = [10.0, 20.0, 0.0, 0.0, 101.0, 202.0, 0.0, 0.0];
        assert_eq!(to_f32_vec(grads.get(id).unwrap().clone()), once);
        grads.add_rows(id, [4, 2], ids(), rows());
        let twice: Vec<f32> = once.iter().map(|v| 2.0 * v).collect();
        assert_eq!(to_f32_vec(grads.get(id).unwrap().clone()), twice);
    }
}
