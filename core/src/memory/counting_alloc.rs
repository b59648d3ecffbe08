//! Measuring memory on CPU backends, which keep no statistics of their own: a global allocator
//! that counts every byte allocated and freed, with the peak since the last reset.
//!
//! A library cannot choose the process's allocator, so each binary that wants numbers opts in:
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: napkin_core::memory::CountingAllocator = napkin_core::memory::CountingAllocator;
//! ```
//!
//! The counters are process-wide: measure one thing at a time.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// The system allocator, counting.
pub struct CountingAllocator;

// SAFETY: every call is forwarded to `System` with the same arguments; the counters are atomics.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            added(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            added(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            LIVE.fetch_sub(layout.size(), Relaxed);
            added(new_size);
        }
        new
    }
}

fn added(size: usize) {
    INSTALLED.store(true, Relaxed);
    let live = LIVE.fetch_add(size, Relaxed) + size;
    PEAK.fetch_max(live, Relaxed);
}

/// Whether the counting allocator is this process's global allocator.
pub fn is_installed() -> bool {
    // The first allocation after start-up flips the flag; make sure one has happened.
    drop(std::hint::black_box(Box::new(0u8)));
    INSTALLED.load(Relaxed)
}

/// Bytes currently allocated.
pub fn live_bytes() -> usize {
    LIVE.load(Relaxed)
}

/// The highest `live_bytes` since the last [`reset_peak`].
pub fn peak_bytes() -> usize {
    PEAK.load(Relaxed)
}

/// Starts a new peak window at the current live bytes; returns them.
pub fn reset_peak() -> usize {
    let live = LIVE.load(Relaxed);
    PEAK.store(live, Relaxed);
    live
}
