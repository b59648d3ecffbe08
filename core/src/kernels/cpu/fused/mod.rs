//! Fused element-wise kernels for the CPU backends, as custom autodiff operations.
//!
//! burn's CPU backends run every element-wise op on one thread and one op at a time: SiLU·up
//! is a sigmoid, two products and, in the backward, six more passes over `[B, T, F]`; the
//! loss's log-softmax makes about ten passes over the `[B, T, V]` logits. Profiled on a
//! SmolLM2 train step, those passes kept one core busy while the other idled between GEMMs.
//! Each kernel here does its op in one pass over the values, split over rayon's threads, and
//! its backward writes the gradients over the buffers the forward kept (no new allocation).
//!
//! The kernels run where the tensors live on Flex or NdArray (f32). Every other case (wgpu,
//! CUDA, half precision) runs the same formula with burn's ops.

pub mod cross_entropy;
pub(crate) mod exp;
pub mod rms_norm;
pub mod rope;
mod runtime;
pub(crate) mod small_gemm;
pub mod swiglu;
pub(crate) mod tiled_attention;
pub mod x_wt;

pub(crate) use exp::{exp_in_place, fast_exp, sum_of_exp};
pub use runtime::kernels_on;
pub(crate) use runtime::{
    CpuKernel, CpuValues, backend_tensor, cpu_values, host_values, is_f32, on_cpu, owned,
    read_on_cpu, tracked_or_plain, with_values,
};

/// Values per rayon task: large enough that scheduling is noise, small enough that two
/// threads share a `[256, 1536]` activation evenly.
pub(crate) const VALUES_PER_TASK: usize = 16 * 1024;

/// Independent partial results of a reduction: an f32 sum or maximum in one chain does not
/// vectorize (the compiler may not reorder it); eight chains fill vector registers.
pub(crate) const LANES: usize = 8;

/// The largest value (NaNs are skipped, as `f32::max` does; −∞ for an empty slice).
pub(crate) fn max_of(x: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane = if v > *lane { v } else { *lane };
        }
    }
    rest.iter()
        .chain(&lanes)
        .copied()
        .fold(f32::NEG_INFINITY, f32::max)
}

/// `Σ x`.
pub(crate) fn sum_of(x: &[f32]) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane += v;
        }
    }
    lanes.iter().sum::<f32>() + rest.iter().sum::<f32>()
}

#[cfg(test)]
mod tests {
    /// The lane-wise reductions agree with the plain ones (lengths around the lane count).
    #[test]
    fn lane_reductions_match_plain_ones() {
        for n in [0usize, 1, 7, 8, 9, 100, 1027] {
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
                .collect();
            let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(super::max_of(&x), max, "max, n = {n}");
            let sum: f64 = x.iter().map(|&v| f64::from(v)).sum();
            assert!(
                (f64::from(super::sum_of(&x)) - sum).abs() < 1e-3,
                "sum, n = {n}"
            );
            let shift = if n == 0 { 0.0 } else { max };
            let sum_exp: f64 = x
                .iter()
                .map(|&v| (f64::from(v) - f64::from(shift)).exp())
                .sum();
            let ours = f64::from(super::sum_of_exp(&x, shift));
            assert!(
                (ours - sum_exp).abs() <= 1e-6 * sum_exp.max(1.0),
                "Σexp, n = {n}"
            );
        }
    }
}
