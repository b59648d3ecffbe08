//! Which implementation runs the element-wise layers (RMSNorm, SwiGLU, the loss): it decides
//! what they keep for the backward, so the predictor must know it.

use super::spellings;

/// The element-wise layers' implementation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Kernels {
    /// napkin's fused kernels (`kernels/cpu/fused/`, f32 on Flex or NdArray): one op each, keeping
    /// its inputs and one statistic per row.
    #[default]
    FusedCpu,
    /// napkin's cubecl kernels for RMSNorm, RoPE, SwiGLU and the loss (`kernels/gpu/fused/`,
    /// f32 on wgpu, WebGPU, CUDA), keeping what the fused CPU ones keep, for the eager
    /// attention's softmax (keeping the probabilities only) and for a LoRA linear's scaled sum;
    /// the products and the efficient attention's tiles as burn's ops, as [`Kernels::BurnOps`]
    /// runs them.
    FusedGpu,
    /// burn's ops, one per step of the formula (a GPU backend in 16-bit, or a prediction of
    /// how burn alone would run): each keeps what its own backward reads — RMSNorm three
    /// per-row statistics and, when its gain trains, `x·r`; SwiGLU `σ(g)` and `silu(g)` besides
    /// `g` and `u`; the loss the shifted logits.
    BurnOps,
}

impl Kernels {
    /// Whether burn's autodiff graph (its nodes and boxed backward steps, host objects) is in
    /// the memory the tensors use: on the CPU backends, where the fused kernels run, it is; on
    /// a GPU backend it is host memory beside the device's (lavapipe: each block's measured
    /// device bytes equal the burn-ops prediction without the graph, to the byte).
    pub fn graph_beside_tensors(self) -> bool {
        self == Kernels::FusedCpu
    }

    /// Whether RMSNorm and SwiGLU are one fused op each (keeping their inputs and, for the
    /// norm, one `1/rms` per row), on the CPU or on a GPU.
    pub fn fuses_norm_and_gating(self) -> bool {
        matches!(self, Kernels::FusedCpu | Kernels::FusedGpu)
    }

    /// Whether RoPE is one fused op on the projection that keeps nothing, on the CPU or on a
    /// GPU.
    pub fn fuses_rope(self) -> bool {
        matches!(self, Kernels::FusedCpu | Kernels::FusedGpu)
    }

    /// Whether the eager attention's scale, mask and softmax are one op keeping its output
    /// only (napkin's GPU kernel; the CPU runs burn's ops there).
    pub fn fuses_softmax(self) -> bool {
        self == Kernels::FusedGpu
    }

    /// Whether the loss is one fused op keeping the logits, one log-sum-exp a row and the
    /// labels, on the CPU or on a GPU.
    pub fn fuses_loss(self) -> bool {
        matches!(self, Kernels::FusedCpu | Kernels::FusedGpu)
    }

    /// Whether the efficient attention runs on host values (napkin's fused CPU op; else its
    /// tiles are burn's ops).
    pub fn fuses_efficient_attention(self) -> bool {
        self == Kernels::FusedCpu
    }

    /// Whether the layers run on a GPU backend (cubecl): its NF4 dequantization writes the
    /// 16-bit compute dtype.
    pub fn on_gpu(self) -> bool {
        self != Kernels::FusedCpu
    }
}

impl Kernels {
    /// What runs the element-wise layers, in words.
    pub fn describe(self) -> &'static str {
        match self {
            Kernels::FusedCpu => "napkin's fused CPU kernels",
            Kernels::FusedGpu => {
                "napkin's fused GPU kernels (RMSNorm, RoPE, SwiGLU, softmax, loss, LoRA sum) and \
                 burn's ops"
            }
            Kernels::BurnOps => "burn's ops",
        }
    }
}

spellings! {
    Kernels, "kernels", "kernels", serde;
    FusedCpu => "fused-cpu" ["fused", "cpu"]: "napkin's CPU kernels",
    FusedGpu => "fused-gpu" ["gpu"]: "the GPU backends in f32: napkin's RMSNorm, RoPE, SwiGLU, softmax and loss kernels, burn's ops for the rest",
    BurnOps => "burn-ops" ["burn"]: "burn's ops alone, which keep more for the backward",
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_bad_names_are_refused() {
        assert_eq!("fused-cpu".parse::<Kernels>().unwrap(), Kernels::FusedCpu);
        assert_eq!("fused-gpu".parse::<Kernels>().unwrap(), Kernels::FusedGpu);
        assert_eq!("burn-ops".parse::<Kernels>().unwrap(), Kernels::BurnOps);
        let err = "cuda".parse::<Kernels>().unwrap_err().to_string();
        assert!(
            err.contains("expected fused-cpu, fused-gpu or burn-ops"),
            "{err}"
        );
    }
}
