//! The memory tricks' arithmetic, independent of any tensor backend.

pub mod blockwise8;
pub mod dynamic_map;
pub mod nf4;
mod nf4_decode;
pub mod torch_mean;
