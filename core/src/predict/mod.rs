//! The napkin-math predictor: pure arithmetic on configurations (no tensors, builds for wasm).
//!
//! - `units`: bytes in the units learners meet (1024-based as accelerate prints them; 10^9 GB).
//! - `rules`: the seed-style bytes-per-parameter rules (weights, gradients, optimizer state).
//! - `accelerate`: the rows `accelerate estimate-memory` prints, from a config alone.
//! - `bert`: parameter counts of BERT configs (accelerate's documented example).
//! - `zero`: DeepSpeed's ZeRO-2 / ZeRO-3 model-state estimates.

pub mod accelerate;
pub mod bert;
pub mod rules;
pub mod units;
pub mod zero;
