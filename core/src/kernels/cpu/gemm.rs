//! f32 GEMM on the CPU with one thread pool: OpenBLAS runs single-threaded inside rayon tasks,
//! each task computing one block of the output.
//!
//! Left alone, OpenBLAS runs each GEMM on its own worker threads, which spin in `sched_yield`
//! after every call, while burn NdArray runs its element-wise ops and batched matmuls on rayon's
//! pool (its batched matmul calls BLAS from rayon tasks, nesting one pool inside the other).
//! With OpenBLAS held to the calling thread, every multiply-add and every element-wise op runs
//! on rayon's threads (`RAYON_NUM_THREADS`), and the CLI runs its commands on that pool
//! (`device::on_compute_threads`), so the thread that issues a GEMM computes one of its blocks.
//! Measured on two cores, old and new binaries interleaved (docs/performance.md, run 4):
//! SmolLM2 full and LoRA training steps 13–23 % faster; QLoRA and the forward within noise.

use ndarray::linalg::{general_mat_mul, general_mat_vec_mul};
use ndarray::{Array2, ArrayView2, ArrayViewMut2, Axis};

/// Below this many multiply-adds a GEMM runs on one thread: a rayon hand-off costs a few
/// microseconds, about what one core needs for 2²² multiply-adds.
const MIN_SPLIT_MACS: usize = 1 << 22;

/// Output blocks are cut at multiples of this many rows or columns (BLAS micro-kernel width).
const BLOCK_ALIGN: usize = 16;

/// A zeroed `[rows, cols]` output for [`gemm_add`], its zeros written rather than left to the
/// allocator.
///
/// `Array2::zeros` allocates with `calloc`, which skips the zeroing when its memory is fresh
/// from the kernel. Such a page is then first *read* by the GEMM (β = 1 adds into `c`), which
/// maps the shared zero page, and then written, which copies it and, with the process's other
/// compute thread running on another CPU, flushes that CPU's TLB by an inter-processor
/// interrupt. `perf` of a SmolLM2 full fine-tuning run: ~12 % of all samples in that fault path
/// (`do_wp_page` → `ptep_clear_flush` → `x2apic_send_IPI`) inside `sgemm_kernel`. Writing the
/// zeros first takes each fresh page with one plain fault; on reused memory it is the same
/// `memset` `calloc` does.
pub fn zeroed_output(rows: usize, cols: usize) -> Array2<f32> {
    let len = rows * cols;
    // Opaque to the optimiser, so that it cannot fold the allocation and the zeros into a
    // `calloc` again.
    let mut values = std::hint::black_box(Vec::with_capacity(len));
    values.resize(len, 0.0f32);
    Array2::from_shape_vec((rows, cols), values).expect("rows × cols values")
}

/// `c += a · b` for `a: [M, K]`, `b: [K, N]`, `c: [M, N]` (any strides BLAS accepts), split into
/// as many output blocks as rayon has threads.
///
/// For the plain product pass a zeroed `c` (a fresh `Array2::zeros`): with β = 1 BLAS adds
/// into it as it is, while with β = 0 it would first write zeros over the whole of `c` again
/// (`sgemm_beta`: 4.4 % of a small model's LoRA step, profiled).
pub fn gemm_add(a: ArrayView2<'_, f32>, b: ArrayView2<'_, f32>, c: ArrayViewMut2<'_, f32>) {
    split(a, b, c, rayon::current_num_threads());
}

/// Cuts the larger output dimension in two, each half getting its share of `parts`, until one
/// part is left or the block is too small to be worth a thread: rows of `a` and `c`, or
/// columns of `b` and `c`, at multiples of [`BLOCK_ALIGN`].
fn split(a: ArrayView2<'_, f32>, b: ArrayView2<'_, f32>, c: ArrayViewMut2<'_, f32>, parts: usize) {
    let (m, n) = c.dim();
    let by_rows = m >= n;
    let len = if by_rows { m } else { n };
    if parts <= 1 || m * n * a.ncols() < MIN_SPLIT_MACS || len < 2 * BLOCK_ALIGN {
        return on_this_thread(a, b, c);
    }
    let left = parts / 2;
    let at = (len * left / parts).div_ceil(BLOCK_ALIGN) * BLOCK_ALIGN;
    if by_rows {
        let (a0, a1) = a.split_at(Axis(0), at);
        let (c0, c1) = c.split_at(Axis(0), at);
        rayon::join(|| split(a0, b, c0, left), || split(a1, b, c1, parts - left));
    } else {
        let (b0, b1) = b.split_at(Axis(1), at);
        let (c0, c1) = c.split_at(Axis(1), at);
        rayon::join(|| split(a, b0, c0, left), || split(a, b1, c1, parts - left));
    }
}

/// One BLAS call on the calling thread: `c += a · b`.
fn on_this_thread(a: ArrayView2<'_, f32>, b: ArrayView2<'_, f32>, mut c: ArrayViewMut2<'_, f32>) {
    if a.nrows() == 1 {
        // One row (a generated token): BLAS's matrix-vector product streams the matrix once;
        // its GEMM would first pack all of it into panels.
        let mut row = c.row_mut(0);
        general_mat_vec_mul(1.0, &b.t(), &a.row(0), 1.0, &mut row);
    } else {
        general_mat_mul(1.0, &a, &b, 1.0, &mut c);
    }
}

#[cfg(test)]
mod tests {
    use ndarray::Array2;

    use super::gemm_add;

    fn reference(a: &Array2<f32>, b: &Array2<f32>) -> Array2<f32> {
        let (m, k, n) = (a.nrows(), a.ncols(), b.ncols());
        Array2::from_shape_fn((m, n), |(i, j)| {
            (0..k)
                .map(|p| f64::from(a[[i, p]]) * f64::from(b[[p, j]]))
                .sum::<f64>() as f32
        })
    }

    fn filled(rows: usize, cols: usize, seed: usize) -> Array2<f32> {
        Array2::from_shape_fn((rows, cols), |(i, j)| {
            (((i * 31 + j * 17 + seed * 7) % 23) as f32 - 11.0) / 11.0
        })
    }

    /// Split along rows (tall output), columns (wide output), the one-row path, a transposed
    /// operand, and a GEMM too small to split, added to a non-zero `c`, against a plain triple
    /// loop in f64.
    #[test]
    fn every_split_matches_the_triple_loop() {
        for (m, k, n, transposed_b) in [
            (300, 200, 70, false),
            (40, 150, 900, false),
            (1, 700, 9000, true),
            (257, 96, 129, true),
            (3, 5, 4, false),
        ] {
            let a = filled(m, k, 1);
            let b_stored = if transposed_b {
                filled(n, k, 2)
            } else {
                filled(k, n, 2)
            };
            let b = if transposed_b {
                b_stored.t()
            } else {
                b_stored.view()
            };
            let c0 = filled(m, n, 3);
            let mut c = c0.clone();
            gemm_add(a.view(), b, c.view_mut());
            let expected = reference(&a, &b.to_owned()) + &c0;
            let err = (&c - &expected).iter().fold(0.0f32, |e, d| e.max(d.abs()));
            assert!(err < 1e-3, "{m}×{k}×{n}: max |diff| {err}");
        }
    }
}
