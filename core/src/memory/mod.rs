//! Memory as it is measured (the predictions are in `predict`, the harness that compares the
//! two in `measure`).
//!
//! - `counting_alloc`: byte-exact measurement on CPU backends (native and wasm).
//! - `meter`: one reader over the counting allocator and the cubecl memory pools.
//! - `inner_marks`: readings of a cubecl pool taken inside the backward, by napkin's own
//!   backward code.

pub mod counting_alloc;
pub mod inner_marks;
pub mod meter;

pub use counting_alloc::CountingAllocator;
