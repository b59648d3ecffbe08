//! The quantization codecs, bit-exact with bitsandbytes and independent of any tensor backend:
//! NF4 with double quantization (`nf4.rs`, its decoding loop `nf4_decode.rs`), blockwise 8-bit
//! states (`blockwise8.rs`) over bitsandbytes' dynamic map (`dynamic_map.rs`), and torch's
//! float32 `mean()` summation order that double quantization's offset needs (`torch_mean.rs`).

pub mod blockwise8;
pub mod dynamic_map;
pub mod nf4;
mod nf4_decode;
pub mod torch_mean;
