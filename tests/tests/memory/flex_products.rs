//! On burn Flex (the page's backend) a linear layer's product holds its output once, forward
//! and backward: napkin's `x·Wᵀ` (`kernels/fused/x_wt.rs`) writes into a `Vec<f32>` that Flex
//! takes over, where burn Flex's own matmul allocated each output twice (measured: a peak of
//! 2 × the output; SmolLM2's step peak in the page was 1.71× the prediction).

use burn::tensor::{Distribution, Tensor};
use napkin_core::model::matmul_wt::matmul_wt;

use super::*;

#[test]
fn a_flex_product_allocates_its_output_once() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    assert!(is_installed());
    let device = DeviceKind::Flex.open().unwrap().autodiff();
    // Odd sizes, an output of 4.4 MiB (the SmolLM2 head's at T = 64 is 12 MiB).
    let (n, input, out) = (37, 200, 31001);
    let x = Tensor::<2>::random([n, input], Distribution::Normal(0.0, 1.0), &device).require_grad();
    let w =
        Tensor::<2>::random([out, input], Distribution::Normal(0.0, 1.0), &device).require_grad();
    let output = (n * out * 4) as i64;
    // The gemm crate packs its operands into buffers it allocates per call when it runs on
    // rayon's threads (1.05 MiB measured here, the same whatever the output's size); burn Flex's
    // own matmul has them too, on top of its second output.
    let packing = 2 << 20;
    // Once unmeasured: the GEMM's per-thread packing buffers stay allocated after a first use.
    let warm = matmul_wt(x.clone(), w.clone()).sum().backward();
    drop(warm);

    let base = live_bytes() as i64;
    reset_peak();
    let y = matmul_wt(x.clone(), w.clone());
    let forward_peak = peak_bytes() as i64 - base;
    assert!(
        forward_peak < output + packing,
        "forward peak {forward_peak} for a {output}-byte output"
    );

    // Backward of sum(y): ∂y (one output's size, burn's), then ∂x and ∂W, each once.
    let grads_bytes = ((n * input + out * input) * 4) as i64;
    let base = live_bytes() as i64;
    reset_peak();
    let grads = y.sum().backward();
    let backward_peak = peak_bytes() as i64 - base;
    assert!(
        backward_peak < output + grads_bytes + packing,
        "backward peak {backward_peak}: ∂y {output} + ∂x, ∂W {grads_bytes}"
    );
    drop(grads);
}
