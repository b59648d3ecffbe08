//! One training process on a CUDA device, replayed through the caching allocator: the model
//! loaded (`loading.rs`), then one step, forward and backward (`allocation_order.rs`), with
//! cuBLAS taking its workspace from the allocator at the first product of each thread (the
//! forward's, then autograd's backward thread). What `torch.cuda.memory_reserved()` and
//! `max_memory_allocated()` read after it.

use std::collections::HashMap;

use serde::Serialize;

use super::PyTorchSetup;
use super::caching_allocator::CachingAllocator;
use super::llama;
use super::loading::{LOAD_IDS, LoadEvent, load_events};
use super::tape::Allocation;
use crate::config::LlamaConfig;

/// cuBLAS's workspace per handle on Hopper GPUs, as PyTorch takes it from the allocator
/// (measured on an H200: two handles held 64 MiB). NVIDIA recommends 4 MiB before Hopper.
pub const HOPPER_CUBLAS_WORKSPACE: u64 = 32 << 20;

/// What the allocator reports after the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DeviceProcess {
    /// `memory_reserved()`: the segments held from the driver.
    pub reserved: u64,
    /// `max_memory_reserved()` over the whole process (above `reserved` when an
    /// `empty_cache()` released segments).
    pub max_reserved: u64,
    /// `max_memory_allocated()` over the whole process.
    pub max_allocated: u64,
    /// The `cudaMalloc`s made.
    pub segment_mallocs: usize,
}

/// When cuBLAS takes its workspaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workspaces {
    /// At the first product of each thread: the forward's, then the backward's (a script that
    /// loads and trains).
    AtFirstProduct,
    /// Both before the load (a process that ran a warm-up step first, as `measure.py` does).
    BeforeLoad,
}

/// A fresh process that loads `config` as `setup` says and runs one step; cuBLAS's workspace
/// is `cublas_workspace` bytes a handle, taken `when`.
pub fn replay(
    config: &LlamaConfig,
    setup: &PyTorchSetup,
    cublas_workspace: u64,
    when: Workspaces,
) -> DeviceProcess {
    let mut device = AllocationReplay::default();
    let workspaces = [LOAD_IDS - 1, LOAD_IDS - 2].map(|id| Allocation::Malloc {
        id,
        bytes: cublas_workspace,
    });
    if when == Workspaces::BeforeLoad {
        workspaces.iter().for_each(|&w| device.apply(w));
    }
    for event in load_events(config, setup) {
        match event {
            LoadEvent::Block(block) => device.apply(block),
            LoadEvent::EmptyCache => device.allocator.empty_cache(),
        }
    }
    let recorded = llama::record(config, setup);
    let step = recorded.tape.step_allocations(recorded.loss);
    if when == Workspaces::AtFirstProduct {
        device.apply(workspaces[0]);
    }
    step.forward.iter().for_each(|&e| device.apply(e));
    if when == Workspaces::AtFirstProduct {
        device.apply(workspaces[1]);
    }
    step.backward.iter().for_each(|&e| device.apply(e));
    DeviceProcess {
        reserved: device.allocator.reserved(),
        max_reserved: device.allocator.max_reserved(),
        max_allocated: device.allocator.max_allocated(),
        segment_mallocs: device.allocator.segment_mallocs(),
    }
}

/// The allocator and the blocks handed out, by the prediction's ids: a stream of
/// [`Allocation`]s replayed through it.
#[derive(Default)]
pub struct AllocationReplay {
    /// The allocator the blocks come from.
    pub allocator: CachingAllocator,
    blocks: HashMap<usize, u64>,
}

impl AllocationReplay {
    /// Hands out or takes back one block.
    pub fn apply(&mut self, event: Allocation) {
        match event {
            Allocation::Malloc { id, bytes } => {
                self.blocks.insert(id, self.allocator.malloc(bytes));
            }
            Allocation::Free { id, .. } => {
                let address = self.blocks.remove(&id).expect("a block is freed once");
                self.allocator.free(address);
            }
        }
    }
}
