//! Reading tensor values back to the host as `Vec<f32>`.

use burn::tensor::Tensor;

/// The values of a float tensor, row-major, as f32 (converting from f16/bf16 if needed).
///
/// # Panics
/// Only if the backend fails to read its own memory (a device error, not a user error).
pub fn to_f32_vec<const D: usize>(tensor: Tensor<D>) -> Vec<f32> {
    // f32 on a CPU backend: one copy at most (burn NdArray's own conversion of a shared
    // buffer, e.g. a parameter the model still holds, goes element by element: 212 ms for
    // 4 Mi values, measured, against a few for a row-wise copy).
    let tensor = match crate::kernels::cpu::fused::cpu_values(tensor) {
        Ok(values) => return values,
        Err(tensor) => tensor,
    };
    crate::device::link::read_back(tensor)
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

#[cfg(test)]
mod tests {
    use burn::tensor::{DType, Distribution, Tensor, TensorData};

    use super::to_f32_vec;
    use crate::device::DeviceKind;

    /// burn's own conversion, the reference.
    fn burns<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
    }

    /// Unique, shared, transposed (strided), sliced, autodiff and (on Flex) f16 tensors read back
    /// the same values as burn's conversion, on every CPU backend.
    #[test]
    fn every_layout_reads_back_burns_values() {
        for kind in DeviceKind::cpu_backends() {
            let device = kind.open().unwrap();
            let t = Tensor::<2>::random([37, 29], Distribution::Normal(0.0, 1.0), &device);
            let expected = burns(t.clone());
            let shared = t.clone();
            assert_eq!(to_f32_vec(shared), expected, "{kind}: shared");
            assert_eq!(
                to_f32_vec(t.clone().transpose()),
                burns(t.clone().transpose()),
                "{kind}: transposed"
            );
            let slice = t.clone().slice([3..20, 5..17]);
            assert_eq!(to_f32_vec(slice.clone()), burns(slice), "{kind}: slice");
            let tracked = Tensor::<2>::from_data(
                TensorData::new(expected.clone(), [37, 29]),
                &device.clone().autodiff(),
            )
            .require_grad();
            assert_eq!(to_f32_vec(tracked), expected, "{kind}: autodiff");
            if kind == DeviceKind::Flex {
                // NdArray has no f16.
                let half = t.clone().cast(DType::F16);
                assert_eq!(to_f32_vec(half.clone()), burns(half), "{kind}: f16");
            }
            assert_eq!(to_f32_vec(t), expected, "{kind}: unique");
        }
    }
}
