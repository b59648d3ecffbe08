//! glibc's allocator, set for training: every buffer from the heap, reused from step to step.
//!
//! By default glibc maps each allocation above a threshold (it adapts up to 32 MiB) with its own
//! `mmap` and unmaps it when freed. A training step allocates and frees the same large buffers
//! every step (logits, the embedding's gradient, attention blocks), so each step paid fresh
//! zero-filled pages and, on `munmap`, a TLB shoot-down across cores: ~14 % of the main
//! thread's samples in a SmolLM2 full fine-tuning + checkpointing run (`perf`), 554 `mmap` calls
//! in two steps. With these settings the buffers stay in the heap and are reused (79 calls).
//! Measured, alternated with the default: full FT + checkpointing +5 % tok/s (three rounds, all
//! faster); LoRA minor page faults −21 % and system time −20 %, tok/s within the noise; peak
//! resident size ±5 % (`napkin bench` trims the heap before a peak is read).
//! The cost: up to [`RETAINED_BYTES`] of freed memory may stay with the process until it exits.

/// Allocations below this come from the heap, and free memory at the top of the heap is kept up
/// to this much: 1 GiB, above TinyLlama's largest tensor (the 32000 × 2048 embedding, 262 MB).
const RETAINED_BYTES: i32 = 1 << 30;

/// The same settings as glibc tunables, for a reference process started by a benchmark (which
/// must get what napkin gets): `GLIBC_TUNABLES=<this>`.
pub fn glibc_tunables() -> String {
    format!(
        "glibc.malloc.mmap_threshold={RETAINED_BYTES}:glibc.malloc.trim_threshold={RETAINED_BYTES}"
    )
}

/// Applies the settings (glibc on Linux; elsewhere nothing).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn keep_large_buffers() {
    unsafe extern "C" {
        /// glibc: sets an allocator parameter; returns 1 on success.
        fn mallopt(param: i32, value: i32) -> i32;
    }
    const M_TRIM_THRESHOLD: i32 = -1;
    const M_MMAP_THRESHOLD: i32 = -3;
    // SAFETY: mallopt only changes glibc's allocator parameters; it takes no pointers. Called
    // first thing in main, before any thread exists.
    unsafe {
        mallopt(M_MMAP_THRESHOLD, RETAINED_BYTES);
        mallopt(M_TRIM_THRESHOLD, RETAINED_BYTES);
    }
}

/// Applies the settings (glibc on Linux; elsewhere nothing).
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn keep_large_buffers() {}
