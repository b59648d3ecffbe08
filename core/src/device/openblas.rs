//! OpenBLAS held to the thread that calls it (builds with the `openblas` feature).
//!
//! Left alone, OpenBLAS runs each GEMM on its own worker threads, which compete with rayon's
//! pool; napkin splits its GEMMs over rayon's threads instead (`kernels/cpu/gemm.rs`).

use std::sync::Once;

unsafe extern "C" {
    /// OpenBLAS's thread-count setter (libopenblas, linked by burn's `openblas-system`).
    fn openblas_set_num_threads(num_threads: std::ffi::c_int);
}

/// Holds OpenBLAS to the thread that calls it, once per process. Called where every NdArray
/// device is opened, so no OpenBLAS worker pool competes with rayon's.
pub fn use_one_thread_pool() {
    static ONCE: Once = Once::new();
    // SAFETY: the setter takes a plain integer and only changes OpenBLAS's own thread count.
    ONCE.call_once(|| unsafe { openblas_set_num_threads(1) });
}
