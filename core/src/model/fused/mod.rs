//! Fused element-wise kernels for the CPU backends, as custom autodiff operations.
//!
//! burn's CPU backends run every element-wise op on one thread and one op at a time: SiLU·up
//! is a sigmoid, two products and, in the backward, six more passes over `[B, T, F]`; the
//! loss's log-softmax makes about ten passes over the `[B, T, V]` logits. Profiled on a
//! SmolLM2 train step, those passes kept one core busy while the other idled between GEMMs.
//! Each kernel here does its op in one pass over the values, split over rayon's threads, and
//! its backward writes the gradients over the buffers the forward kept (no new allocation).
//!
//! The kernels run where the tensors live on Flex or NdArray (f32). Every other case (wgpu,
//! CUDA, half precision) runs the same formula with burn's ops.

pub mod cross_entropy;
pub mod rms_norm;
pub mod swiglu;

use burn::tensor::{DType, Device, Tensor, TensorData};
use burn_backend::Backend;
use burn_backend::tensor::FloatTensor;
use burn_dispatch::{DispatchKindConversion, DispatchTensor};

/// Values per rayon task: large enough that scheduling is noise, small enough that two
/// threads share a `[256, 1536]` activation evenly.
pub(crate) const VALUES_PER_TASK: usize = 16 * 1024;

/// A backend tensor's f32 values, row-major, and its device. No copy when the buffer is
/// contiguous and held by no one else.
pub(crate) fn host_values<B: Backend, const D: usize>(x: FloatTensor<B>) -> (Vec<f32>, Device)
where
    DispatchTensor: DispatchKindConversion<B>,
{
    let tensor = Tensor::<D>::from_primitive::<B>(x);
    let device = tensor.device();
    let values = tensor
        .into_data()
        .try_into_vec::<f32>()
        .expect("the caller checked that the tensor holds f32");
    (values, device)
}

/// The values a forward kept, owned again for a backward that writes over them (no copy
/// unless something else still holds them).
fn owned(kept: std::sync::Arc<Vec<f32>>) -> Vec<f32> {
    std::sync::Arc::try_unwrap(kept).unwrap_or_else(|shared| (*shared).clone())
}

/// f32 values as a backend tensor of `shape`.
pub(crate) fn backend_tensor<B: Backend, const D: usize>(
    values: Vec<f32>,
    shape: [usize; D],
    device: &Device,
) -> FloatTensor<B>
where
    DispatchTensor: DispatchKindConversion<B>,
{
    Tensor::<D>::from_data(TensorData::new(values, shape), device)
        .try_into_primitive::<B>()
        .expect("a tensor made on this backend's device stays on it")
}

/// A CPU backend whose tensors' values can be borrowed in place.
pub(crate) trait CpuValues: Backend {
    /// The tensor's values when they are f32 and contiguous in memory.
    fn f32_slice(x: &FloatTensor<Self>) -> Option<&[f32]>;
}

#[cfg(feature = "flex")]
impl CpuValues for burn_flex::Flex {
    fn f32_slice(x: &FloatTensor<Self>) -> Option<&[f32]> {
        x.as_slice::<f32>()
    }
}

#[cfg(feature = "openblas")]
#[allow(deprecated)]
impl CpuValues for burn_ndarray::NdArray {
    fn f32_slice(x: &FloatTensor<Self>) -> Option<&[f32]> {
        match x {
            burn_ndarray::NdArrayTensor::F32(storage) => storage.view().to_slice(),
            _ => None,
        }
    }
}

/// Runs `read` on a backend tensor's f32 values: in place when they are contiguous, else on a
/// copy.
pub(crate) fn with_values<B: CpuValues, const D: usize, R>(
    x: &FloatTensor<B>,
    read: impl FnOnce(&[f32]) -> R,
) -> R
where
    DispatchTensor: DispatchKindConversion<B>,
{
    match B::f32_slice(x) {
        Some(values) => read(values),
        None => read(&host_values::<B, D>(x.clone()).0),
    }
}

/// Whether a tensor is f32 (the kernels' only type).
pub(crate) fn is_f32<const D: usize>(x: &Tensor<D>) -> bool {
    x.dtype() == DType::F32
}
