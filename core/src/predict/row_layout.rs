//! How a backend lays a tensor's rows out in device memory: packed end to end, or "pitched",
//! each row padded so that the next one starts aligned.
//!
//! burn's CUDA backend (cubecl-cuda 0.11, `PitchedMemoryLayoutPolicy`) pitches every tensor it
//! makes, uploads and kernel outputs alike: a row of `w` values of `e` bytes takes
//! `⌈w·e / a⌉·a` bytes, where the row alignment `a` is `w·e` rounded up to a power of two and
//! clamped to `[16, 512]` (`e` itself when `w = 1`), and each allocation is rounded up to 512 B
//! (CUDA's `cuMemAllocPitch` alignment). A 576-wide f32 row (SmolLM2) takes 2,560 B for its
//! 2,304: weights and activations of that width cost 11 % more on CUDA than on wgpu, Metal or
//! the CPU, whose layouts are contiguous. Widths whose bytes are a multiple of 512 (TinyLlama's
//! 2,048, any power of two from 128 f32 values up) cost nothing more.

use std::str::FromStr;

use serde::Serialize;

use crate::error::{Error, Result};

/// A tensor's size as its layout sees it: its values and the values in one row (its last
/// dimension; a one-dimensional tensor is one row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    /// Values in the tensor.
    pub values: u64,
    /// Values in one row: the last dimension.
    pub row: u64,
}

impl Size {
    /// `count` rows of `width` values.
    pub fn rows(count: u64, width: u64) -> Size {
        Size {
            values: count * width,
            row: width,
        }
    }

    /// A one-dimensional tensor of `values`.
    pub fn flat(values: u64) -> Size {
        Size {
            values,
            row: values,
        }
    }
}

/// The row layout of a device's allocations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RowLayout {
    /// Rows end to end: a tensor takes its values' bytes (the CPU backends, wgpu, Metal).
    #[default]
    Contiguous,
    /// Rows padded to an alignment of up to `alignment` bytes, allocations rounded up to it.
    Pitched {
        /// The largest row alignment and the allocation alignment, in bytes.
        alignment: u64,
    },
}

impl RowLayout {
    /// burn's CUDA backend: rows and allocations aligned to 512 bytes.
    pub const CUDA: RowLayout = RowLayout::Pitched { alignment: 512 };

    /// Device bytes of a tensor of `size` with `bytes_per_value` bytes a value.
    pub fn bytes(self, size: Size, bytes_per_value: u64) -> u64 {
        match self {
            RowLayout::Contiguous => size.values * bytes_per_value,
            RowLayout::Pitched { alignment } => {
                if size.values == 0 {
                    return 0;
                }
                let width = size.row.max(1);
                let rows = size.values.div_ceil(width);
                (rows * self.pitch(width, bytes_per_value)).next_multiple_of(alignment)
            }
        }
    }

    /// Bytes from one row's start to the next's for rows of `width` values.
    pub fn pitch(self, width: u64, bytes_per_value: u64) -> u64 {
        let row_bytes = width * bytes_per_value;
        match self {
            RowLayout::Contiguous => row_bytes,
            RowLayout::Pitched { alignment } => {
                let row_alignment = if width <= 1 {
                    bytes_per_value
                } else {
                    row_bytes.next_power_of_two().clamp(16, alignment)
                };
                row_bytes.next_multiple_of(row_alignment.max(1))
            }
        }
    }

    /// Whether rows of `width` values are padded: then a tensor of them is not contiguous, and
    /// merging its dimensions copies it.
    pub fn pads(self, width: u64, bytes_per_value: u64) -> bool {
        self.pitch(width, bytes_per_value) != width * bytes_per_value
    }
}

impl FromStr for RowLayout {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "contiguous" | "cpu" | "wgpu" | "metal" => Ok(RowLayout::Contiguous),
            "cuda" | "pitched" => Ok(RowLayout::CUDA),
            _ => Err(Error::Input(format!(
                "unknown row layout `{s}`: expected contiguous or cuda"
            ))),
        }
    }
}

/// `--rows`: the two layouts a device has, by the names `FromStr` reads.
#[cfg(feature = "clap")]
impl clap::ValueEnum for RowLayout {
    fn value_variants<'a>() -> &'a [Self] {
        &[RowLayout::Contiguous, RowLayout::CUDA]
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        use clap::builder::PossibleValue;
        Some(match self {
            RowLayout::Contiguous => PossibleValue::new("contiguous")
                .aliases(["cpu", "wgpu", "metal"])
                .help("rows end to end (the CPU backends, wgpu, Metal)"),
            RowLayout::Pitched { .. } => PossibleValue::new("cuda")
                .alias("pitched")
                .help("burn's CUDA backend: each row padded to an aligned pitch"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The widths of the course's models, as cubecl's rule lays them out on CUDA.
    #[test]
    fn cuda_pads_rows_to_the_next_aligned_pitch() {
        let cuda = RowLayout::CUDA;
        // SmolLM2's hidden size: 2,304 B rows → 2,560 B.
        assert_eq!(cuda.bytes(Size::rows(1000, 576), 4), 1000 * 2560);
        // Its key/value width, 192 f32 = 768 B → aligned to 512 → 1,024 B.
        assert_eq!(cuda.bytes(Size::rows(512, 192), 4), 512 * 1024);
        // 1,536 f32 = 6,144 B, a multiple of 512: no padding.
        assert_eq!(cuda.bytes(Size::rows(512, 1536), 4), 512 * 6144);
        // A 64-value head row (256 B) is aligned to 256: no padding.
        assert_eq!(cuda.bytes(Size::rows(9 * 512, 64), 4), 9 * 512 * 256);
        // 100 f32 (400 B) round up to 512 B.
        assert_eq!(cuda.bytes(Size::rows(100, 100), 4), 100 * 512);
        // 576 bf16 values = 1,152 B → 1,536 B.
        assert_eq!(cuda.bytes(Size::rows(10, 576), 2), 10 * 1536);
        // A column of one value a row is not padded, only the allocation is rounded.
        assert_eq!(cuda.bytes(Size::rows(1000, 1), 4), 4096);
        // A small row aligns to 16 B at least: 3 f32 = 12 B → 16 B.
        assert_eq!(cuda.bytes(Size::rows(128, 3), 4), 128 * 16);
        assert_eq!(cuda.bytes(Size::flat(0), 4), 0);
    }

    #[test]
    fn only_padded_rows_break_contiguity() {
        assert!(RowLayout::CUDA.pads(576, 4));
        assert!(RowLayout::CUDA.pads(192, 4));
        assert!(!RowLayout::CUDA.pads(2048, 4));
        assert!(!RowLayout::CUDA.pads(1536, 4));
        assert!(!RowLayout::CUDA.pads(64, 4));
        assert!(!RowLayout::CUDA.pads(1, 4));
        assert!(!RowLayout::Contiguous.pads(576, 4));
    }

    #[test]
    fn layouts_are_named_as_the_cli_takes_them() {
        assert_eq!("cuda".parse::<RowLayout>().unwrap(), RowLayout::CUDA);
        assert_eq!(
            "Contiguous".parse::<RowLayout>().unwrap(),
            RowLayout::Contiguous
        );
        let err = "diagonal".parse::<RowLayout>().unwrap_err().to_string();
        assert!(err.contains("contiguous or cuda"), "{err}");
    }

    #[test]
    fn contiguous_rows_cost_their_values() {
        let c = RowLayout::Contiguous;
        assert_eq!(c.bytes(Size::rows(1000, 576), 4), 1000 * 576 * 4);
        assert_eq!(c.bytes(Size::rows(7, 3), 2), 42);
    }
}
