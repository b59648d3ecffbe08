//! `eˣ` for the fused kernels: one scalar formula the compiler vectorizes, and the two loops
//! the kernels run it in (a sum of exponentials, an in-place map), each compiled twice: for
//! the build's baseline (SSE2 on x86-64, four lanes) and with AVX2 (eight lanes) where the CPU
//! has it, chosen at run time. Both use the same IEEE operations (no fused multiply-add), so
//! they give the same bits.

use super::LANES;

/// `eˣ` for the kernels, in a form the compiler vectorizes (libm's `expf` is a call per value,
/// and takes a slow path that sets `errno` whenever the result underflows: half of every
/// diagonal attention block is masked to −1e9). Relative error below 2e-7 (tested);
/// results below e⁻⁸⁷ are 0 and above e⁸⁸ are clamped to e⁸⁸; NaN stays NaN.
///
/// `eˣ = 2ⁿ·eʳ` with `n = round(x·log₂e)` and `r = x − n·ln2` (ln2 in two parts, so `r` is
/// exact), `eʳ` by a degree-6 polynomial on `|r| ≤ ln2/2` (Cephes' coefficients).
/// (Cephes' digits as published; the comparisons below are NaN-aware on purpose.)
#[inline(always)]
#[allow(
    clippy::excessive_precision,
    clippy::manual_clamp,
    clippy::neg_cmp_op_on_partial_ord
)]
pub(crate) fn fast_exp(x: f32) -> f32 {
    const LOWEST: f32 = -87.0;
    const HIGHEST: f32 = 88.0;
    // Comparisons rather than min/max: a NaN input must stay NaN.
    let clamped = if x > HIGHEST {
        HIGHEST
    } else if x < LOWEST {
        LOWEST
    } else {
        x
    };
    // Round to nearest by the 1.5·2²³ trick (no rounding instruction needed).
    const ROUND: f32 = 12_582_912.0;
    let shifted = clamped * std::f32::consts::LOG2_E + ROUND;
    let n = shifted - ROUND;
    let r = clamped - n * 0.693_359_4 + n * 2.121_944_4e-4;
    let r2 = r * r;
    let poly = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2)
        * r
        + 1.666_666_5e-1)
        * r
        + 5.000_000_1e-1;
    let e_r = poly * r2 + r + 1.0;
    // n as an integer from the bits of `shifted` (1.5·2²³ + n keeps n in its low mantissa
    // bits): integer lanes, where `n as i32` (a saturating, NaN-checked conversion) kept the
    // loops that call this scalar.
    let n_int = shifted.to_bits().wrapping_sub(ROUND.to_bits());
    let two_n = f32::from_bits(n_int.wrapping_add(127) << 23);
    // Below e⁻⁸⁷ the result is 0: a product with 0 or 1 rather than a select, which the
    // compiler turned into a branch around the whole polynomial (and kept the loops scalar).
    let underflow_mask = f32::from(u8::from(!(x < LOWEST)));
    e_r * two_n * underflow_mask
}

/// `Σ exp(x − shift)`.
pub(crate) fn sum_of_exp(x: &[f32], shift: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { avx2::sum_of_exp(x, shift) };
    }
    plain::sum_of_exp(x, shift)
}

/// `x ← scale · exp(x − shift)`, value by value.
pub(crate) fn exp_in_place(x: &mut [f32], shift: f32, scale: f32) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { avx2::exp_in_place(x, shift, scale) };
    }
    plain::exp_in_place(x, shift, scale)
}

/// The loops, for the build's baseline instruction set.
mod plain {
    use super::{LANES, fast_exp};

    #[inline(always)]
    pub fn sum_of_exp(x: &[f32], shift: f32) -> f32 {
        let mut lanes = [0.0f32; LANES];
        let chunks = x.chunks_exact(LANES);
        let rest = chunks.remainder();
        for chunk in chunks {
            for (lane, &v) in lanes.iter_mut().zip(chunk) {
                *lane += fast_exp(v - shift);
            }
        }
        lanes.iter().sum::<f32>() + rest.iter().map(|&v| fast_exp(v - shift)).sum::<f32>()
    }

    #[inline(always)]
    pub fn exp_in_place(x: &mut [f32], shift: f32, scale: f32) {
        for v in x {
            *v = scale * fast_exp(*v - shift);
        }
    }
}

/// The same loops compiled with AVX2 enabled.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    /// # Safety
    /// The CPU must have AVX2.
    #[target_feature(enable = "avx2")]
    pub unsafe fn sum_of_exp(x: &[f32], shift: f32) -> f32 {
        super::plain::sum_of_exp(x, shift)
    }

    /// # Safety
    /// The CPU must have AVX2.
    #[target_feature(enable = "avx2")]
    pub unsafe fn exp_in_place(x: &mut [f32], shift: f32, scale: f32) {
        super::plain::exp_in_place(x, shift, scale)
    }
}

#[cfg(test)]
mod tests {
    use super::{exp_in_place, fast_exp, plain, sum_of_exp};

    /// Within 2e-7 relative of f64's `exp` from −87 to 88 (every 1/1000), 0 below, NaN kept.
    #[test]
    fn fast_exp_is_accurate_over_the_f32_range() {
        let mut worst = 0.0f64;
        for i in -87_000..=88_000 {
            let x = i as f32 / 1000.0;
            let exact = (x as f64).exp();
            let err = ((fast_exp(x) as f64 - exact) / exact).abs();
            worst = worst.max(err);
        }
        assert!(worst < 2e-7, "worst relative error {worst:e}");
        assert_eq!(fast_exp(-1.0e9), 0.0);
        assert_eq!(fast_exp(0.0), 1.0);
        assert!(fast_exp(f32::NAN).is_nan());
        assert!(fast_exp(1.0e9).is_finite());
    }

    /// The dispatching loops (AVX2 where the CPU has it) give the same bits as the baseline
    /// ones and as `fast_exp` value by value, over lengths around the lane counts and values
    /// that underflow, overflow or are NaN.
    #[test]
    fn every_build_of_the_loops_gives_the_same_bits() {
        let special = [-1.0e9, -88.0, -87.0, 0.0, 88.5, 1.0e9, f32::NAN];
        for n in [0usize, 1, 3, 4, 7, 8, 9, 15, 16, 17, 100, 1027] {
            let x: Vec<f32> = (0..n)
                .map(|i| match i % 11 {
                    10 => special[(i / 11) % special.len()],
                    _ => ((i * 37 % 101) as f32 - 50.0) / 3.0,
                })
                .collect();
            let (shift, scale) = (1.5f32, 0.25f32);
            let mut ours = x.clone();
            exp_in_place(&mut ours, shift, scale);
            let mut baseline = x.clone();
            plain::exp_in_place(&mut baseline, shift, scale);
            for (i, ((&o, &b), &v)) in ours.iter().zip(&baseline).zip(&x).enumerate() {
                let one = scale * fast_exp(v - shift);
                assert_eq!(o.to_bits(), b.to_bits(), "n = {n}, value {i} ({v})");
                assert_eq!(o.to_bits(), one.to_bits(), "n = {n}, value {i} ({v})");
            }
            let finite: Vec<f32> = x.iter().copied().filter(|v| v.abs() < 1.0e3).collect();
            assert_eq!(
                sum_of_exp(&finite, shift).to_bits(),
                plain::sum_of_exp(&finite, shift).to_bits(),
                "Σexp, n = {n}"
            );
        }
    }
}
