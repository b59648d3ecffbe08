//! Where row `row` of a `[B, T, C]` tensor starts, `row = b·T + t`, whatever its strides: a
//! buffer burn's CUDA allocator pads keeps its rows apart (`predict/row_layout.rs`), and a view
//! may have its first two axes swapped. The last axis must be unit-stride (the callers make it
//! so).

use burn_cubecl::kernel::{into_contiguous, untile};
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

/// The offset of row `row`'s first value in `x`'s buffer.
#[cube]
pub fn row_start(x: &Tensor<f32>, row: usize) -> usize {
    let t = x.shape(1);
    (row / t) * x.stride(0) + (row % t) * x.stride(1)
}

/// [`row_start`] of a tensor the kernel writes.
#[cube]
pub fn row_start_mut(x: &mut Tensor<f32>, row: usize) -> usize {
    let t = x.shape(1);
    (row / t) * x.stride(0) + (row % t) * x.stride(1)
}

/// `x` as it is when its rows lie in its buffer with a unit-stride last axis, else laid out
/// so (a matmul's storage-tiled output is untiled, a strided last axis copied).
pub fn unit_stride_rows(x: CubeTensor) -> CubeTensor {
    let x = untile(x);
    let strides = x.meta.strides();
    if strides.last().is_some_and(|&s| s == 1) {
        x
    } else {
        into_contiguous(x)
    }
}
