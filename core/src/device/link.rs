//! The host ↔ device link, counted where it is crossed: every transfer napkin makes between
//! host memory and a GPU goes through [`upload`], [`upload_as`] or [`read_back`], which add the
//! bytes to a process-wide tally by kind. On a CPU backend nothing crosses a link and nothing
//! is counted.
//!
//! burn moves bytes on its own in two places napkin does not call: creating a tensor from a
//! scalar on the device (no host buffer) and reading one back for `into_scalar` — the loss,
//! which the step reads through [`read_back`] as well.

use std::sync::atomic::{AtomicU64, Ordering};

use burn::tensor::kind::Basic;
use burn::tensor::{DType, Device, Tensor, TensorData};
use serde::{Deserialize, Serialize};

/// What a transfer carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Traffic {
    /// Model weights: NF4 codes and scales, float weights, adapters.
    Weights,
    /// Per-step data: token ids, labels, masks, RoPE tables.
    Data,
    /// Optimizer state, gradients and master weights moved for an offloaded optimizer.
    Optimizer,
}

/// Bytes that crossed the link, by kind and direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkBytes {
    /// Host → device, weights.
    pub weights_up: u64,
    /// Host → device, per-step data.
    pub data_up: u64,
    /// Host → device, optimizer traffic.
    pub optimizer_up: u64,
    /// Device → host, everything read back.
    pub read_back: u64,
}

impl LinkBytes {
    /// Host → device, all kinds.
    pub fn up(&self) -> u64 {
        self.weights_up + self.data_up + self.optimizer_up
    }

    /// What crossed since `earlier`.
    pub fn since(&self, earlier: &LinkBytes) -> LinkBytes {
        LinkBytes {
            weights_up: self.weights_up - earlier.weights_up,
            data_up: self.data_up - earlier.data_up,
            optimizer_up: self.optimizer_up - earlier.optimizer_up,
            read_back: self.read_back - earlier.read_back,
        }
    }
}

static WEIGHTS_UP: AtomicU64 = AtomicU64::new(0);
static DATA_UP: AtomicU64 = AtomicU64::new(0);
static OPTIMIZER_UP: AtomicU64 = AtomicU64::new(0);
static READ_BACK: AtomicU64 = AtomicU64::new(0);

/// The tally so far (process-wide, every device).
pub fn counted() -> LinkBytes {
    LinkBytes {
        weights_up: WEIGHTS_UP.load(Ordering::Relaxed),
        data_up: DATA_UP.load(Ordering::Relaxed),
        optimizer_up: OPTIMIZER_UP.load(Ordering::Relaxed),
        read_back: READ_BACK.load(Ordering::Relaxed),
    }
}

/// Whether tensors on `device` live across a link from the host (a GPU backend).
pub fn is_across_link(device: &Device) -> bool {
    super::is_gpu(device)
}

fn count_up(bytes: usize, traffic: Traffic) {
    let counter = match traffic {
        Traffic::Weights => &WEIGHTS_UP,
        Traffic::Data => &DATA_UP,
        Traffic::Optimizer => &OPTIMIZER_UP,
    };
    counter.fetch_add(bytes as u64, Ordering::Relaxed);
}

/// A tensor on `device` from host data, in the device's default dtype for its kind (the
/// bytes counted are those written to the device, after any conversion on the host).
pub fn upload<const D: usize, K: Basic>(
    data: TensorData,
    device: &Device,
    traffic: Traffic,
) -> Tensor<D, K> {
    counted_up(Tensor::from_data(data, device), traffic)
}

/// A tensor on `device` from host data, stored as `dtype`.
pub fn upload_as<const D: usize, K: Basic>(
    data: TensorData,
    device: &Device,
    dtype: DType,
    traffic: Traffic,
) -> Tensor<D, K> {
    counted_up(Tensor::from_data(data, (device, dtype)), traffic)
}

fn counted_up<const D: usize, K: Basic>(t: Tensor<D, K>, traffic: Traffic) -> Tensor<D, K> {
    if is_across_link(&t.device()) {
        count_up(t.dtype().size() * t.shape().num_elements(), traffic);
    }
    t
}

/// [`write_over`] for any tensor kind: the buffer behind `$tensor` (outside autodiff) on a GPU
/// backend, or `false`.
macro_rules! write_over_kind {
    ($tensor:expr, $data:expr, $traffic:expr) => {{
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        {
            is_across_link(&$tensor.device())
                && $tensor
                    .clone()
                    .without_autodiff()
                    .try_into_primitive::<burn::backend::Cube>()
                    .is_ok_and(|cube| write_over_buffer(cube, $data, $traffic))
        }
        #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
        {
            let _ = ($tensor, $data, $traffic);
            false
        }
    }};
}

/// Writes `data` over `tensor`'s own device buffer, counted as `traffic` up and as one write
/// ([`writes`]): a step captured as a device graph reads the buffers it recorded, so each new
/// batch goes into them. True when written; false (nothing written) on a CPU backend, or when
/// the tensor is not a contiguous buffer of `data`'s length.
pub fn write_over<const D: usize>(tensor: &Tensor<D>, data: TensorData, traffic: Traffic) -> bool {
    write_over_kind!(tensor, data, traffic)
}

/// [`write_over`] for integer tensors (token ids).
pub fn write_over_int<const D: usize>(
    tensor: &Tensor<D, burn::tensor::Int>,
    data: TensorData,
    traffic: Traffic,
) -> bool {
    write_over_kind!(tensor, data, traffic)
}

static WRITES: AtomicU64 = AtomicU64::new(0);

/// Writes into existing device buffers ([`write_over`]) so far, process-wide: each is one
/// submission from the host.
pub fn writes() -> u64 {
    WRITES.load(Ordering::Relaxed)
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn write_over_buffer(
    cube: burn_cubecl::tensor::CubeTensor,
    data: TensorData,
    traffic: Traffic,
) -> bool {
    if !cube.is_contiguous() || cube.meta.shape().num_elements() != data.num_elements() {
        return false;
    }
    let bytes = data.convert_dtype(cube.dtype).into_bytes();
    count_up(bytes.len(), traffic);
    cube.client.write(&cube.handle, bytes);
    WRITES.fetch_add(1, Ordering::Relaxed);
    true
}

/// A tensor's values on the host.
pub fn read_back<const D: usize, K: Basic>(tensor: Tensor<D, K>) -> TensorData {
    let across = is_across_link(&tensor.device());
    let data = tensor.into_data();
    if across {
        READ_BACK.fetch_add(data.bytes().len() as u64, Ordering::Relaxed);
    }
    data
}

/// Which way a [`move_to`] goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Towards host memory (counted as read back).
    ToHost,
    /// Towards the compute device (counted as `traffic` up).
    ToDevice,
}

/// `tensor` moved to `target`, and the bytes copied: counted whenever the two devices differ
/// (a copy from one memory to another: over PCIe for a GPU, between two heaps for two CPU
/// backends), 0 otherwise.
pub fn move_to<const D: usize, K: Basic>(
    tensor: Tensor<D, K>,
    target: &Device,
    direction: Direction,
    traffic: Traffic,
) -> (Tensor<D, K>, u64) {
    let mut bytes = 0;
    if tensor.device() != *target {
        bytes = (tensor.dtype().size() * tensor.shape().num_elements()) as u64;
        match direction {
            Direction::ToHost => {
                READ_BACK.fetch_add(bytes, Ordering::Relaxed);
            }
            Direction::ToDevice => count_up(bytes as usize, traffic),
        }
    }
    (tensor.to_device(target), bytes)
}
