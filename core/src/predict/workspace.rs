//! Short-lived buffers of the step's largest ops, and the bookkeeping of burn's autodiff graph.
//!
//! These are properties of the engine (burn 0.22 on the CPU backend, napkin's ops), not of
//! the model: each constant below was measured with the counting allocator
//! (`tests/tests/memory`) and is checked there, case by case, by the measurement grid.

use super::inventory::{Entry, Kind, Phases, Scenario};
use super::row_layout::Size;
use crate::config::{ATTENTION_TILE, AttentionKind, LoraTarget};

/// Bytes burn's graph holds per recorded op (node, parents, boxed backward step) until the
/// backward frees it: 455–485 measured per op over blocks of 77 and 103 recorded ops.
pub const GRAPH_BYTES_PER_OP: u64 = 470;

/// The attention backward holds this many `[B, H, T, S]` buffers at once (the probabilities'
/// gradient, the softmax's recomputed exponentials and their product).
pub const ATTENTION_BACKWARD_COPIES: u64 = 2;

/// With the GPU's fused softmax (`kernels/gpu/fused/softmax.rs`) the attention backward holds
/// one `[B, H, T, S]` buffer: the probabilities' gradient, which the softmax's backward
/// overwrites with the scores' gradient.
pub const FUSED_SOFTMAX_BACKWARD_COPIES: u64 = 1;

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

/// Bytes of one tensor handle, `burn::tensor::Tensor`: an enum over the backends compiled in,
/// so a build with wgpu or CUDA has larger handles than one with the CPU backends alone.
pub fn tensor_handle_bytes() -> u64 {
    std::mem::size_of::<burn::tensor::Tensor<1>>() as u64
}

/// Bytes burn keeps per parameter tensor beside its values on an autodiff device (the `Param`
/// with its id and lazy-init state, the autodiff node, the tensor's shape) and beside its two
/// tensor handles (the `Param`'s, held inline, and the autodiff tensor's inner one): measured
/// alone with the counting allocator, 2,110 (NdArray) and 2,152 (Flex) per one-value parameter
/// with the CPU backends alone, whose handles are 256 bytes. (A build with wgpu has 640-byte
/// handles and measured 2,879 and 2,921: 769 more on NdArray, two handles' growth; its
/// gradient map 384 more per bucket, one handle's.)
pub const PARAMETER_BYTES_BESIDE_HANDLES: u64 = 2_130 - 2 * 256;
/// Bytes burn keeps per parameter tensor beside its values (see
/// [`PARAMETER_BYTES_BESIDE_HANDLES`]).
pub fn parameter_bytes() -> u64 {
    PARAMETER_BYTES_BESIDE_HANDLES + 2 * tensor_handle_bytes()
}

/// Bytes one bucket of a Rust `HashMap<K, V>` takes (hashbrown: the entry inline and one
/// control byte).
const fn bucket_bytes<K, V>() -> u64 {
    (std::mem::size_of::<(K, V)>() + 1) as u64
}

/// Bytes per bucket of napkin's gradient map (parameter → tensor): the tensor's handle inline,
/// whose size depends on the backends compiled in (burn's run-time tensor is an enum over
/// them). With the CPU backends alone 321 per bucket was fitted on 10, 39 and 56 tensors
/// (5,552 / 22,120 / 22,800 bytes); a build with wgpu measured 384 bytes more per bucket
/// (tiny-smol QLoRA's 64: 373,008 bytes of gradients against 348,416 predicted with the fit,
/// 372,992 with this).
pub fn gradient_map_bucket_bytes() -> u64 {
    bucket_bytes::<burn::module::ParamId, burn::tensor::Tensor<1>>()
}
/// Bytes per gradient beside the map: its small shape allocation.
pub const GRADIENT_BYTES_PER_TENSOR: u64 = 40;

/// The first optimizer update replaces every trainable tensor with a new one whose handle and
/// autodiff node cost this much beyond the values (fitted with SGD and AdamW on 28, 38 and 56
/// tensors: 928–990 bytes).
pub const UPDATED_PARAMETER_BYTES: u64 = 950;

/// Bytes per bucket of the optimizer's map from parameter to state: two tensor handles for
/// AdamW's moments, one for SGD's momentum (both as [`gradient_map_bucket_bytes`], 642 and 321
/// fitted with the CPU backends alone), 8-bit AdamW's quantized state kept in plain vectors
/// (fitted: 98).
pub fn optimizer_map_bucket_bytes(kind: crate::config::OptimizerKind) -> u64 {
    use crate::config::OptimizerKind;
    match kind {
        OptimizerKind::AdamW => {
            bucket_bytes::<burn::module::ParamId, [burn::tensor::Tensor<1>; 2]>()
        }
        OptimizerKind::Sgd => gradient_map_bucket_bytes(),
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
    gradient_map_bucket_bytes() * hash_map_buckets(tensors) + GRADIENT_BYTES_PER_TENSOR * tensors
}

/// A graph-free block forward (checkpointing) holds this many `[B, H, T, S]` buffers at once
/// (scores and probabilities).
pub const ATTENTION_FORWARD_COPIES: u64 = 2;

/// The memory-efficient attention's backward with burn's ops (the GPU backends) holds this many
/// `[B, H, tq, tk]` score blocks at once: the probabilities (written over the scores) and the
/// score gradient (written over the probabilities' gradient); burn's element-wise ops write in
/// place into an operand nothing else holds. The rest of its workspace is derived in
/// [`efficient_backward_with_tensor_ops`].
pub const EFFICIENT_BACKWARD_BLOCKS: u64 = 2;
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
            let scores = s.attention_value_bytes() * b * h * t * t;
            let backward = match s.kernels.fuses_softmax() {
                true => FUSED_SOFTMAX_BACKWARD_COPIES,
                false => ATTENTION_BACKWARD_COPIES,
            };
            (backward * scores, ATTENTION_FORWARD_COPIES * scores)
        }
        AttentionKind::Efficient => {
            let tile = t.min(ATTENTION_TILE as u64);
            let block = F32 * b * h * tile * tile;
            let inputs = F32 * b * t * (h + 2 * hkv) * dh;
            let output = F32 * b * t * h * dh;
            let backward = match s.kernels {
                crate::config::Kernels::BurnOps | crate::config::Kernels::FusedGpu => {
                    // napkin's GPU RoPE writes the queries as contiguous heads
                    // (`kernels/gpu/fused/rope.rs`), unless the device pads their rows.
                    let contiguous_queries =
                        s.kernels == crate::config::Kernels::FusedGpu && !s.rows.pads(dh, F32);
                    efficient_backward_with_tensor_ops(
                        [b, t, h, hkv, dh],
                        ATTENTION_TILE as u64,
                        contiguous_queries,
                    )
                }
                // napkin's fused CPU kernel (`kernels/cpu/fused/tiled_attention.rs`) walks the tiles
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

/// The short-lived bytes of the efficient attention's tiled backward on burn's ops
/// (`kernels/efficient_attention.rs::backward_by_blocks`), `tile` positions a tile.
///
/// Alive throughout: the output's gradient as it arrives, `[B, H, T, Dh]` (the replay's base
/// does not hold it at this event), and `δ = rowsum(∂o ⊙ o)`, `[B, H, T, 1]`. Then the larger of
/// - the loop over query tiles `i` (`tq` rows each): [`EFFICIENT_BACKWARD_BLOCKS`] blocks of
///   `[B, H, tq, min(T, tile)]`; when heads share K/V, the query tile's rows of `q` and `∂o`
///   copied to fold the groups into rows (`[B, H, tq, Dh]` is not a view of
///   `[B, Hkv, G·tq, Dh]` for permuted or sliced rows; `q` is neither when it arrives as
///   contiguous heads, `contiguous_queries`, and one tile holds every row); past one tile, the tile's rows of the
///   log-sum-exp and `δ` copied too; and the gradients summed so far: `∂q` of the earlier
///   query tiles and, past the first key tile, this tile's running sum, `∂k` and `∂v` of the
///   earlier key tiles;
/// - the concatenation of the tiles' gradients: all three input gradients, and the one being
///   concatenated (at most `∂q`'s size) a second time.
///
/// Read on lavapipe at marks between the kernel's ops, the kernel's own buffers are this to the
/// byte (tiny-smol, tiny-gqa and tiny-mha at T = 128 to 512, B = 1 to 3), and the reading at
/// the attention's backward is the replay within 0.05 % (a few hundred bytes that are not the
/// kernel's); `tests/tests/gpu/device_pool.rs` checks it on shapes not used to write it.
fn efficient_backward_with_tensor_ops(
    [b, t, h, hkv, dh]: [u64; 5],
    tile: u64,
    contiguous_queries: bool,
) -> u64 {
    let grouped = h > hkv;
    let tiles = t.div_ceil(tile);
    // Copied to fold the groups: `∂o` always, `q` unless it is a view already.
    let folded_copies = if contiguous_queries && tiles == 1 {
        1
    } else {
        2
    };
    let key_tile = t.min(tile);
    let loop_peak = (0..tiles)
        .map(|i| {
            let rows = (t - i * tile).min(tile);
            let blocks = EFFICIENT_BACKWARD_BLOCKS * F32 * b * h * rows * key_tile;
            let folded = if grouped { folded_copies * dh } else { 0 };
            let sliced = if tiles > 1 { 2 } else { 0 };
            let copies = F32 * b * h * rows * (folded + sliced);
            let running = if i > 0 { rows } else { 0 };
            let sums = F32 * b * dh * (h * (i * tile + running) + 2 * hkv * i * tile);
            blocks + copies + sums
        })
        .max()
        .unwrap_or(0);
    let inputs = F32 * b * t * (h + 2 * hkv) * dh;
    let concatenation = inputs + F32 * b * t * h * dh;
    let arriving = F32 * b * t * h * dh;
    let delta = F32 * b * h * t;
    arriving + delta + loop_peak.max(concatenation)
}

/// The attention half's backward workspace: the attention's own (`attention`) and the input
/// projections' (`projections`: a dequantized NF4 weight, the LoRA paths' input gradients).
/// The efficient attention on burn's ops frees its blocks before the projections' backward
/// runs, so the larger of the two is alive (read on lavapipe at the tiled backward's marks and
/// the NF4 products' marks after it: SmolLM2-135M QLoRA T = 256, 3.156 MB and 2.46 MB above the
/// rest of the step, predicted 3.164 and 2.51). The other kernels' terms were fitted on the
/// CPU's counting allocator as a sum, and stay one.
fn attention_backward_event(s: &Scenario, attention: u64, projections: u64) -> u64 {
    match (s.attention, s.kernels.fuses_efficient_attention()) {
        (AttentionKind::Efficient, false) => attention.max(projections),
        _ => attention + projections,
    }
}

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
    // A graph-free block forward (checkpointing's, DPO's reference) peaks at the attention's
    // scores or at the MLP's three `[B, T, F]` buffers, with an NF4 weight dequantized.
    let graph_free_block = (attention_forward + attention_weight)
        .max(MLP_FORWARD_COPIES * F32 * n * c.intermediate_size as u64 + mlp_weight);
    if s.objective.has_reference() {
        // DPO's reference forward, before the policy's, without a graph: the residual stream,
        // one block's transients at a time, then the logits beside the final norm's output
        // (the head's input; measured: the stream and it are both alive at the head's
        // product), read for the label log-probabilities in place and freed.
        let hidden = F32 * n * c.hidden_size as u64;
        out.push(workspace("reference.hidden".into(), None, hidden, forward));
        // The forward's tables, made per forward: RoPE's cos and sin for every position and,
        // for the eager attention, the additive mask (one per row: pair rows are packed).
        let masks = match s.attention {
            AttentionKind::Eager => F32 * if s.packed { b } else { 1 } * t * t,
            AttentionKind::Efficient => 0,
        };
        out.push(workspace(
            "reference.tables".into(),
            None,
            2 * F32 * n * c.head_dim as u64 + masks,
            forward,
        ));
        for layer in 0..c.num_hidden_layers {
            out.push(workspace(
                format!("reference.layers.{layer}.forward_workspace"),
                Some(layer),
                graph_free_block,
                forward,
            ));
        }
        // The chunked loss's reads one chunk's logits (`[R + 1, V]`) at a time.
        let logits_rows = match s.loss_chunk_rows() {
            Some(rows) => n.min(rows as u64 + 1),
            None => n,
        };
        out.push(workspace(
            "reference.logits".into(),
            None,
            s.rows
                .bytes(Size::rows(logits_rows, c.vocab_size as u64), F32)
                + hidden,
            forward,
        ));
    }
    if s.lora.as_ref().is_some_and(|l| l.head) {
        // An adapter on the head: its `[B·T, V]` product exists beside the base's before the
        // two are added (measured: one more `[B·T, V]` at the step's peak than without).
        out.push(workspace(
            "lm_head.lora_workspace".into(),
            None,
            s.rows.bytes(Size::rows(n, c.vocab_size as u64), F32),
            forward,
        ));
    }
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
            attention_backward_event(
                s,
                attention_backward,
                attention_weight + attention_input_grads,
            ),
            backward,
        ));
        if s.checkpoints_blocks() {
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
                graph_free_block,
                forward,
            ));
        }
    }
    out
}
