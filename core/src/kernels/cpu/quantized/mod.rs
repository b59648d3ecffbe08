//! Products with weights kept in ggml's own blocks (Q4_0, Q4_1, Q8_0 and the K-quants Q4_K, Q5_K,
//! Q6_K), as llama.cpp runs inference: no f32 copy of a weight is ever made.
//!
//! A product `y = x · Wᵀ` quantizes the activations `x` to 8 bits per block of 32 (one f32
//! scale and the integer sum of each block, [`QuantizedActivations`]); each (weight block, activation
//! block) pair is then an integer dot product of 32 values, scaled once by `d_w · d_x`. The
//! block formats:
//! - Q4_0: f16 `d`, 16 bytes of nibbles `q`; `w = d·(q − 8)` → `d_w·d_x·(Σ q·x − 8·Σ x)`;
//! - Q4_1: f16 `d`, f16 `m`, 16 bytes of nibbles; `w = d·q + m` → `d_w·d_x·Σ q·x + m·d_x·Σ x`;
//! - Q8_0: f16 `d`, 32 × i8; `w = d·q` → `d_w·d_x·Σ q·x`;
//! - Q4_K, Q5_K: super-blocks of 256 = eight blocks of 32, each with its own 6-bit scale `sc`
//!   and min `m` under the super-block's f16 `d` and `dmin`; `w = d·sc·q − dmin·m` with 4-bit
//!   (5-bit) `q`: per block of 32 the Q4_1 product with `d_w = d·sc` and offset `−dmin·m`;
//! - Q6_K: super-blocks of 256 with an i8 scale per 16 values; `w = d·sc·(q − 32)` with 6-bit
//!   `q`: per block of 32 `d·d_x·Σ sc·(q − 32)·x`, the two scales inside the integer sum;
//! - NF4: a QLoRA base's 4-bit NormalFloat codes with each block's f32 absmax (`nf4.rs`); per
//!   block of 32 the integer sum of the codes' i16 values and the activations;
//! - F32: any other GGUF type, dequantized once at load (products in f32, no activation
//!   quantization).
//!
//! The nibbles of a 4-bit block hold elements 0..16 in their low halves and 16..32 in their high
//! halves. Quantizing the activations costs accuracy of the same order as the weights' own 8-bit
//! blocks (llama.cpp's `Q8_1`/`Q8_0` activations); the integer sums are exact.
//!
//! The kernels: `x86.rs` (AVX2, and AVX-512 VNNI's `vpdpbusd` where the CPU has it, picked at
//! run time) and `scalar.rs` (everywhere else, and the reference the SIMD kernels are tested
//! against). A product is split over the threads by rows of `W` (`team.rs`).
//!
//! # Shapes
//! - `W`: `[rows, cols]` (PyTorch's `[out, in]`), row-major, `cols` a multiple of 32 for the
//!   block formats (of 256 for the K-quants);
//! - `x`: `[T, cols]`; `y`: `[T, rows]`.

mod activations;
#[cfg(target_arch = "x86_64")]
mod activations_x86;
mod block_bytes;
mod nf4;
mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::sync::Arc;

use super::team;

pub use activations::{
    ActivationBits, HalfSums, Q8Block, Q16Block, QuantizedActivations, SplitBlock, TOKEN_GROUP,
    TokenGroups,
};
pub use block_bytes::{BlockBytes, SharedBuffer};

/// Values per block of every block format.
pub const BLOCK: usize = 32;

/// Values per super-block of the K-quants.
pub const SUPER_BLOCK: usize = 256;

/// How a [`QuantizedMatrix`] stores its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockFormat {
    /// 18 bytes per 32 values: f16 d, 16 bytes of nibbles; `w = d·(q − 8)`.
    Q4_0,
    /// 20 bytes per 32 values: f16 d, f16 m, 16 bytes of nibbles; `w = d·q + m`.
    Q4_1,
    /// 34 bytes per 32 values: f16 d, 32 × i8; `w = d·q`.
    Q8_0,
    /// 144 bytes per 256 values: f16 d, f16 dmin, 12 bytes of 6-bit (scale, min) pairs, 128
    /// bytes of nibbles; `w = d·sc·q − dmin·m` per block of 32.
    Q4K,
    /// 176 bytes per 256 values: as Q4_K with 32 bytes of fifth bits before the nibbles.
    Q5K,
    /// 210 bytes per 256 values: 128 bytes of low nibbles, 64 of high bit pairs, 16 i8 scales
    /// (one per 16 values), f16 d; `w = d·sc·(q − 32)`.
    Q6K,
    /// 36 bytes per 64 values: f32 absmax, then 16 bytes of nibbles for each 32 values;
    /// `w = NF4[q]·absmax` (a QLoRA base, `nf4.rs`).
    Nf4,
    /// Little-endian f32 values.
    F32,
}

impl BlockFormat {
    /// Every format with blocks (all but F32).
    pub const BLOCKED: [BlockFormat; 7] = [
        BlockFormat::Q4_0,
        BlockFormat::Q4_1,
        BlockFormat::Q8_0,
        BlockFormat::Q4K,
        BlockFormat::Q5K,
        BlockFormat::Q6K,
        BlockFormat::Nf4,
    ];

    /// Bytes of one row of `cols` values.
    pub const fn row_bytes(self, cols: usize) -> usize {
        match self {
            BlockFormat::Q4_0 => cols / BLOCK * 18,
            BlockFormat::Q4_1 => cols / BLOCK * 20,
            BlockFormat::Q8_0 => cols / BLOCK * 34,
            BlockFormat::Q4K => cols / SUPER_BLOCK * 144,
            BlockFormat::Q5K => cols / SUPER_BLOCK * 176,
            BlockFormat::Q6K => cols / SUPER_BLOCK * 210,
            BlockFormat::Nf4 => cols / nf4::UNIT * nf4::UNIT_BYTES,
            BlockFormat::F32 => cols * 4,
        }
    }

    /// Values per (super-)block: the unit a row is a whole number of.
    pub const fn values_per_block(self) -> usize {
        match self {
            BlockFormat::Q4K | BlockFormat::Q5K | BlockFormat::Q6K => SUPER_BLOCK,
            BlockFormat::Nf4 => nf4::UNIT,
            BlockFormat::F32 => 1,
            _ => BLOCK,
        }
    }

    /// Whether rows are blocks of 32 with 8-bit activations.
    pub const fn is_blocked(self) -> bool {
        !matches!(self, BlockFormat::F32)
    }
}

/// A `[rows, cols]` weight matrix in one block format.
///
/// Its rows may be stored in another order than the matrix's ([`with_rows_in_order`]): the
/// products read the stored rows and put each result in its row's place, so that no block is
/// moved (a GGUF's Q/K rows, read in place from the mapped file).
///
/// [`with_rows_in_order`]: QuantizedMatrix::with_rows_in_order
#[derive(Debug, Clone)]
pub struct QuantizedMatrix {
    format: BlockFormat,
    rows: usize,
    cols: usize,
    bytes: BlockBytes,
    /// Row `r` of the matrix is stored row `order[r]`; `None`: stored in order.
    order: Option<Arc<[usize]>>,
}

impl QuantizedMatrix {
    /// A matrix from its rows' bytes (as a GGUF stores them; owned, or a range of a shared
    /// buffer such as the mapped file); the message says what does not fit.
    pub fn new(
        format: BlockFormat,
        rows: usize,
        cols: usize,
        bytes: impl Into<BlockBytes>,
    ) -> Result<Self, String> {
        let bytes = bytes.into();
        let unit = format.values_per_block();
        if !cols.is_multiple_of(unit) {
            return Err(format!(
                "{format:?} rows need a multiple of {unit} columns, not {cols}"
            ));
        }
        let expected = rows * format.row_bytes(cols);
        if bytes.len() != expected {
            return Err(format!(
                "{} bytes for a [{rows}, {cols}] {format:?} matrix; expected {expected}",
                bytes.len()
            ));
        }
        Ok(QuantizedMatrix {
            format,
            rows,
            cols,
            bytes,
            order: None,
        })
    }

    /// An f32 matrix (row-major values), held in `values`' own memory: no copy is made.
    ///
    /// # Panics
    /// If `values.len() != rows · cols` (a bug in the caller).
    pub fn from_f32(rows: usize, cols: usize, values: Vec<f32>) -> Self {
        assert_eq!(values.len(), rows * cols, "[{rows}, {cols}] f32 matrix");
        QuantizedMatrix {
            format: BlockFormat::F32,
            rows,
            cols,
            bytes: values.into(),
            order: None,
        }
    }

    /// The storage format.
    pub fn format(&self) -> BlockFormat {
        self.format
    }

    /// Rows (output features).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns (input features).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes of the blocks (what streams from memory per product), whether owned or read in
    /// place from a shared buffer.
    pub fn resident_bytes(&self) -> usize {
        self.bytes.len()
    }

    /// Where row `r` of the matrix is stored.
    fn stored_row(&self, r: usize) -> usize {
        self.order.as_ref().map_or(r, |order| order[r])
    }

    /// Row `r`'s bytes.
    fn row(&self, r: usize) -> &[u8] {
        let n = self.format.row_bytes(self.cols);
        let stored = self.stored_row(r);
        &self.bytes.as_slice()[stored * n..(stored + 1) * n]
    }

    /// Row `r` as f32 values (an embedding lookup).
    ///
    /// # Panics
    /// If `r ≥ rows` or `out.len() != cols` (a bug in the caller).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert!(
            r < self.rows && out.len() == self.cols,
            "row {r} of {self:?}"
        );
        scalar::dequantize_row(self.format, self.row(r), out);
    }

    /// The rows in a new order: row `i` of the result is row `order[i]` of `self` (llama.cpp's
    /// Q/K permutation undone). No block moves: the result reads the same bytes and the products
    /// put each row's result in its new place.
    ///
    /// # Panics
    /// If `order` is not `rows` indices below `rows` (a bug in the caller).
    pub fn with_rows_in_order(&self, order: &[usize]) -> Self {
        assert_eq!(order.len(), self.rows, "a new order of every row");
        assert!(
            order.iter().all(|&r| r < self.rows),
            "rows below {}",
            self.rows
        );
        QuantizedMatrix {
            order: Some(order.iter().map(|&r| self.stored_row(r)).collect()),
            ..self.clone()
        }
    }

    /// The rows' blocks in stored order: what a product reads, first bytes first.
    pub fn stored_bytes(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    /// `y = x · Wᵀ` for the T rows of `x`, split over the compute threads by rows of `W`.
    ///
    /// # Shapes
    /// - `x`: `[T, cols]` → `out`: `[T, rows]`
    ///
    /// # Panics
    /// If the shapes disagree (a bug in the caller).
    pub fn matmul(&self, x: &QuantizedActivations, out: &mut [f32]) {
        products(&[self], x, &mut [out]);
    }

    /// `y_i = x · W_iᵀ` for several matrices that read the same input (Q, K and V; gate and
    /// up), in one pass over the threads: each part's `[T, rows_i]` output.
    ///
    /// # Panics
    /// If a part's columns differ from `x`'s (a bug in the caller).
    pub fn matmul_each(parts: &[&QuantizedMatrix], x: &QuantizedActivations) -> Vec<Vec<f32>> {
        let t = x.tokens();
        let mut outs: Vec<Vec<f32>> = parts.iter().map(|w| vec![0.0; t * w.rows]).collect();
        let mut targets: Vec<&mut [f32]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
        products(parts, x, &mut targets);
        outs
    }
}

/// The products of every part with `x`, their rows split into tasks that the compute threads
/// share (the calling thread's team, else rayon's).
/// A task writes its rows' results row-major (`[rows, T]`, stored order) into its part's scratch,
/// or straight into the output when that is already the output's layout (one token, rows in
/// order); the scratch is then put in `[T, rows]` order.
fn products(parts: &[&QuantizedMatrix], x: &QuantizedActivations, outs: &mut [&mut [f32]]) {
    let t = x.tokens();
    for (w, out) in parts.iter().zip(outs.iter()) {
        assert!(
            x.cols() == w.cols && out.len() == t * w.rows,
            "[{t}, {}] · [{}, {}]ᵀ into {} values",
            x.cols(),
            w.rows,
            w.cols,
            out.len()
        );
    }
    assert_eq!(parts.len(), outs.len(), "an output for every part");
    let total_rows: usize = parts.iter().map(|w| w.rows).sum();
    if t == 0 || total_rows == 0 {
        return;
    }
    let kernel = RowKernel::for_this_cpu();
    let rows_per_task = rows_per_task(total_rows, x.cols() * t);
    let direct = |w: &QuantizedMatrix| t == 1 && w.order.is_none();
    let mut scratch: Vec<Vec<f32>> = parts
        .iter()
        .map(|w| {
            if direct(w) {
                Vec::new()
            } else {
                vec![0.0f32; t * w.rows]
            }
        })
        .collect();
    let mut tasks: Vec<(BlockFormat, &[u8], &mut [f32])> = Vec::new();
    for ((w, out), scratch) in parts.iter().zip(outs.iter_mut()).zip(&mut scratch) {
        let target: &mut [f32] = if direct(w) { out } else { scratch };
        let row_bytes = w.format.row_bytes(w.cols);
        let bytes = w.bytes.as_slice();
        for (i, chunk) in target.chunks_mut(rows_per_task * t).enumerate() {
            let first = i * rows_per_task;
            let rows = &bytes[first * row_bytes..(first + chunk.len() / t) * row_bytes];
            tasks.push((w.format, rows, chunk));
        }
    }
    team::for_each_mut(&mut tasks, |(format, rows, chunk)| {
        kernel.rows(*format, rows, x, chunk)
    });
    for ((w, out), by_row) in parts.iter().zip(outs.iter_mut()).zip(&scratch) {
        if direct(w) {
            continue;
        }
        // [stored rows, T] → [T, rows], one token's row a task.
        let mut tokens: Vec<(usize, &mut [f32])> = out.chunks_mut(w.rows).enumerate().collect();
        team::for_each_mut(&mut tokens, |(token, out)| {
            for (r, o) in out.iter_mut().enumerate() {
                *o = by_row[w.stored_row(r) * t + *token];
            }
        });
    }
}

/// Rows per task: about 16 tasks a thread for balance, at least enough work that
/// scheduling (a few µs) is noise.
fn rows_per_task(rows: usize, work_per_row: usize) -> usize {
    const MIN_WORK: usize = 64 * 1024;
    let by_balance = rows.div_ceil(16 * rayon::current_num_threads());
    let by_work = MIN_WORK.div_ceil(work_per_row.max(1));
    by_balance.max(by_work).clamp(1, rows)
}

/// The row kernel this CPU runs (picked once per product).
#[derive(Debug, Clone, Copy)]
enum RowKernel {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Vnni,
}

impl RowKernel {
    fn for_this_cpu() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if x86::has_vnni() {
                return RowKernel::Vnni;
            }
            if x86::has_avx2() {
                return RowKernel::Avx2;
            }
        }
        RowKernel::Scalar
    }

    /// A run of rows of `W` times every token of `x`: `out[r·T + t] = W[r] · x[t]`.
    fn rows(self, format: BlockFormat, rows: &[u8], x: &QuantizedActivations, out: &mut [f32]) {
        if format == BlockFormat::Nf4 {
            return nf4::rows(self, rows, x, out);
        }
        match self {
            RowKernel::Scalar => scalar::rows(format, rows, x, out),
            // SAFETY: the CPU has the features the variant names (checked in `for_this_cpu`).
            #[cfg(target_arch = "x86_64")]
            RowKernel::Avx2 => unsafe { x86::avx2::rows(format, rows, x, out) },
            #[cfg(target_arch = "x86_64")]
            RowKernel::Vnni => unsafe { x86::vnni::rows(format, rows, x, out) },
        }
    }
}

#[cfg(test)]
mod tests;
