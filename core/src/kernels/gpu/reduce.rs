//! The reduction the few-row kernels share (cubecl): 64 units' partial values in shared
//! memory halved to two, by sum or by maximum (`rms_norm_rows.rs`' sum of squares,
//! `attention_rows.rs`' largest score and sum of exponentials).
//!
//! The five halving steps are written out and the function is expanded into its caller
//! (cubecl inlines `#[cube]` functions), so every barrier stays at the kernel's top level:
//! WGSL refuses a barrier in control flow it cannot prove uniform. The caller writes its unit's
//! value, synchronises, calls this, then takes a barrier of its own choosing (a storage one
//! when the units next read what the others wrote to global memory) before reading
//! `partial[0]` and `partial[1]`.

use cubecl::prelude::*;

/// Units (threads) per cube that [`halve_to_two`] reduces over.
pub const UNITS: usize = 64;

/// Halves `partial[0..64]` to `partial[0..2]`: after it, `combine(partial[0], partial[1])` is
/// the combination of all 64 (sums when `maximum` is false, maxima when true). Runs on all 64
/// units of the cube; `unit` is the caller's `UNIT_POS_X`.
#[cube]
pub fn halve_to_two(partial: &mut Shared<[f32]>, unit: usize, #[comptime] maximum: bool) {
    if unit < 32 {
        let pair = combine(partial[unit], partial[unit + 32], maximum);
        partial[unit] = pair;
    }
    sync_cube();
    if unit < 16 {
        let pair = combine(partial[unit], partial[unit + 16], maximum);
        partial[unit] = pair;
    }
    sync_cube();
    if unit < 8 {
        let pair = combine(partial[unit], partial[unit + 8], maximum);
        partial[unit] = pair;
    }
    sync_cube();
    if unit < 4 {
        let pair = combine(partial[unit], partial[unit + 4], maximum);
        partial[unit] = pair;
    }
    sync_cube();
    if unit < 2 {
        let pair = combine(partial[unit], partial[unit + 2], maximum);
        partial[unit] = pair;
    }
}

/// `a + b`, or `max(a, b)` when `maximum`: chosen when the kernel is expanded, not per unit.
#[cube]
pub fn combine(a: f32, b: f32, #[comptime] maximum: bool) -> f32 {
    if maximum { max(a, b) } else { a + b }
}
