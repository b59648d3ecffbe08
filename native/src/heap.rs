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
//!
//! One arena for every thread: napkin's commands run on rayon's pool threads, and glibc gives
//! each thread its own arena, whose heaps are at most 64 MiB — so a larger buffer (SmolLM2's
//! 113 MB embedding gradient, a 4096 × 4096 weight dequantized to f32) was `mmap`ed and unmapped
//! on every use whatever the threshold says: fresh zero-filled pages each time. With one arena
//! it comes from the main heap and is reused. Measured, alternated with the default (two
//! rounds): the 4096² NF4 matmul 147–155 → 204–211 GFLOP/s, SmolLM2 full fine-tuning 204–210 →
//! 218–223 tokens/s; with two compute threads the arena's lock is not contended to any
//! measurable degree.
//!
//! The cost: up to [`RETAINED_BYTES`] of freed memory may stay with the process until it exits.

/// Allocations below this come from the heap, and free memory at the top of the heap is kept up
/// to this much: 1 GiB, above TinyLlama's largest tensor (the 32000 × 2048 embedding, 262 MB).
const RETAINED_BYTES: i32 = 1 << 30;

/// The same settings as glibc tunables, for a reference process started by a benchmark (which
/// must get what napkin gets): `GLIBC_TUNABLES=<this>`.
pub fn glibc_tunables() -> String {
    format!(
        "glibc.malloc.mmap_threshold={RETAINED_BYTES}:glibc.malloc.trim_threshold={RETAINED_BYTES}:\
         glibc.malloc.arena_max=1"
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
    const M_ARENA_MAX: i32 = -8;
    // SAFETY: mallopt only changes glibc's allocator parameters; it takes no pointers. Called
    // first thing in main, before any thread exists.
    unsafe {
        mallopt(M_MMAP_THRESHOLD, RETAINED_BYTES);
        mallopt(M_TRIM_THRESHOLD, RETAINED_BYTES);
        mallopt(M_ARENA_MAX, 1);
    }
}

/// Applies the settings (glibc on Linux; elsewhere nothing).
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn keep_large_buffers() {}
