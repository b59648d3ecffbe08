//! Reading memory on any backend: the counting allocator on the CPU backends (heap bytes,
//! exact, with a true peak), the memory pool of the cubecl backends (wgpu, cuda: bytes in
//! use after a sync, peak only over the marks taken). Every number says which method made it.

use burn::tensor::Device;
use serde::{Deserialize, Serialize};

use super::counting_alloc::{is_installed, live_bytes, peak_bytes, reset_peak};
use crate::error::{Error, Result};

/// How a number was measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MeterMethod {
    /// napkin's counting global allocator: heap bytes, exact; the peak is exact.
    CountingAllocator,
    /// The device's memory pool after a sync: bytes in use; the peak is the largest mark.
    DevicePool,
}

impl MeterMethod {
    /// In words, for reports.
    pub fn describe(self) -> &'static str {
        match self {
            MeterMethod::CountingAllocator => "counting global allocator (heap bytes; exact peak)",
            MeterMethod::DevicePool => {
                "device memory pool after a sync (bytes in use; peak over marks only)"
            }
        }
    }
}

/// A memory reader for one device.
#[derive(Debug)]
pub struct Meter {
    source: Source,
    peak_over_marks: u64,
}

/// Where a [`Meter`] reads: the counting allocator (the host), or a device's pool.
#[derive(Debug)]
enum Source {
    CountingAllocator,
    DevicePool(Device),
}

impl Meter {
    /// The right method for `device`: its pool when it has one, else the counting allocator,
    /// which must be the program's global allocator.
    pub fn for_device(device: &Device) -> Result<Self> {
        let source = if device.memory_pool_usage().is_some() {
            Source::DevicePool(device.clone())
        } else if is_installed() {
            Source::CountingAllocator
        } else {
            return Err(Error::Input(
                "this CPU device has no memory statistics and the counting allocator is not \
                 the global allocator of this program"
                    .into(),
            ));
        };
        Ok(Meter {
            source,
            peak_over_marks: 0,
        })
    }

    /// Host memory, with the counting allocator (which must be the global allocator): the
    /// other side of an offloaded optimizer.
    pub fn host() -> Result<Self> {
        if !is_installed() {
            return Err(Error::Input(
                "measuring host memory needs the counting allocator as the global allocator of \
                 this program"
                    .into(),
            ));
        }
        Ok(Meter {
            source: Source::CountingAllocator,
            peak_over_marks: 0,
        })
    }

    /// The method.
    pub fn method(&self) -> MeterMethod {
        match self.source {
            Source::CountingAllocator => MeterMethod::CountingAllocator,
            Source::DevicePool(_) => MeterMethod::DevicePool,
        }
    }

    /// Bytes in use now (a mark).
    pub fn live(&mut self) -> u64 {
        if let Source::DevicePool(device) = &self.source {
            // A failed sync leaves the pool as it is; the reading is still the pool's.
            let _ = device.sync();
        }
        self.live_without_sync()
    }

    /// Bytes in use as the books stand, without waiting for the device: for a caller that
    /// cannot block (the browser on WebGPU) and has just awaited a read, so the work queued
    /// before it is done.
    pub fn live_without_sync(&mut self) -> u64 {
        let live = match &self.source {
            Source::CountingAllocator => live_bytes() as u64,
            Source::DevicePool(device) => device.memory_pool_usage().map_or(0, |u| u.bytes_in_use),
        };
        self.peak_over_marks = self.peak_over_marks.max(live);
        live
    }

    /// Counts a reading of this meter's pool taken elsewhere (`inner_marks`, inside the
    /// backward) toward the peak over the marks.
    pub fn include_mark(&mut self, live: u64) {
        self.peak_over_marks = self.peak_over_marks.max(live);
    }

    /// Starts a peak window; returns the bytes in use at its start.
    pub fn start_peak(&mut self) -> u64 {
        match self.source {
            Source::CountingAllocator => reset_peak() as u64,
            Source::DevicePool(_) => {
                self.peak_over_marks = 0;
                self.live()
            }
        }
    }

    /// The peak since [`Meter::start_peak`].
    pub fn peak(&mut self) -> u64 {
        match self.source {
            Source::CountingAllocator => peak_bytes() as u64,
            Source::DevicePool(_) => {
                self.live();
                self.peak_over_marks
            }
        }
    }
}
