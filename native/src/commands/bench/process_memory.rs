//! The process's resident memory as the kernel counts it (Linux): the same measure for napkin
//! and for the PyTorch reference process (`scripts/reference/suite.py` does the same three
//! things), so their peaks compare like for like.
//!
//! A run's peak is read as: hand freed heap back to the OS (`malloc_trim`), restart the
//! kernel's high-water mark (`/proc/self/clear_refs` ← `5`), run, read `VmHWM`.

/// Resident bytes now (`VmRSS`), when the platform reports it.
pub fn resident_bytes() -> Option<u64> {
    status_field("VmRSS")
}

/// Resident high-water mark since the last [`restart_peak`] (`VmHWM`).
pub fn peak_resident_bytes() -> Option<u64> {
    status_field("VmHWM")
}

/// Trims the heap and restarts the high-water mark at the current resident size. Best effort:
/// where the platform has no such counters the peaks read as unknown.
pub fn restart_peak() {
    trim_heap();
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn status_field(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let value = status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))?;
    // "   123456 kB"
    let kib: u64 = value.split_whitespace().next()?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim_heap() {
    unsafe extern "C" {
        /// glibc: releases free memory at the top of the heap and in free chunks to the OS.
        fn malloc_trim(pad: usize) -> i32;
    }
    // SAFETY: malloc_trim only walks glibc's own free lists; it takes no pointers from us.
    unsafe {
        malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim_heap() {}
