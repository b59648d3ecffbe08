//! Generation's rotary embedding in one launch on the GPU (`kernels/gpu/rope_rows.rs`): the values
//! of an f64 rotation and of burn's rotate-half ops (`RopeTables::apply` on wgpu), SmolLM2's
//! and TinyLlama's head widths, one row and several at far positions, a strided input; what it
//! does not take (tracked, too many rows) is left to burn's ops.

use burn::tensor::{Distribution, Tensor};
use napkin_core::kernels::gpu::rope_rows::{ROWS_IN_ONE_LAUNCH, few_rows};
use napkin_core::kernels::values::to_f32_vec;
use napkin_core::model::rope::{RopeTables, tables};

use super::{ONE_AT_A_TIME, wgpu_device};

fn inverse_frequencies(head_dim: usize) -> Vec<f32> {
    (0..head_dim / 2)
        .map(|j| 1.0 / 10_000f32.powf((2 * j) as f32 / head_dim as f32))
        .collect()
}

#[test]
fn rope_of_a_few_rows_in_one_launch_equals_burns_ops_and_an_f64_rotation() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device();
    device.seed(5);
    let mut worst_reference = 0f64;
    let mut worst_burn = 0f64;
    for (heads, head_dim) in [(9, 64), (3, 64), (4, 32)] {
        for [b, t] in [[1, 1], [2, 2], [1, 4]] {
            let width = heads * head_dim;
            let inv_freq = inverse_frequencies(head_dim);
            let positions: Vec<u32> = (0..(b * t) as u32).map(|i| 700 + 37 * i).collect();
            let rope = RopeTables::new(&inv_freq, &positions, b, t, &device);
            // A strided `[B, T, n·Dh]`: the transpose of a `[n·Dh, B·T]` tensor.
            let y = Tensor::<2>::random([width, b * t], Distribution::Normal(0.0, 1.0), &device)
                .transpose()
                .reshape([b, t, width]);
            let fused = few_rows(&y, &rope.cos, &rope.sin).expect("a few untracked f32 rows");
            let fused = to_f32_vec(fused);
            let heads_of = |y: Tensor<3>| y.reshape([b, t, heads, head_dim]).swap_dims(1, 2);
            // burn's ops give [B, n, T, Dh]: back to [B, T, n·Dh] to compare.
            let burn_ops = to_f32_vec(
                rope.apply(heads_of(y.clone()))
                    .swap_dims(1, 2)
                    .reshape([b, t, width]),
            );
            let (cos, sin) = tables(&inv_freq, &positions);
            let values = to_f32_vec(y);
            let half = head_dim / 2;
            for (at, (&f, &o)) in fused.iter().zip(&burn_ops).enumerate() {
                let (row, j) = (at / width, at % head_dim);
                let partner = if j < half {
                    -(values[at + half] as f64)
                } else {
                    values[at - half] as f64
                };
                let table = row * head_dim + j;
                let exact = values[at] as f64 * cos[table] as f64 + partner * sin[table] as f64;
                worst_reference = worst_reference.max((f as f64 - exact).abs());
                worst_burn = worst_burn.max((f - o).abs() as f64);
            }
        }
    }
    eprintln!(
        "RoPE of a few rows in one launch: worst error {worst_reference:.1e} against f64, \
         {worst_burn:.1e} against burn's ops (values of size ~1)"
    );
    assert!(worst_reference < 1e-5, "{worst_reference:e} against f64");
    assert!(worst_burn < 1e-5, "{worst_burn:e} against burn's ops");
}

#[test]
fn tracked_projections_and_longer_ones_keep_burns_ops() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device();
    let inv_freq = inverse_frequencies(8);
    let t = ROWS_IN_ONE_LAUNCH + 1;
    let positions: Vec<u32> = (0..t as u32).collect();
    let rope = RopeTables::new(&inv_freq, &positions, 1, t, &device);
    let long = Tensor::<3>::ones([1, t, 16], &device);
    assert!(
        few_rows(&long, &rope.cos, &rope.sin).is_none(),
        "more rows than one launch takes"
    );
    let train = device.autodiff();
    let rope = RopeTables::new(&inv_freq, &[3], 1, 1, &train);
    let tracked = Tensor::<3>::ones([1, 1, 16], &train).require_grad();
    assert!(
        few_rows(&tracked, &rope.cos, &rope.sin).is_none(),
        "a projection that needs a gradient"
    );
}
