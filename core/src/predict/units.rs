//! Byte counts as text.

/// accelerate's `convert_bytes`: 1024-based steps named bytes, KB, MB, GB, TB, PB, the value
/// rounded to two decimals (Python's `round`, which drops trailing zeros: `1.6 GB`).
pub fn accelerate_units(bytes: f64) -> String {
    let mut size = bytes;
    for unit in ["bytes", "KB", "MB", "GB", "TB"] {
        if size < 1024.0 {
            return format!("{} {unit}", python_round2(size));
        }
        size /= 1024.0;
    }
    format!("{} PB", python_round2(size))
}

/// `str(round(x, 2))` for the magnitudes printed here.
fn python_round2(x: f64) -> String {
    let rounded = (x * 100.0).round() / 100.0;
    let text = format!("{rounded:.2}");
    let trimmed = text.trim_end_matches('0');
    if trimmed.ends_with('.') {
        format!("{trimmed}0")
    } else {
        trimmed.to_string()
    }
}

/// Binary gibibytes (2^30 bytes), as DeepSpeed prints "GB".
pub fn gib(bytes: f64) -> f64 {
    bytes / (1u64 << 30) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_like_accelerate() {
        assert_eq!(accelerate_units(433_249_280.0), "413.18 MB");
        assert_eq!(accelerate_units(4.0 * 433_249_280.0), "1.61 GB");
        assert_eq!(accelerate_units(512.0), "512.0 bytes");
        assert_eq!(accelerate_units(1536.0), "1.5 KB");
    }
}
