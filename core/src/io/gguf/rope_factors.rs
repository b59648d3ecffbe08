//! Llama 3's RoPE schedule in GGUF: llama.cpp's converter writes no parameters for it, only
//! `rope_freqs.weight`, one divisor per frequency (`[head_dim / 2]`): 1 for the high
//! frequencies, the factor for the low ones, `1 / ((1 − s)/factor + s)` on the ramp between,
//! where `s = (L_old / wavelength − low) / (high − low)`. llama.cpp's RoPE divides each plain
//! frequency `θ^(−2j/d)` by its divisor.
//!
//! napkin keeps the schedule as transformers does ([`RopeScaling::Llama3`]), so it reads the
//! divisors back into the four parameters: Meta's own (low 1, high 4, a context of 8192) when
//! they give the file's divisors, else parameters fitted to the ramp (low 1; the high factor
//! and the context from where the ramp starts and ends), kept only if they give the file's
//! divisors again. Divisors no llama3 schedule gives are refused by name.

use crate::config::RopeScaling;

/// The name llama.cpp gives the divisors.
pub const ROPE_FREQS: &str = "rope_freqs.weight";

/// Relative difference two divisors may have and still be the same (the converter computes
/// them in float32; a reader recomputes them with another `powf`).
const SAME: f32 = 1e-5;

/// The plain frequencies as the converter computes them: `1 / θ^(2j/d)` in float32.
fn plain_frequencies(theta: f64, head_dim: usize) -> Vec<f32> {
    (0..head_dim / 2)
        .map(|j| 1.0 / (theta as f32).powf((2 * j) as f32 / head_dim as f32))
        .collect()
}

/// The divisors llama.cpp's converter writes for `scaling` (`None` for plain RoPE), in its
/// float32 arithmetic.
pub fn llama3_divisors(scaling: &RopeScaling, theta: f64, head_dim: usize) -> Option<Vec<f32>> {
    let RopeScaling::Llama3 {
        factor,
        low_freq_factor,
        high_freq_factor,
        original_max_position_embeddings,
    } = *scaling
    else {
        return None;
    };
    let (low_wavelength, high_wavelength) = (
        (original_max_position_embeddings / low_freq_factor) as f32,
        (original_max_position_embeddings / high_freq_factor) as f32,
    );
    let old = original_max_position_embeddings as f32;
    let (low, span) = (
        low_freq_factor as f32,
        (high_freq_factor - low_freq_factor) as f32,
    );
    let factor = factor as f32;
    let divisors = plain_frequencies(theta, head_dim)
        .into_iter()
        .map(|freq| {
            let wavelength = std::f32::consts::TAU / freq;
            if wavelength < high_wavelength {
                1.0
            } else if wavelength > low_wavelength {
                factor
            } else {
                let smooth = (old / wavelength - low) / span;
                1.0 / ((1.0 - smooth) / factor + smooth)
            }
        })
        .collect();
    Some(divisors)
}

/// The schedule behind a file's divisors: [`RopeScaling::Default`] when every one is 1, a
/// [`RopeScaling::Llama3`] that gives them again, or `None` when no llama3 schedule does.
pub fn scaling_from_divisors(divisors: &[f32], theta: f64, head_dim: usize) -> Option<RopeScaling> {
    if divisors.len() != head_dim / 2 || divisors.iter().any(|d| !d.is_finite() || *d <= 0.0) {
        return None;
    }
    let same = |a: f32, b: f32| (a - b).abs() <= SAME * b.abs();
    if divisors.iter().all(|&d| same(d, 1.0)) {
        return Some(RopeScaling::Default);
    }
    let factor = divisors.iter().copied().fold(1.0f32, f32::max);
    // Inverse wavelengths, falling with j: the high frequencies come first.
    let x: Vec<f64> = plain_frequencies(theta, head_dim)
        .iter()
        .map(|&f| f as f64 / std::f64::consts::TAU)
        .collect();
    let kept: Vec<usize> = (0..divisors.len())
        .filter(|&j| same(divisors[j], 1.0))
        .collect();
    let slowed: Vec<usize> = (0..divisors.len())
        .filter(|&j| same(divisors[j], factor))
        .collect();
    let ramp: Vec<usize> = (0..divisors.len())
        .filter(|j| !kept.contains(j) && !slowed.contains(j))
        .collect();
    if slowed.is_empty() {
        return None; // the factor itself is never reached: it cannot be read off
    }
    let mut candidates = vec![llama3(factor as f64, 1.0, 4.0, 8192.0)];
    // s = (x − x₀) / w on the ramp: 0 where the slowed frequencies end, 1 where the kept begin.
    let f = factor as f64;
    let s = |j: usize| (1.0 / divisors[j] as f64 - 1.0 / f) / (1.0 - 1.0 / f);
    let last_kept = kept.iter().map(|&j| x[j]).fold(f64::INFINITY, f64::min);
    let first_slowed = slowed.iter().map(|&j| x[j]).fold(0.0, f64::max);
    let ends = match ramp.as_slice() {
        [] => {
            let gap = last_kept - first_slowed;
            gap.is_finite()
                .then(|| (first_slowed + gap / 3.0, gap / 3.0))
        }
        [j] => {
            let (xj, sj) = (x[*j], s(*j));
            let width = ((last_kept - xj) / (1.0 - sj)).min((xj - first_slowed) / sj) / 2.0;
            width.is_finite().then_some((xj - sj * width, width))
        }
        _ => {
            // Least squares of s = a·x − b over the ramp.
            let n = ramp.len() as f64;
            let (sx, ss) = (
                ramp.iter().map(|&j| x[j]).sum::<f64>(),
                ramp.iter().map(|&j| s(j)).sum::<f64>(),
            );
            let sxx: f64 = ramp.iter().map(|&j| x[j] * x[j]).sum();
            let sxs: f64 = ramp.iter().map(|&j| x[j] * s(j)).sum();
            let a = (n * sxs - sx * ss) / (n * sxx - sx * sx);
            let b = (a * sx - ss) / n;
            (a > 0.0).then(|| (b / a, 1.0 / a))
        }
    };
    if let Some((start, width)) = ends
        && start > 0.0
        && width > 0.0
    {
        // low = 1: the context is the wavelength where the ramp starts; high = 1 + width/start.
        candidates.push(llama3(f, 1.0, 1.0 + width / start, 1.0 / start));
    }
    candidates.into_iter().find(|candidate| {
        llama3_divisors(candidate, theta, head_dim).is_some_and(|again| {
            again.len() == divisors.len() && again.iter().zip(divisors).all(|(&a, &d)| same(a, d))
        })
    })
}

fn llama3(factor: f64, low: f64, high: f64, context: f64) -> RopeScaling {
    RopeScaling::Llama3 {
        factor,
        low_freq_factor: low,
        high_freq_factor: high,
        original_max_position_embeddings: context,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Meta's Llama 3.1 (factor 8) and 3.2 (32) schedules at head_dim 64 and 128, and schedules
    /// with 0, 1, 2 and more frequencies on the ramp: read back from their divisors, each gives
    /// the same divisors again.
    #[test]
    fn divisors_read_back_into_a_schedule_that_gives_them() {
        let cases = [
            (llama3(8.0, 1.0, 4.0, 8192.0), 5e5, 128),
            (llama3(32.0, 1.0, 4.0, 8192.0), 5e5, 64),
            (llama3(32.0, 1.0, 8.0, 64.0), 5e5, 32),
            (llama3(16.0, 1.0, 4.0, 64.0), 1e4, 16),
            (llama3(4.0, 2.0, 3.0, 100.0), 1e4, 64),
            (llama3(8.0, 1.0, 1.5, 300.0), 5e5, 64),
        ];
        for (schedule, theta, dim) in cases {
            let divisors = llama3_divisors(&schedule, theta, dim).unwrap();
            let ramp = divisors
                .iter()
                .filter(|&&d| d > 1.0 && d < divisors[dim / 2 - 1])
                .count();
            let read = scaling_from_divisors(&divisors, theta, dim)
                .unwrap_or_else(|| panic!("{schedule:?}: not read back ({ramp} on the ramp)"));
            let again = llama3_divisors(&read, theta, dim).unwrap();
            for (a, d) in again.iter().zip(&divisors) {
                assert!(
                    (a - d).abs() <= SAME * d,
                    "{schedule:?} → {read:?}: {a} vs {d}"
                );
            }
        }
    }

    #[test]
    fn meta_schedules_are_read_as_meta_wrote_them() {
        let schedule = llama3(32.0, 1.0, 4.0, 8192.0);
        let divisors = llama3_divisors(&schedule, 5e5, 64).unwrap();
        assert_eq!(scaling_from_divisors(&divisors, 5e5, 64), Some(schedule));
    }

    #[test]
    fn plain_divisors_are_plain_rope_and_others_are_refused() {
        assert_eq!(
            scaling_from_divisors(&[1.0; 8], 1e4, 16),
            Some(RopeScaling::Default)
        );
        // Rising and falling: no llama3 schedule.
        let odd = [1.0, 3.0, 1.0, 3.0, 2.0, 3.0, 3.0, 3.0];
        assert_eq!(scaling_from_divisors(&odd, 1e4, 16), None);
        // The wrong length, or a divisor that is not positive.
        assert_eq!(scaling_from_divisors(&[1.0; 4], 1e4, 16), None);
        assert_eq!(scaling_from_divisors(&[0.0; 8], 1e4, 16), None);
    }
}
