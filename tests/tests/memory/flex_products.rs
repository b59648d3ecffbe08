//! On burn Flex (the page's backend) a linear layer's product holds its output once, forward
//! and backward: napkin's `x·Wᵀ` (`kernels/cpu/fused/x_wt.rs`) writes into a `Vec<f32>` that Flex
//! takes over, where burn Flex's own matmul allocated each output twice (measured: a peak of
//! 2 × the output; SmolLM2's step peak in the page was 1.71× the prediction).

use burn::tensor::{Distribution, Tensor};
use napkin_core::model::matmul_wt::matmul_wt;

use super::*;

#[test]
fn a_flex_product_allocates_its_output_once() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    assert!(is_installed());
    // Odd sizes, an output of 4.4 MiB; and SmolLM2's head at T = 128 (24 MiB of logits, a
    // 108 MiB weight gradient).
    for shape in [(37, 200, 31001), (128, 576, 49152)] {
        product_allocates_its_output_once(shape);
    }
}

fn product_allocates_its_output_once((n, input, out): (usize, usize, usize)) {
    let device = DeviceKind::Flex.open().unwrap().autodiff();
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
        "[{n}, {input}] · [{out}, {input}]ᵀ: forward peak {forward_peak} for a {output}-byte output"
    );

    // Backward through the causal-LM loss, as the LM head's: the loss writes ∂y over the output
    // it kept, so the backward adds ∂x and ∂W, each once, and the GEMM's packing (a backward of
    // `sum(y)` would add burn's ∂y, one output's size, and hid a packed copy of ∂yᵀ as large).
    let labels: Vec<i64> = (0..n).map(|i| ((i * 7919) % out) as i64).collect();
    let loss = causal_lm_loss(y.reshape([1, n, out]), &labels).unwrap();
    let grads_bytes = ((n * input + out * input) * 4) as i64;
    // ∂W's GEMM runs in blocks of output rows whose packed ∂y is at most 4 MiB
    // (`x_wt::PACKED_GRADIENT_BYTES`); before, it packed all of ∂y (24 MiB at SmolLM2's head).
    let gradient_packing = 4 << 20;
    let base = live_bytes() as i64;
    reset_peak();
    let grads = loss.sum.backward();
    let backward_peak = peak_bytes() as i64 - base;
    assert!(
        backward_peak < grads_bytes + gradient_packing + packing,
        "[{n}, {input}] · [{out}, {input}]ᵀ: backward peak {backward_peak}: ∂x, ∂W {grads_bytes}"
    );
    drop(grads);
}
