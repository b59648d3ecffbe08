//! Short-lived buffers of the step's largest ops, and the bookkeeping of burn's autodiff graph.
//!
//! These are properties of the engine (burn 0.22 on the CPU backend, napkin's ops), not of
//! the model: each constant below was measured with the counting allocator
//! (`tests/tests/memory`) and is checked there, case by case, by the measurement grid.

use super::inventory::{Entry, Kind, Phases, Scenario};
use crate::config::{ATTENTION_TILE, AttentionKind, LoraTarget};

/// Bytes burn's graph holds per recorded op (node, parents, boxed backward step) until the
/// backward frees it: 455–485 measured per op over blocks of 77 and 103 recorded ops.
pub const GRAPH_BYTES_PER_OP: u64 = 470;

/// The attention backward holds this many `[B, H, T, S]` buffers at once (the probabilities'
/// gradient, the softmax's recomputed exponentials and their product).
pub const ATTENTION_BACKWARD_COPIES: u64 = 2;

/// The MLP backward holds this many `[B, T, F]` buffers at once: the gradient of
/// `silu(gate)·up`. The fused SwiGLU writes its inputs' gradients over the kept `gate` and
/// `up` (burn's ops held two more buffers).
pub const MLP_BACKWARD_COPIES: u64 = 1;

/// Half-buffers `[B, T, F]` the MLP backward adds when `down_proj` has a LoRA adapter: the
/// adapter's share of the gradient exists beside the base's until they are added, while
/// `down_proj`'s kept input is already being freed: 0.6–0.8 of a buffer measured over the grid
/// and the T = 1024 attention case (`tests/tests/memory`).
pub const MLP_LORA_HALF_COPIES: u64 = 1;

/// With LoRA on `q_proj`, `k_proj` or `v_proj` the gradient of the attention's input gathers
/// a `[B, T, D]` contribution from each base and adapter; burn adds each arriving one into the
/// running sum in place, so two exist at once beside the attention's workspace: the sum and
/// the newcomer. (This was 4, fitted on the grid's LoRA + checkpointing steps; the held-out
/// cases in `tests/tests/memory/held_out.rs` showed it 9 % high at B = 2, T = 256, where the
/// head's backward workspace, absent then, had been what the extra copies stood in for.)
pub const ATTENTION_LORA_INPUT_GRAD_COPIES: u64 = 2;

/// A graph-free MLP forward (checkpointing's first pass) holds `gate`, `up` and their fused
/// product at once: this many `[B, T, F]` buffers.
pub const MLP_FORWARD_COPIES: u64 = 3;

/// Bytes burn keeps per parameter tensor beside its values on an autodiff device (the `Param`
/// with its id and lazy-init state, the autodiff node, the tensor's handle and shape), measured
/// alone with the counting allocator: 2,110 (NdArray) and 2,152 (Flex) per one-value parameter.
pub const PARAMETER_BYTES: u64 = 2_130;

/// napkin's gradients live in a hash map from parameter to tensor: each bucket holds a tensor
/// handle inline, each tensor a small shape allocation. Fitted on 10, 39 and 56 tensors
/// (16, 64, 64 buckets): 5,552 / 22,120 / 22,800 bytes measured.
pub const GRADIENT_MAP_BYTES_PER_BUCKET: u64 = 321;
/// See [`GRADIENT_MAP_BYTES_PER_BUCKET`].
pub const GRADIENT_BYTES_PER_TENSOR: u64 = 40;

/// The first optimizer update replaces every trainable tensor with a new one whose handle and
/// autodiff node cost this much beyond the values (fitted with SGD and AdamW on 28, 38 and 56
/// tensors: 928–990 bytes).
pub const UPDATED_PARAMETER_BYTES: u64 = 950;

/// Bytes per bucket of the optimizer's map from parameter to state: two tensor handles for
/// AdamW's moments, one for SGD's momentum, 8-bit AdamW's quantized state kept in plain vectors
/// (fitted: 642 / 321 / 98).
pub fn optimizer_map_bucket_bytes(kind: crate::config::OptimizerKind) -> u64 {
    use crate::config::OptimizerKind;
    match kind {
        OptimizerKind::AdamW => 2 * GRADIENT_MAP_BYTES_PER_BUCKET,
        OptimizerKind::Sgd => GRADIENT_MAP_BYTES_PER_BUCKET,
        OptimizerKind::AdamW8bit => 98,
    }
}

/// Bytes the optimizer's bookkeeping adds to its state after the first update.
pub fn optimizer_map_bytes(kind: crate::config::OptimizerKind, tensors: u64) -> u64 {
    optimizer_map_bucket_bytes(kind) * hash_map_buckets(tensors) + UPDATED_PARAMETER_BYTES * tensors
}

/// Buckets of a Rust `HashMap` holding `entries` (hashbrown: a power of two, at most 7/8 full).
pub fn hash_map_buckets(entries: u64) -> u64 {
    match entries {
        0 => 0,
        1..=3 => 4,
        4..=7 => 8,
        _ => (entries * 8).div_ceil(7).next_power_of_two(),
    }
}

/// Bytes of the gradient map beyond the gradients' values.
pub fn gradient_map_bytes(tensors: u64) -> u64 {
    GRADIENT_MAP_BYTES_PER_BUCKET * hash_map_buckets(tensors) + GRADIENT_BYTES_PER_TENSOR * tensors
}

/// A graph-free block forward (checkpointing) holds this many `[B, H, T, S]` buffers at once
/// (scores and probabilities).
pub const ATTENTION_FORWARD_COPIES: u64 = 2;

/// The memory-efficient attention's backward with burn's ops (the GPU backends) holds this many
/// `[B, H, tile, tile]` blocks at once (scores, probabilities, their gradient and its product),
/// and its input gradients twice (the per-tile parts and their concatenation). The fused CPU
/// kernel's own buffers are derived in `attention_workspaces`.
pub const EFFICIENT_BACKWARD_BLOCKS: u64 = 4;
/// The memory-efficient attention's forward holds this many `[B, H, tile, tile]` blocks (the
/// scores and their exponentials) and its output twice (tiles and concatenation).
pub const EFFICIENT_FORWARD_BLOCKS: u64 = 2;

/// Bytes of the attention's short-lived buffers in the backward and in a graph-free forward.
fn attention_workspaces(s: &Scenario) -> (u64, u64) {
    let c = &s.config;
    let (b, t) = (s.micro_batch as u64, s.seq_len as u64);
    let (h, hkv, dh) = (
        c.num_attention_heads as u64,
        c.num_key_value_heads as u64,
        c.head_dim as u64,
    );
    match s.attention {
        AttentionKind::Eager => {
            let scores = F32 * b * h * t * t;
            (
                ATTENTION_BACKWARD_COPIES * scores,
                ATTENTION_FORWARD_COPIES * scores,
            )
        }
        AttentionKind::Efficient => {
            let tile = t.min(ATTENTION_TILE as u64);
            let block = F32 * b * h * tile * tile;
            let inputs = F32 * b * t * (h + 2 * hkv) * dh;
            let output = F32 * b * t * h * dh;
            let backward = match s.kernels {
                crate::config::Kernels::BurnOps => EFFICIENT_BACKWARD_BLOCKS * block + 2 * inputs,
                // napkin's fused CPU kernel (`kernels/fused/tiled_attention.rs`) walks the tiles
                // head by head on the thread pool, so its score blocks are per thread (two of
                // TILE² each, left out: small and machine-dependent). It holds ∂q and each
                // query head's share of ∂k and ∂v (3 × [B, H, T, Dh]), their sums over a group
                // when heads share K/V (2 × [B, Hkv, T, Dh]), and, as counted for burn's ops,
                // the input gradients twice once they are tensors (this last term is carried
                // over, not measured inside the kernel). (Counting burn's `B·H` blocks here
                // over-predicted tiny-gqa's step by 13–50 %: tests/tests/memory/held_out.rs.)
                crate::config::Kernels::FusedCpu => {
                    let q = F32 * b * t * h * dh;
                    let kv = F32 * b * t * hkv * dh;
                    let group_sums = if h > hkv { 2 * kv } else { 0 };
                    3 * q + group_sums + 2 * inputs
                }
            };
            (backward, EFFICIENT_FORWARD_BLOCKS * block + 2 * output)
        }
    }
}

const F32: u64 = 4;

/// The workspaces of one micro-batch's forward and backward. `down_input_kept` lists the
/// blocks whose down projection keeps its input in f32 (then it is among the kept tensors).
pub fn entries(s: &Scenario, down_input_kept: &[usize]) -> Vec<Entry> {
    let c = &s.config;
    let (b, t) = (s.micro_batch as u64, s.seq_len as u64);
    let n = b * t;
    let (attention_backward, attention_forward) = attention_workspaces(s);
    let backward = Phases {
        backward: true,
        ..Phases::default()
    };
    let forward = Phases {
        forward: true,
        ..Phases::default()
    };
    let workspace = |name: String, layer, bytes, phases| Entry {
        name,
        layer,
        kind: Kind::Workspace,
        bytes,
        phases,
    };
    // An NF4 linear dequantizes its weight for the forward and again for the input gradient;
    // the largest one of each half is alive beside that half's workspace.
    let dequantized = |rows: usize, cols: usize| {
        if s.nf4.is_some() {
            F32 * (rows * cols) as u64
        } else {
            0
        }
    };
    let mlp_weight = dequantized(c.intermediate_size, c.hidden_size);
    let down_proj_lora = s
        .lora
        .as_ref()
        .is_some_and(|l| l.targets(LoraTarget::DownProj));
    let mlp_half_copies =
        2 * MLP_BACKWARD_COPIES + u64::from(down_proj_lora) * MLP_LORA_HALF_COPIES;
    let qkv_lora = s.lora.as_ref().is_some_and(|l| {
        [LoraTarget::QProj, LoraTarget::KProj, LoraTarget::VProj]
            .into_iter()
            .any(|t| l.targets(t))
    });
    let attention_input_grads =
        u64::from(qkv_lora) * ATTENTION_LORA_INPUT_GRAD_COPIES * F32 * n * c.hidden_size as u64;
    let attention_weight = dequantized(c.q_dim(), c.hidden_size);
    // The fused loss writes the logits' gradient over the logits it kept: no `[B, T, V]`
    // workspace in the loss or head backward.
    // The head's backward computes the gradient of its input, `[B, T, D]`, while the logits'
    // gradient is alive, and the final norm's backward the gradient of its own input beside it.
    let mut out = vec![workspace(
        "lm_head.backward_workspace".into(),
        None,
        2 * F32 * n * c.hidden_size as u64,
        backward,
    )];
    for layer in 0..c.num_hidden_layers {
        out.push(workspace(
            format!("layers.{layer}.mlp.backward_workspace"),
            Some(layer),
            mlp_half_copies * F32 * n * c.intermediate_size as u64 / 2 + mlp_weight,
            backward,
        ));
        out.push(workspace(
            format!("layers.{layer}.self_attn.backward_workspace"),
            Some(layer),
            attention_backward + attention_weight + attention_input_grads,
            backward,
        ));
        if s.checkpointing {
            // The backward's recomputation of the block peaks at its last product,
            // `down_proj`: every tensor the block keeps is alive, with the product's input
            // `silu(gate)·up` (unless kept), its dequantized NF4 weight and, from above, the
            // gradient of the block's output that the backward is about to start from
            // (measured on a held-out QLoRA case, `tests/tests/memory/held_out.rs`: 1.427 MiB
            // above what the block keeps, its input 0.756 and its weight 0.672).
            let down_input = if down_input_kept.contains(&layer) {
                0
            } else {
                F32 * n * c.intermediate_size as u64
            };
            out.push(workspace(
                format!("layers.{layer}.recompute_workspace"),
                Some(layer),
                F32 * n * c.hidden_size as u64 + down_input + mlp_weight,
                backward,
            ));
            out.push(workspace(
                format!("layers.{layer}.self_attn.forward_workspace"),
                Some(layer),
                (attention_forward + attention_weight)
                    .max(MLP_FORWARD_COPIES * F32 * n * c.intermediate_size as u64 + mlp_weight),
                forward,
            ));
        }
    }
    out
}
