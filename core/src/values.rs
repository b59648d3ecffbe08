//! Reading tensor values back to the host as `Vec<f32>`.

use burn::tensor::Tensor;

/// The values of a float tensor, row-major, as f32 (converting from f16/bf16 if needed).
///
/// # Panics
/// Only if the backend fails to read its own memory (a device error, not a user error).
pub fn to_f32_vec<const D: usize>(tensor: Tensor<D>) -> Vec<f32> {
    tensor
        .into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .expect("a float tensor converted to f32 reads back as f32")
}

/// The largest absolute difference between two tensors of the same shape (tests and checks).
pub fn max_abs_diff<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> f32 {
    to_f32_vec(a)
        .iter()
        .zip(to_f32_vec(b))
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// A scalar (`[1]`) tensor's value.
pub fn scalar(tensor: Tensor<1>) -> f32 {
    to_f32_vec(tensor).first().copied().unwrap_or(f32::NAN)
}
