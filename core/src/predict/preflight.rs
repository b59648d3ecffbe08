//! Before loading and training: does the predicted peak fit in the memory the machine has?
//! Refusing up front with both numbers beats being killed by the OS halfway through.

use crate::error::{Error, Result};
use crate::predict::inventory::Scenario;
use crate::predict::timeline::step_timeline;

/// Bytes of memory available to a new allocation now: `MemAvailable` of `/proc/meminfo` on
/// Linux; None where it cannot be read (then no check is made).
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Refuses when the predicted peak of `scenario`'s step (weights, optimizer state, gradients
/// and the activations alive at the peak) is more than `available` bytes.
pub fn check_fits(scenario: &Scenario, available: u64) -> Result<u64> {
    let peak = step_timeline(scenario).peak;
    if peak.bytes > available {
        return Err(Error::NotEnoughMemory {
            predicted_mib: peak.bytes as f64 / (1u64 << 20) as f64,
            available_mib: available as f64 / (1u64 << 20) as f64,
            at: peak.label,
        });
    }
    Ok(peak.bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LlamaConfig;

    /// Full fine-tuning of Llama-2-7B does not fit in 24 GiB; the error names both numbers.
    #[test]
    fn a_7b_full_fine_tune_does_not_fit_in_24_gib() {
        let s = Scenario::new(LlamaConfig::llama2_7b(), 1, 512);
        let err = check_fits(&s, 24 << 30).unwrap_err().to_string();
        assert!(err.contains("24576 MiB available"), "{err}");
        assert!(err.contains("--checkpointing"), "{err}");
        let small = Scenario::new(LlamaConfig::smollm2_135m(), 1, 256);
        assert!(check_fits(&small, 24 << 30).is_ok());
        assert!(available_memory().is_none_or(|b| b > 0));
    }
}
