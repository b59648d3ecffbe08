//! Generation's SwiGLU in one launch on the GPU (`kernels/gpu/swiglu_rows.rs`): the values of an
//! f64 `silu(g)·u` and of burn's ops (`silu(gate) * up` on wgpu), SmolLM2's and TinyLlama's
//! MLP widths, one row and several, large inputs of both signs, a strided input; what it does
//! not take (tracked, too many rows) is left to burn's ops.

use burn::tensor::activation::silu;
use burn::tensor::{Distribution, Tensor};
use napkin_core::kernels::gpu::swiglu_rows::{ROWS_IN_ONE_LAUNCH, few_rows};
use napkin_core::kernels::values::to_f32_vec;

use super::{ONE_AT_A_TIME, wgpu_device};

#[test]
fn swiglu_of_a_few_rows_in_one_launch_equals_burns_ops_and_an_f64_silu() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device();
    device.seed(9);
    let mut worst_reference = 0f64;
    let mut worst_burn = 0f64;
    for width in [1536, 5632, 100] {
        for [b, t] in [[1, 1], [2, 2], [1, 4]] {
            // Both signs, up to |g| ≈ 40 (exp(−g) far from 1 either way).
            let gate = Tensor::<2>::random([width, b * t], Distribution::Normal(0.0, 8.0), &device)
                .transpose()
                .reshape([b, t, width]);
            let up = Tensor::<3>::random([b, t, width], Distribution::Normal(0.0, 1.0), &device);
            let fused = to_f32_vec(few_rows(&gate, &up).expect("a few untracked f32 rows"));
            let burn_ops = to_f32_vec(silu(gate.clone()) * up.clone());
            let (g, u) = (to_f32_vec(gate), to_f32_vec(up));
            for (i, (&f, &o)) in fused.iter().zip(&burn_ops).enumerate() {
                let (g, u) = (g[i] as f64, u[i] as f64);
                let exact = g / (1.0 + (-g).exp()) * u;
                let scale = exact.abs().max(1e-3);
                worst_reference = worst_reference.max((f as f64 - exact).abs() / scale);
                worst_burn = worst_burn.max((f - o).abs() as f64 / scale);
            }
        }
    }
    eprintln!(
        "SwiGLU of a few rows in one launch: worst relative error {worst_reference:.1e} against \
         f64, {worst_burn:.1e} against burn's ops"
    );
    assert!(worst_reference < 1e-5, "{worst_reference:e} against f64");
    assert!(worst_burn < 1e-5, "{worst_burn:e} against burn's ops");
}

#[test]
fn tracked_inputs_and_longer_ones_keep_burns_ops() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device();
    let long = Tensor::<3>::ones([1, ROWS_IN_ONE_LAUNCH + 1, 8], &device);
    assert!(
        few_rows(&long, &long,).is_none(),
        "more rows than one launch takes"
    );
    let train = device.autodiff();
    let tracked = Tensor::<3>::ones([1, 1, 8], &train).require_grad();
    let up = Tensor::<3>::ones([1, 1, 8], &train);
    assert!(
        few_rows(&tracked, &up).is_none(),
        "a gate that needs a gradient"
    );
    assert!(
        few_rows(&up, &tracked).is_none(),
        "an up projection that needs a gradient"
    );
}
