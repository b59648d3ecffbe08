//! Memory: what napkin predicts and what it measures.
//!
//! - `weights`: napkin math of resident weight bytes (float, NF4 codes, NF4 scales).
//! - `counting_alloc`: byte-exact measurement on CPU backends (native and wasm).
//! - `meter`: one reader over the counting allocator and the cubecl memory pools.
//! - `preflight`: the predicted peak against the memory available, before a run starts.
//! - `measure`: real training steps measured against the predictor, with a Chrome trace.

pub mod counting_alloc;
pub mod measure;
pub mod meter;
pub mod preflight;
pub mod weights;

pub use counting_alloc::CountingAllocator;
pub use weights::{WeightBytes, weight_bytes};
