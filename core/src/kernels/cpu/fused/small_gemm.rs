//! Single-threaded matrix products on host slices, for kernels that parallelize over many small
//! blocks themselves (the tiled attention: one `[128, 64] · [64, 128]` product per head and
//! tile). The caller's threads each run their own products, so the BLAS must not spawn any:
//! OpenBLAS is held to one thread (`device::openblas::use_one_thread_pool`); the `gemm` crate is asked
//! for none.
//!
//! With OpenBLAS compiled in the products are `cblas_sgemm`; otherwise the `gemm` crate's
//! (the kernels burn Flex uses, also in the browser). [`gemm_on_rayon`] is the one product
//! here that does use the threads: a whole step's large product (`x_wt`).

/// One operand: `values` row-major with `ld` values per row, read as stored or transposed.
#[derive(Clone, Copy)]
pub(crate) struct Operand<'a> {
    values: &'a [f32],
    ld: usize,
    transposed: bool,
}

impl<'a> Operand<'a> {
    /// The matrix as stored: element `(i, j)` is `values[i·ld + j]`.
    pub(crate) fn plain(values: &'a [f32], ld: usize) -> Self {
        Self {
            values,
            ld,
            transposed: false,
        }
    }

    /// The stored matrix transposed: element `(i, j)` is `values[j·ld + i]`.
    pub(crate) fn transposed(values: &'a [f32], ld: usize) -> Self {
        Self {
            values,
            ld,
            transposed: true,
        }
    }

    /// The matrix from row `first` on (of the matrix as read, not as stored).
    fn rows_from(self, first: usize) -> Self {
        let offset = if self.transposed {
            first
        } else {
            first * self.ld
        };
        Self {
            values: &self.values[offset.min(self.values.len())..],
            ..self
        }
    }

    /// Checks that the `rows × cols` matrix this operand reads lies inside its slice.
    fn check(&self, rows: usize, cols: usize) {
        let (stored_rows, stored_cols) = if self.transposed {
            (cols, rows)
        } else {
            (rows, cols)
        };
        assert!(stored_cols <= self.ld, "a row is longer than its stride");
        assert!(
            stored_rows == 0 || (stored_rows - 1) * self.ld + stored_cols <= self.values.len(),
            "the operand's slice is too short"
        );
    }
}

/// `c ← a·b`, or `c ← c + a·b` when `accumulate`; `a` is `m × k`, `b` is `k × n`, `c` is
/// `m × n` row-major (`n` values per row).
///
/// # Panics
/// When a slice is too short for its shape.
pub(crate) fn gemm(
    (m, n, k): (usize, usize, usize),
    a: Operand<'_>,
    b: Operand<'_>,
    c: &mut [f32],
    accumulate: bool,
) {
    a.check(m, k);
    b.check(k, n);
    assert!(c.len() >= m * n, "the output slice is too short");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            c[..m * n].fill(0.0);
        }
        return;
    }
    product(Product {
        m,
        n,
        k,
        a,
        b,
        c,
        accumulate,
    });
}

/// One checked product, handed to the compiled-in implementation.
struct Product<'a, 'c> {
    m: usize,
    n: usize,
    k: usize,
    a: Operand<'a>,
    b: Operand<'a>,
    c: &'c mut [f32],
    accumulate: bool,
}

#[cfg(feature = "openblas")]
fn product(
    Product {
        m,
        n,
        k,
        a,
        b,
        c,
        accumulate,
    }: Product<'_, '_>,
) {
    use std::ffi::c_int;
    unsafe extern "C" {
        /// CBLAS: `C ← α·op(A)·op(B) + β·C`.
        fn cblas_sgemm(
            order: c_int,
            trans_a: c_int,
            trans_b: c_int,
            m: c_int,
            n: c_int,
            k: c_int,
            alpha: f32,
            a: *const f32,
            lda: c_int,
            b: *const f32,
            ldb: c_int,
            beta: f32,
            c: *mut f32,
            ldc: c_int,
        );
    }
    const ROW_MAJOR: c_int = 101;
    const NO_TRANS: c_int = 111;
    const TRANS: c_int = 112;
    let trans = |op: &Operand<'_>| if op.transposed { TRANS } else { NO_TRANS };
    let dim = |x: usize| c_int::try_from(x).expect("a block dimension fits in a C int");
    // Opening an NdArray device did this already; a Flex device in the same build did not.
    crate::device::openblas::use_one_thread_pool();
    // SAFETY: `gemm` checked that every element the product reads or writes lies inside its
    // slice; with β = 0, C is only written.
    unsafe {
        cblas_sgemm(
            ROW_MAJOR,
            trans(&a),
            trans(&b),
            dim(m),
            dim(n),
            dim(k),
            1.0,
            a.values.as_ptr(),
            dim(a.ld),
            b.values.as_ptr(),
            dim(b.ld),
            if accumulate { 1.0 } else { 0.0 },
            c.as_mut_ptr(),
            dim(n),
        );
    }
}

#[cfg(not(feature = "openblas"))]
fn product(p: Product<'_, '_>) {
    gemm_crate(p, gemm::Parallelism::None);
}

/// The `gemm` crate's product on `parallelism` (callers have checked the slices: `gemm` here,
/// `x_wt` for its products on rayon's threads).
#[cfg(feature = "flex")]
fn gemm_crate(
    Product {
        m,
        n,
        k,
        a,
        b,
        c,
        accumulate,
    }: Product<'_, '_>,
    parallelism: gemm::Parallelism,
) {
    // (row stride, column stride) of an operand, in elements.
    let strides = |op: &Operand<'_>| {
        let ld = op.ld as isize;
        if op.transposed { (1, ld) } else { (ld, 1) }
    };
    let (a_rs, a_cs) = strides(&a);
    let (b_rs, b_cs) = strides(&b);
    // SAFETY: the callers checked that every element the product reads or writes lies inside
    // its slice; with `read_dst` false, C is only written. The crate computes
    // `dst ← α·dst + β·lhs·rhs`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.values.as_ptr(),
            a_cs,
            a_rs,
            b.values.as_ptr(),
            b_cs,
            b_rs,
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// `a · b` (`m × k` by `k × n`) into a new row-major vector with the `gemm` crate on rayon's
/// threads: the large products of one step (`x_wt`), not the per-tile ones of [`gemm`].
///
/// # Panics
/// When a slice is too short for its shape.
#[cfg(feature = "flex")]
pub(crate) fn gemm_on_rayon(
    (m, n, k): (usize, usize, usize),
    a: Operand<'_>,
    b: Operand<'_>,
) -> Vec<f32> {
    gemm_on_rayon_in_row_blocks((m, n, k), a, b, m)
}

/// [`gemm_on_rayon`] over blocks of at most `rows` rows of `a` (and of the output), one product
/// per block. On rayon's threads the `gemm` crate packs a whole operand of the product it runs
/// (the one it reads along the output's rows, `k × m` values once it has transposed the
/// problem to suit a row-major output): for a weight gradient `∂yᵀ · x` (`m` the layer's
/// outputs, `k` the tokens) that is all of `∂y` again (measured on SmolLM2's head at T = 128:
/// 24 MiB beside a 108 MiB gradient); in blocks it packs one block at a time.
///
/// # Panics
/// When a slice is too short for its shape.
#[cfg(feature = "flex")]
pub(crate) fn gemm_on_rayon_in_row_blocks(
    (m, n, k): (usize, usize, usize),
    a: Operand<'_>,
    b: Operand<'_>,
    rows: usize,
) -> Vec<f32> {
    a.check(m, k);
    b.check(k, n);
    let mut c = vec![0.0f32; m * n];
    if m == 0 || n == 0 || k == 0 {
        return c;
    }
    let rows = rows.clamp(1, m);
    // Rayon even on one thread (the page): with `None` the crate blocks the product's columns
    // in panels of 128 micro-tiles, which ran SmolLM2's 256 × 576 × 1536 at 12.9 GFLOP/s in
    // Chromium against 29.8 for burn Flex's own call (`Rayon(0)`, one panel; page GEMM bench).
    let parallelism = gemm::Parallelism::Rayon(rayon::current_num_threads());
    for (block, c) in c.chunks_mut(rows * n).enumerate() {
        gemm_crate(
            Product {
                m: c.len() / n,
                n,
                k,
                a: a.rows_from(block * rows),
                b,
                c,
                accumulate: false,
            },
            parallelism,
        );
    }
    c
}

#[cfg(test)]
mod tests {
    use super::{Operand, gemm};

    /// `len` values in [−1, 1) that differ with `seed`.
    fn filled(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| (((i * 7919 + seed * 104_729) % 1000) as f32 / 500.0) - 1.0)
            .collect()
    }

    /// Every operand orientation, both with and without accumulation, against an f64 loop.
    #[test]
    fn products_match_the_triple_loop() {
        let (m, n, k) = (37, 29, 45);
        // Stored with one extra column (ld > cols) to exercise the stride.
        let a_plain = filled(m * (k + 1), 1); // m × k, ld k+1
        let a_trans = filled(k * (m + 1), 2); // stored k × m, ld m+1
        let b_plain = filled(k * (n + 1), 3); // k × n, ld n+1
        let b_trans = filled(n * (k + 1), 4); // stored n × k, ld k+1
        let a_ops = [
            (Operand::plain(&a_plain, k + 1), false),
            (Operand::transposed(&a_trans, m + 1), true),
        ];
        let b_ops = [
            (Operand::plain(&b_plain, n + 1), false),
            (Operand::transposed(&b_trans, k + 1), true),
        ];
        let a_at = |t: bool, i: usize, p: usize| {
            f64::from(if t {
                a_trans[p * (m + 1) + i]
            } else {
                a_plain[i * (k + 1) + p]
            })
        };
        let b_at = |t: bool, p: usize, j: usize| {
            f64::from(if t {
                b_trans[j * (k + 1) + p]
            } else {
                b_plain[p * (n + 1) + j]
            })
        };
        for &(a, at) in &a_ops {
            for &(b, bt) in &b_ops {
                for accumulate in [false, true] {
                    let start = filled(m * n, 5);
                    let mut c = start.clone();
                    gemm((m, n, k), a, b, &mut c, accumulate);
                    for i in 0..m {
                        for j in 0..n {
                            let dot: f64 = (0..k).map(|p| a_at(at, i, p) * b_at(bt, p, j)).sum();
                            let want = dot
                                + if accumulate {
                                    f64::from(start[i * n + j])
                                } else {
                                    0.0
                                };
                            let got = f64::from(c[i * n + j]);
                            assert!(
                                (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                                "a transposed {at}, b transposed {bt}, accumulate {accumulate}: \
                                 ({i}, {j}) {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The product in row blocks equals the product in one call, for both orientations of
    /// `a`, blocks that do and do not divide `m`, and a block taller than `m`.
    #[cfg(feature = "flex")]
    #[test]
    fn row_blocks_equal_one_product() {
        use super::{gemm_on_rayon, gemm_on_rayon_in_row_blocks};
        let (m, n, k) = (37, 29, 45);
        let a_plain = filled(m * (k + 1), 1);
        let a_trans = filled(k * (m + 1), 2);
        let b = filled(k * n, 3);
        for a in [
            Operand::plain(&a_plain, k + 1),
            Operand::transposed(&a_trans, m + 1),
        ] {
            let whole = gemm_on_rayon((m, n, k), a, Operand::plain(&b, n));
            for rows in [1, 5, 37, 64] {
                let blocks = gemm_on_rayon_in_row_blocks((m, n, k), a, Operand::plain(&b, n), rows);
                assert_eq!(blocks.len(), whole.len());
                for (i, (x, y)) in blocks.iter().zip(&whole).enumerate() {
                    assert!(
                        (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
                        "rows {rows}, {i}: {x} vs {y}"
                    );
                }
            }
        }
    }
}
