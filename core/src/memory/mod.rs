//! Memory: what napkin predicts and what it measures.
//!
//! - `weights`: napkin math of resident weight bytes (float, NF4 codes, NF4 scales).
//! - `counting_alloc`: byte-exact measurement on CPU backends (native and wasm).

pub mod counting_alloc;
pub mod weights;

pub use counting_alloc::CountingAllocator;
pub use weights::{WeightBytes, weight_bytes};
