//! DeepSpeed's estimates of ZeRO model-state memory (parameters, gradients, optimizer state;
//! no activations), per GPU and per node's CPU, as `estimate_zero2_model_states_mem_needs` and
//! `estimate_zero3_model_states_mem_needs` compute them: mixed-precision Adam, 2 bytes a
//! parameter for fp16 weights and 16 for the rest (fp16 gradients 2, fp32 master 4, two
//! moments 8, + 2 for the fp32 gradient accumulation), CPU figures with a 1.5× buffer factor.

use serde::Serialize;

/// Bytes per GPU and per node's CPU memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ZeroEstimate {
    /// Bytes on each GPU.
    pub gpu_bytes: u64,
    /// Bytes of CPU memory on each node.
    pub cpu_bytes: u64,
}

/// Where a run is spread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cluster {
    /// GPUs on each node.
    pub gpus_per_node: u64,
    /// Nodes.
    pub nodes: u64,
}

const BUFFER_FACTOR: f64 = 1.5;

/// ZeRO-2 (optimizer state and gradients sharded), optionally with the optimizer offloaded to
/// the CPU.
pub fn zero2(total_params: u64, cluster: Cluster, cpu_offload: bool) -> ZeroEstimate {
    let gpus = cluster.gpus_per_node * cluster.nodes;
    let p = total_params as f64;
    if cpu_offload {
        ZeroEstimate {
            gpu_bytes: 2 * total_params,
            cpu_bytes: (p * (4.0 * gpus as f64).max(16.0) * BUFFER_FACTOR) as u64,
        }
    } else {
        ZeroEstimate {
            gpu_bytes: 4 * total_params + (16.0 * p / gpus as f64) as u64,
            cpu_bytes: (p * 4.0 * cluster.gpus_per_node as f64 * BUFFER_FACTOR) as u64,
        }
    }
}

/// What ZeRO-3 offloads to the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Zero3Offload {
    /// Nothing.
    None,
    /// The optimizer state.
    Optimizer,
    /// The optimizer state and the parameters.
    OptimizerAndParams,
}

/// ZeRO-3 (parameters sharded too); the largest layer must be gathered whole on each GPU.
/// `zero_init`: the model is built already partitioned (DeepSpeed's default).
pub fn zero3(
    total_params: u64,
    largest_layer_params: u64,
    cluster: Cluster,
    offload: Zero3Offload,
    zero_init: bool,
) -> ZeroEstimate {
    let gpus = (cluster.gpus_per_node * cluster.nodes) as f64;
    let per_node = 1.0 / cluster.nodes as f64;
    let p = total_params as f64;
    let largest = 4 * largest_layer_params;
    let cold = |bytes_per_param: f64| {
        if zero_init {
            p * bytes_per_param * per_node * BUFFER_FACTOR
        } else {
            p * (4.0 * cluster.gpus_per_node as f64).max(bytes_per_param * per_node) * BUFFER_FACTOR
        }
    };
    let (gpu, cpu) = match offload {
        Zero3Offload::OptimizerAndParams => (largest, cold(18.0)),
        Zero3Offload::Optimizer => (largest + (2.0 * p / gpus) as u64, cold(16.0)),
        Zero3Offload::None => {
            let cpu = if zero_init {
                largest_layer_params as f64 * 4.0 * cluster.gpus_per_node as f64 * BUFFER_FACTOR
            } else {
                p * 4.0 * cluster.gpus_per_node as f64 * BUFFER_FACTOR
            };
            (largest + (18.0 * p / gpus) as u64, cpu)
        }
    };
    ZeroEstimate {
        gpu_bytes: gpu,
        cpu_bytes: cpu as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::predict::units::gib;

    /// DeepSpeed's memory documentation: t5-3b (2851M parameters), one node of 8 GPUs.
    #[test]
    fn t5_3b_on_8_gpus_matches_the_deepspeed_documentation() {
        let node = Cluster {
            gpus_per_node: 8,
            nodes: 1,
        };
        let params = 2_851_000_000;
        let plain = zero2(params, node, false);
        let offload = zero2(params, node, true);
        assert_eq!(format!("{:.2}", gib(plain.gpu_bytes as f64)), "15.93");
        assert_eq!(format!("{:.2}", gib(offload.gpu_bytes as f64)), "5.31");
    }

    /// DeepSpeed's ZeRO-3 estimate as printed for t5-small (60M parameters, 16M in its largest
    /// layer, the 32128 × 512 embedding) on one GPU: per CPU | per GPU, GB, for each option.
    #[test]
    fn t5_small_zero3_table_matches_the_printed_one() {
        let one = Cluster {
            gpus_per_node: 1,
            nodes: 1,
        };
        let (params, largest) = (60_506_624, 32_128 * 512);
        let row = |offload, zero_init| {
            let e = zero3(params, largest, one, offload, zero_init);
            format!(
                "{:.2} | {:.2}",
                gib(e.cpu_bytes as f64),
                gib(e.gpu_bytes as f64)
            )
        };
        use Zero3Offload::*;
        assert_eq!(row(OptimizerAndParams, true), "1.52 | 0.06");
        assert_eq!(row(OptimizerAndParams, false), "1.52 | 0.06");
        assert_eq!(row(Optimizer, true), "1.35 | 0.17");
        assert_eq!(row(Optimizer, false), "1.35 | 0.17");
        assert_eq!(row(None, true), "0.09 | 1.08");
        assert_eq!(row(None, false), "0.34 | 1.08");
    }
}
