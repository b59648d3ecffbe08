//! The page's GEMM benchmark: burn Flex's f32 products at napkin-core's
//! [`PAGE_GEMM_SHAPES`](napkin_core::measure::PAGE_GEMM_SHAPES), timed in this tab, for
//! `scripts/bench/page.sh` to put beside the same code built natively on one thread
//! (`napkin bench matmul --page-shapes`).

use wasm_bindgen::prelude::*;

/// Median GFLOP/s of both products at every page shape over `runs` timed runs each, as JSON:
/// `[{"product", "m", "k", "n", "gflops"}, …]` (napkin-core's `GemmFigure`).
#[wasm_bindgen]
pub fn page_gemm_gflops(runs: usize) -> String {
    let figures = napkin_core::measure::page_gemm_figures(&napkin_core::device::cpu(), runs);
    serde_json::to_string(&figures).unwrap_or_else(|e| format!(r#"{{"error":"{e}"}}"#))
}
