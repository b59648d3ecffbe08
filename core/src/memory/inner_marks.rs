//! Marks inside the backward pass, for a device pool that can only be read between operations.
//!
//! A cubecl pool (wgpu, CUDA) has no high-water mark: [`super::meter::Meter`] takes its peak
//! over readings at marks, and the step's own marks (after each forward that keeps a graph)
//! cannot see inside burn's backward, where the step holds most (the gradients flowing back,
//! what the forward kept, and each product's transients at once). napkin's own backward code
//! runs there, though: the NF4 product's `∂x = ∂y · W` dequantizes its weight into a transient
//! and multiplies, and the efficient attention's tiled backward walks its score blocks. While an
//! [`InnerMarks`] is armed, that code calls [`mark`] (the product with its operands and result
//! alive, as they are while it runs; the attention after each block) and the pool is read then.
//!
//! Unarmed (training, and every CPU backend) [`mark`] is one relaxed atomic load; armed it waits
//! for the device, which is a measurement's business only.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use burn::tensor::Device;

static ARMED: AtomicBool = AtomicBool::new(false);
static READING: Mutex<Option<Reading>> = Mutex::new(None);

/// The device being read and the largest reading so far.
#[derive(Debug)]
struct Reading {
    device: Device,
    largest: u64,
}

/// Reads `device`'s pool at every [`mark`] until dropped.
#[derive(Debug)]
pub struct InnerMarks(());

impl InnerMarks {
    /// Starts reading `device`'s pool at the marks; `None` when it has no pool (a CPU backend:
    /// the counting allocator's peak is exact there and needs no marks).
    pub fn arm(device: &Device) -> Option<InnerMarks> {
        device.memory_pool_usage()?;
        *lock() = Some(Reading {
            device: device.clone(),
            largest: 0,
        });
        ARMED.store(true, Ordering::Release);
        Some(InnerMarks(()))
    }

    /// Bytes in use at the fullest mark since [`InnerMarks::arm`] (0 when none was taken).
    pub fn largest(&self) -> u64 {
        lock().as_ref().map_or(0, |r| r.largest)
    }
}

impl Drop for InnerMarks {
    fn drop(&mut self) {
        ARMED.store(false, Ordering::Release);
        *lock() = None;
    }
}

/// Whether marks are being read: code that holds operands alive for a mark only does so then.
pub fn armed() -> bool {
    ARMED.load(Ordering::Relaxed)
}

/// Reads the armed device's pool (after waiting for its queued work) and keeps the largest.
pub fn mark() {
    if !armed() {
        return;
    }
    let mut guard = lock();
    if let Some(reading) = guard.as_mut() {
        // A failed sync leaves the pool as it is; the reading is still the pool's.
        let _ = reading.device.sync();
        let live = reading
            .device
            .memory_pool_usage()
            .map_or(0, |u| u.bytes_in_use);
        reading.largest = reading.largest.max(live);
    }
}

fn lock() -> std::sync::MutexGuard<'static, Option<Reading>> {
    READING.lock().unwrap_or_else(|e| e.into_inner())
}
