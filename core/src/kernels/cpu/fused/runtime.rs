//! The CPU kernel runtime: a kernel runs where its inputs' values can be read on the host
//! (Flex or NdArray, f32), as a custom autodiff op when they are tracked; everywhere else the
//! caller falls back to burn's ops.

use burn::tensor::{DType, Device, Tensor, TensorData};
use burn_autodiff::Autodiff;
use burn_backend::Backend;
use burn_backend::tensor::FloatTensor;
use burn_dispatch::{DispatchKindConversion, DispatchTensor};

use crate::config::Kernels;

/// A backend tensor's f32 values, row-major, and its device. No copy when the buffer is
/// contiguous and held by no one else; otherwise one copy, a row at a time where the backend
/// allows ([`CpuValues::copy_when_shared`]).
pub(crate) fn host_values<B: CpuValues, const D: usize>(x: FloatTensor<B>) -> (Vec<f32>, Device)
where
    DispatchTensor: DispatchKindConversion<B>,
{
    let copy = B::copy_when_shared(&x);
    let tensor = Tensor::<D>::from_primitive::<B>(x);
    let device = tensor.device();
    let values = copy.unwrap_or_else(|| {
        tensor
            .into_data()
            .try_into_vec::<f32>()
            .expect("the caller checked that the tensor holds f32")
    });
    (values, device)
}

/// The values a forward kept, owned again for a backward that writes over them (no copy
/// unless something else still holds them).
pub(crate) fn owned(kept: std::sync::Arc<Vec<f32>>) -> Vec<f32> {
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

    /// A row-major copy of the f32 values when taking them over would need one anyway (the
    /// buffer is shared or strided) and the backend's own conversion copies slowly; `None`
    /// when the backend's conversion is the better way.
    fn copy_when_shared(x: &FloatTensor<Self>) -> Option<Vec<f32>>;
}

#[cfg(feature = "flex")]
impl CpuValues for burn_flex::Flex {
    fn f32_slice(x: &FloatTensor<Self>) -> Option<&[f32]> {
        x.as_slice::<f32>()
    }

    fn copy_when_shared(_: &FloatTensor<Self>) -> Option<Vec<f32>> {
        None
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

    /// burn NdArray's conversion collects a shared or strided array one element at a time
    /// through its n-dimensional iterator (profiled: 11 % of a SmolLM2 step when the attention
    /// read its strided inputs that way); here rows of the last axis are copied whole.
    fn copy_when_shared(x: &FloatTensor<Self>) -> Option<Vec<f32>> {
        let burn_ndarray::NdArrayTensor::F32(storage) = x else {
            return None;
        };
        let view = storage.view();
        if storage.is_unique() && view.is_standard_layout() {
            return None;
        }
        if let Some(values) = view.to_slice() {
            return Some(values.to_vec());
        }
        let mut values = Vec::with_capacity(view.len());
        for row in view.rows() {
            match row.to_slice() {
                Some(row) => values.extend_from_slice(row),
                None => values.extend(row.iter().copied()),
            }
        }
        Some(values)
    }
}

/// A fused kernel written once for any CPU backend `B`: it runs when its inputs live on `B`
/// (or on `Autodiff<B>`) and hands them back otherwise.
pub(crate) trait CpuKernel {
    /// The tensors the kernel takes, handed back when they live elsewhere.
    type Inputs;
    /// What it returns.
    type Output;

    /// The kernel on backend `B`, or the inputs back.
    fn on_backend<B: CpuValues>(&self, inputs: Self::Inputs) -> Result<Self::Output, Self::Inputs>
    where
        DispatchTensor: DispatchKindConversion<B> + DispatchKindConversion<Autodiff<B>>;
}

/// A kernel's inputs, taken as one backend's primitives when they all live there.
pub(crate) trait KernelInputs: Sized {
    /// The inputs as backend `B`'s primitives.
    type On<B: Backend>;

    /// The primitives when every input lives on `B`, else the inputs back. The originals are
    /// dropped once taken, so the primitives are their buffers' only holders.
    fn take<B: Backend>(self) -> Result<Self::On<B>, Self>
    where
        DispatchTensor: DispatchKindConversion<B>;
}

impl<const D: usize> KernelInputs for Tensor<D> {
    type On<B: Backend> = FloatTensor<B>;

    fn take<B: Backend>(self) -> Result<FloatTensor<B>, Self>
    where
        DispatchTensor: DispatchKindConversion<B>,
    {
        // A clone shares the buffer; it copies nothing.
        match self.clone().try_into_primitive::<B>() {
            Ok(primitive) => Ok(primitive),
            Err(_) => Err(self),
        }
    }
}

impl<const D1: usize, const D2: usize> KernelInputs for (Tensor<D1>, Tensor<D2>) {
    type On<B: Backend> = (FloatTensor<B>, FloatTensor<B>);

    fn take<B: Backend>(self) -> Result<Self::On<B>, Self>
    where
        DispatchTensor: DispatchKindConversion<B>,
    {
        let (a, b) = self;
        match (
            a.clone().try_into_primitive::<B>(),
            b.clone().try_into_primitive::<B>(),
        ) {
            (Ok(a), Ok(b)) => Ok((a, b)),
            _ => Err((a, b)),
        }
    }
}

/// What every element-wise kernel's [`CpuKernel::on_backend`] does: on `Autodiff<B>` the
/// tracked operation, on plain `B` the forward alone, else the inputs back.
pub(crate) fn tracked_or_plain<B: CpuValues, I: KernelInputs, O>(
    inputs: I,
    tracked: impl FnOnce(I::On<Autodiff<B>>) -> O,
    plain: impl FnOnce(I::On<B>) -> O,
) -> Result<O, I>
where
    DispatchTensor: DispatchKindConversion<B> + DispatchKindConversion<Autodiff<B>>,
{
    let inputs = match inputs.take::<Autodiff<B>>() {
        Ok(primitives) => return Ok(tracked(primitives)),
        Err(inputs) => inputs,
    };
    inputs.take::<B>().map(plain)
}

/// Runs `kernel` on the CPU backend its inputs live on (Flex, then NdArray, as compiled in);
/// the inputs back when they live on none of them (the caller then runs burn's ops).
pub(crate) fn on_cpu<K: CpuKernel>(kernel: &K, inputs: K::Inputs) -> Result<K::Output, K::Inputs> {
    let result = Err(inputs);
    #[cfg(feature = "flex")]
    let result = result.or_else(|inputs| kernel.on_backend::<burn_flex::Flex>(inputs));
    #[cfg(feature = "openblas")]
    #[allow(deprecated)]
    let result = result.or_else(|inputs| kernel.on_backend::<burn_ndarray::NdArray>(inputs));
    result
}

/// Which implementation runs the element-wise layers on `device`: napkin's fused kernels on
/// the CPU backends, its cubecl ones for RMSNorm and SwiGLU on a GPU, burn's ops elsewhere
/// (f32: the layers' inputs are f32 under autocast too).
pub fn kernels_on(device: &Device) -> Kernels {
    if cpu_values(Tensor::<1>::zeros([1], device)).is_ok() {
        return Kernels::FusedCpu;
    }
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if crate::device::is_gpu(device) {
        return Kernels::FusedGpu;
    }
    Kernels::BurnOps
}

/// A tensor's f32 values on the host through [`host_values`] (no copy when the buffer is
/// unique and contiguous, else one, a row at a time on NdArray); the tensor back when it is
/// not f32 on a CPU backend.
pub(crate) fn cpu_values<const D: usize>(x: Tensor<D>) -> Result<Vec<f32>, Tensor<D>> {
    if !is_f32(&x) {
        return Err(x);
    }
    on_cpu(&HostCopy::<D>, x)
}

/// [`cpu_values`] on one CPU backend.
struct HostCopy<const D: usize>;

impl<const D: usize> CpuKernel for HostCopy<D> {
    type Inputs = Tensor<D>;
    type Output = Vec<f32>;

    fn on_backend<B: CpuValues>(&self, x: Tensor<D>) -> Result<Vec<f32>, Tensor<D>>
    where
        DispatchTensor: DispatchKindConversion<B> + DispatchKindConversion<Autodiff<B>>,
    {
        // The original goes before the values are read, so a buffer no one else holds is
        // taken over without a copy.
        if let Ok(tracked) = x.clone().try_into_primitive::<Autodiff<B>>() {
            drop(x);
            return Ok(host_values::<B, D>(tracked.into_primitive()).0);
        }
        if let Ok(primitive) = x.clone().try_into_primitive::<B>() {
            drop(x);
            return Ok(host_values::<B, D>(primitive).0);
        }
        Err(x)
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
    read(&values_of::<B, D>(x))
}

/// A backend tensor's f32 values: borrowed when contiguous, else a row-major copy.
fn values_of<B: CpuValues, const D: usize>(x: &FloatTensor<B>) -> std::borrow::Cow<'_, [f32]>
where
    DispatchTensor: DispatchKindConversion<B>,
{
    match B::f32_slice(x) {
        Some(values) => std::borrow::Cow::Borrowed(values),
        None => std::borrow::Cow::Owned(host_values::<B, D>(x.clone()).0),
    }
}

/// Runs `read` on the f32 values of `tensors` (row-major; borrowed in place where contiguous,
/// else copied) when every one lives on the same CPU backend; `None` otherwise (the caller
/// runs burn's ops).
pub(crate) fn read_on_cpu<const D: usize, R>(
    tensors: &[&Tensor<D>],
    read: impl FnOnce(&[&[f32]]) -> R,
) -> Option<R> {
    if !tensors.iter().all(|x| is_f32(x)) {
        return None;
    }
    #[cfg(feature = "flex")]
    if let Some(primitives) = primitives_on::<burn_flex::Flex, D>(tensors) {
        return Some(read_all::<burn_flex::Flex, D, R>(&primitives, read));
    }
    #[cfg(feature = "openblas")]
    {
        #[allow(deprecated)]
        type NdArray = burn_ndarray::NdArray;
        if let Some(primitives) = primitives_on::<NdArray, D>(tensors) {
            return Some(read_all::<NdArray, D, R>(&primitives, read));
        }
    }
    let _ = read;
    None
}

/// The backend tensors behind `tensors` when all live on `B`.
#[cfg(any(feature = "flex", feature = "openblas"))]
fn primitives_on<B: CpuValues, const D: usize>(
    tensors: &[&Tensor<D>],
) -> Option<Vec<FloatTensor<B>>>
where
    DispatchTensor: DispatchKindConversion<B>,
{
    tensors
        .iter()
        .map(|x| (*x).clone().try_into_primitive::<B>().ok())
        .collect()
}

#[cfg(any(feature = "flex", feature = "openblas"))]
fn read_all<B: CpuValues, const D: usize, R>(
    primitives: &[FloatTensor<B>],
    read: impl FnOnce(&[&[f32]]) -> R,
) -> R
where
    DispatchTensor: DispatchKindConversion<B>,
{
    let values: Vec<std::borrow::Cow<'_, [f32]>> =
        primitives.iter().map(values_of::<B, D>).collect();
    let slices: Vec<&[f32]> = values.iter().map(|v| v.as_ref()).collect();
    read(&slices)
}

/// Whether a tensor is f32 (the kernels' only type).
pub(crate) fn is_f32<const D: usize>(x: &Tensor<D>) -> bool {
    x.dtype() == DType::F32
}

#[cfg(test)]
mod tests {
    use burn::tensor::Tensor;
    use burn_autodiff::Autodiff;
    use burn_dispatch::{DispatchKindConversion, DispatchTensor};

    use super::{CpuKernel, CpuValues, Kernels, kernels_on, on_cpu};
    use crate::device::DeviceKind;

    /// A kernel that says which backend took its input, plain or under autodiff.
    struct WhichBackend;

    impl CpuKernel for WhichBackend {
        type Inputs = Tensor<2>;
        type Output = String;

        fn on_backend<B: CpuValues>(&self, x: Tensor<2>) -> Result<String, Tensor<2>>
        where
            DispatchTensor: DispatchKindConversion<B> + DispatchKindConversion<Autodiff<B>>,
        {
            let name = std::any::type_name::<B>();
            if x.clone().try_into_primitive::<Autodiff<B>>().is_ok() {
                return Ok(format!("autodiff {name}"));
            }
            match x.clone().try_into_primitive::<B>() {
                Ok(_) => Ok(name.to_string()),
                Err(_) => Err(x),
            }
        }
    }

    /// Every CPU backend, with and without autodiff, runs the fused kernels (the wgpu side is
    /// `tests/tests/gpu/device_pool.rs`: there the fused-gpu prediction holds).
    #[test]
    fn the_cpu_backends_run_the_fused_kernels() {
        for kind in DeviceKind::cpu_backends() {
            let device = kind.open().unwrap();
            assert_eq!(kernels_on(&device), Kernels::FusedCpu, "{kind}");
            assert_eq!(kernels_on(&device.autodiff()), Kernels::FusedCpu, "{kind}");
        }
    }

    /// Each CPU backend's tensors reach the kernel written for that backend, with and without
    /// autodiff (the kernels' own tests compare values, which burn's ops would match too).
    #[test]
    fn on_cpu_runs_the_kernel_on_the_tensors_backend() {
        for kind in DeviceKind::cpu_backends() {
            let expected = match kind {
                DeviceKind::Flex => "Flex",
                _ => "NdArray",
            };
            for autodiff in [false, true] {
                let device = kind.open().unwrap();
                let device = if autodiff { device.autodiff() } else { device };
                let x = Tensor::<2>::zeros([2, 3], &device);
                let taken = on_cpu(&WhichBackend, x).expect("a CPU tensor is taken");
                assert!(taken.ends_with(expected), "{kind}: taken by {taken}");
                assert_eq!(taken.starts_with("autodiff"), autodiff, "{kind}: {taken}");
            }
        }
    }
}
