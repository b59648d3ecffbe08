//! The learning-rate schedule: linear warm-up, then cosine decay to zero, with Hugging Face's
//! semantics (`get_cosine_schedule_with_warmup`): optimizer step s (from 0) uses
//! `lr · s / W` while s < W, then `lr · ½(1 + cos(π (s − W) / (S − W)))`.

use serde::{Deserialize, Serialize};

/// Warm-up and cosine decay over a run of `total_steps`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LrSchedule {
    /// The peak learning rate.
    pub peak: f64,
    /// W: warm-up steps.
    pub warmup_steps: u64,
    /// S: optimizer steps in the run.
    pub total_steps: u64,
}

impl LrSchedule {
    /// The learning rate of optimizer step `step` (0-based).
    pub fn lr_at(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.peak * step as f64 / self.warmup_steps.max(1) as f64;
        }
        let decay_steps = self.total_steps.saturating_sub(self.warmup_steps).max(1);
        let progress = ((step - self.warmup_steps) as f64 / decay_steps as f64).min(1.0);
        self.peak * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warms_up_linearly_then_follows_half_a_cosine() {
        let s = LrSchedule {
            peak: 1e-3,
            warmup_steps: 10,
            total_steps: 110,
        };
        assert_eq!(s.lr_at(0), 0.0);
        assert!((s.lr_at(5) - 5e-4).abs() < 1e-15);
        assert!((s.lr_at(10) - 1e-3).abs() < 1e-15);
        assert!(
            (s.lr_at(60) - 5e-4).abs() < 1e-12,
            "half-way: half the peak"
        );
        assert!(s.lr_at(110).abs() < 1e-15);
        assert!(
            (10..110).all(|i| s.lr_at(i + 1) <= s.lr_at(i)),
            "decays monotonically"
        );
    }
}
