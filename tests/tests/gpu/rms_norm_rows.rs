//! Generation's RMSNorm in one launch on the GPU (`kernels/gpu/rms_norm_rows.rs`): the values of an
//! f64 RMSNorm and of burn's ops (the formula, op by op), for widths that are and are not
//! multiples of the kernel's 64 units, one row and several, a strided input; what it does not
//! take (tracked, too many rows) is left to burn's ops.

use burn::tensor::{Distribution, Tensor};
use napkin_core::kernels::gpu::rms_norm_rows::{ROWS_IN_ONE_LAUNCH, few_rows};
use napkin_core::kernels::values::to_f32_vec;

use super::{ONE_AT_A_TIME, wgpu_device};

const EPS: f64 = 1e-5;

/// RMSNorm of each `dim`-wide row in f64.
fn reference(x: &[f32], gain: &[f32], dim: usize) -> Vec<f64> {
    x.chunks(dim)
        .flat_map(|row| {
            let mean_square = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / dim as f64;
            let inverse = 1.0 / (mean_square + EPS).sqrt();
            row.iter()
                .zip(gain)
                .map(move |(&v, &g)| g as f64 * v as f64 * inverse)
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn rms_norm_of_a_few_rows_in_one_launch_equals_burns_ops_and_an_f64_norm() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device();
    device.seed(3);
    let mut worst_reference = 0f64;
    let mut worst_burn = 0f64;
    for dim in [100, 144, 576, 2048] {
        for [b, t] in [[1, 1], [2, 2], [1, 4]] {
            let gain = Tensor::<1>::random([dim], Distribution::Uniform(0.5, 1.5), &device);
            // A strided `[B, T, D]`: the transpose of a `[D, B·T]` tensor.
            let x = Tensor::<2>::random([dim, b * t], Distribution::Normal(0.0, 2.0), &device)
                .transpose()
                .reshape([b, t, dim]);
            let fused = few_rows(&x, &gain, EPS).expect("a few untracked f32 rows on wgpu");
            assert_eq!(fused.dims(), [b, t, dim]);
            let fused = to_f32_vec(fused);
            let inverse = (x.clone().square().mean_dim(2) + EPS).sqrt().recip();
            let burn_ops = to_f32_vec(gain.clone().unsqueeze::<3>() * (x.clone() * inverse));
            let exact = reference(&to_f32_vec(x), &to_f32_vec(gain), dim);
            for ((&y, &z), &e) in fused.iter().zip(&burn_ops).zip(&exact) {
                let scale = e.abs().max(1e-3);
                worst_reference = worst_reference.max((y as f64 - e).abs() / scale);
                worst_burn = worst_burn.max((y - z).abs() as f64 / scale);
            }
        }
    }
    eprintln!(
        "RMSNorm of a few rows in one launch: worst relative error {worst_reference:.1e} \
         against f64, {worst_burn:.1e} against burn's ops"
    );
    assert!(worst_reference < 1e-5, "{worst_reference:e} against f64");
    assert!(worst_burn < 1e-5, "{worst_burn:e} against burn's ops");
}

#[test]
fn tracked_inputs_and_longer_ones_keep_burns_ops() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device();
    let gain = Tensor::<1>::ones([64], &device);
    let long = Tensor::<3>::ones([1, ROWS_IN_ONE_LAUNCH + 1, 64], &device);
    assert!(
        few_rows(&long, &gain, EPS).is_none(),
        "more rows than one launch takes"
    );
    let train = device.autodiff();
    let tracked = Tensor::<3>::ones([1, 1, 64], &train).require_grad();
    let gain = Tensor::<1>::ones([64], &train);
    assert!(
        few_rows(&tracked, &gain, EPS).is_none(),
        "an input that needs a gradient"
    );
    let untracked = Tensor::<3>::ones([1, 1, 64], &train);
    let y = few_rows(&untracked, &gain, EPS).expect("untracked rows on the autodiff device");
    assert!(
        y.is_autodiff(),
        "the result comes back on the autodiff device"
    );
}
