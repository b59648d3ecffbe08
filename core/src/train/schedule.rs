//! The learning-rate schedule, with Hugging Face's semantics (`get_*_schedule_with_warmup`):
//! optimizer step s (from 0) uses `lr · s / W` while s < W (linear warm-up), then, with
//! p = (s − W) / (S − W):
//!
//! - `constant`: `lr`;
//! - `linear`: `lr · (1 − p)`;
//! - `cosine`: `lr · ½(1 + cos(π p))`.

use serde::{Deserialize, Serialize};

use crate::config::spellings;

/// The shape of the decay after the warm-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ScheduleKind {
    /// The peak for the rest of the run.
    Constant,
    /// Straight down to zero at the last step.
    Linear,
    /// Half a cosine down to zero at the last step.
    #[default]
    Cosine,
}

spellings! {
    ScheduleKind, "schedule", "lr_scheduler", serde;
    Constant => "constant" []: "the peak for the rest of the run",
    Linear => "linear" []: "straight down to zero at the last step",
    Cosine => "cosine" []: "half a cosine down to zero at the last step",
}

/// Warm-up and decay over a run of `total_steps`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LrSchedule {
    /// The decay after the warm-up.
    #[serde(default)]
    pub kind: ScheduleKind,
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
        match self.kind {
            ScheduleKind::Constant => self.peak,
            ScheduleKind::Linear => self.peak * (1.0 - progress),
            ScheduleKind::Cosine => {
                self.peak * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warms_up_linearly_then_follows_half_a_cosine() {
        let s = LrSchedule {
            kind: ScheduleKind::Cosine,
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

    /// transformers' `get_linear_schedule_with_warmup` and
    /// `get_constant_schedule_with_warmup` (lr 1e-3, W = 10, S = 110): the multipliers
    /// `s / W`, then `(S − s) / (S − W)` or 1.
    #[test]
    fn linear_and_constant_follow_transformers() {
        let at = |kind, step| {
            LrSchedule {
                kind,
                peak: 1e-3,
                warmup_steps: 10,
                total_steps: 110,
            }
            .lr_at(step)
        };
        for (step, linear, constant) in [
            (0, 0.0, 0.0),
            (4, 4e-4, 4e-4),
            (10, 1e-3, 1e-3),
            (35, 7.5e-4, 1e-3),
            (60, 5e-4, 1e-3),
            (109, 1e-5, 1e-3),
            (110, 0.0, 1e-3),
        ] {
            assert!(
                (at(ScheduleKind::Linear, step) - linear).abs() < 1e-15,
                "linear at {step}"
            );
            assert!(
                (at(ScheduleKind::Constant, step) - constant).abs() < 1e-15,
                "constant at {step}"
            );
        }
        assert_eq!(
            "Linear".parse::<ScheduleKind>().unwrap(),
            ScheduleKind::Linear
        );
        assert!("step".parse::<ScheduleKind>().is_err());
    }
}
