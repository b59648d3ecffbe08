//! What one training step of napkin's engine sends over the host link on a GPU. The weights
//! are resident (NF4 codes and scales, float weights and adapters are uploaded once, when the
//! model is loaded or moved), so a step uploads its batch — token ids, the loss's targets and
//! weights, the RoPE tables, the attention mask — and reads back the loss. `device::link`
//! counts the real transfers; `tests/tests/gpu/nf4_device.rs` holds the two equal. Optimizer
//! offload's traffic is `offload.rs`'s.

use serde::{Deserialize, Serialize};

use super::inventory::Scenario;
use crate::config::{ATTENTION_TILE, AttentionKind};

/// Bytes of an f32, and of an int on a GPU backend (i32).
const WORD: u64 = 4;

/// Host → device bytes of one step's batch data, by what they carry, and the bytes read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepLink {
    /// `[B, T]` token ids.
    pub ids: u64,
    /// The loss's `[B, T − 1]` targets and their weights.
    pub labels: u64,
    /// RoPE cos and sin, `[B, 1, T, Dh]` each.
    pub rope: u64,
    /// The eager attention's `[1 or B, 1, T, T]` mask, or the efficient attention's distinct
    /// causal tiles (each made once per micro-batch and shared by every layer and pass).
    pub mask: u64,
    /// Device → host: the step's mean loss.
    pub read_back: u64,
}

impl StepLink {
    /// Host → device, all of it.
    pub fn up(&self) -> u64 {
        self.ids + self.labels + self.rope + self.mask
    }
}

/// The step's link bytes, or `None` for packed rows under the efficient attention (their tile
/// masks depend on where each packed sequence ends, which the scenario does not say).
pub fn step_link(s: &Scenario) -> Option<StepLink> {
    let micro = s.accumulation.max(1) as u64;
    let (b, t) = (s.micro_batch as u64, s.seq_len as u64);
    let head_dim = s.config.head_dim as u64;
    let mask = match s.attention {
        AttentionKind::Eager => WORD * if s.packed { b } else { 1 } * t * t,
        AttentionKind::Efficient if s.packed => return None,
        AttentionKind::Efficient => WORD * causal_tile_mask_values(t),
    };
    Some(StepLink {
        ids: micro * WORD * b * t,
        // The chunked loss's columns have a value per logits row (0 weight on the last ones).
        labels: micro
            * 2
            * WORD
            * match s.chunks_loss() {
                true => b * t,
                false => b * t.saturating_sub(1),
            },
        rope: micro * 2 * WORD * b * t * head_dim,
        mask: micro * mask,
        read_back: WORD,
    })
}

/// AdamW's scalars a recorded step reads from the device (`kernels::gpu::adamw::DEVICE_SCALARS`,
/// the 7 the host writes and the 2 computed in the graph) and the step's `[loss, Σ g²]`.
const RECORDED_STEP_SCALARS: u64 = 7 + 2 + 2;

/// What a step recorded as a device graph (`train/captured.rs`) holds for the run beside the
/// gradients (which it keeps too, where a step op by op frees them after the update): its
/// inputs' buffers, one a kind for all micro-batches, each step's batch written into them (the
/// bytes [`step_link`] counts); with two or more micro-batches, the copies the graph makes of
/// a kind's parts whose bytes are not a multiple of the device's memory `alignment` (burn's
/// slice is a view only at such offsets; `device::memory_alignment`, `captured_inputs.rs`);
/// and the update's scalars. `None` where `step_link` is.
pub fn held_by_recorded_step(s: &Scenario, alignment: u64) -> Option<u64> {
    let link = step_link(s)?;
    let micro = s.accumulation.max(1) as u64;
    // Each kind's part: ids, the two label columns, cos and sin, the mask.
    let parts = [
        (link.ids / micro, 1),
        (link.labels / micro / 2, 2),
        (link.rope / micro / 2, 2),
        (link.mask / micro, 1),
    ];
    let copied: u64 = match micro {
        1 => 0,
        _ => parts
            .iter()
            .filter(|(bytes, _)| !bytes.is_multiple_of(alignment.max(1)))
            .map(|(bytes, kinds)| bytes * kinds * micro)
            .sum(),
    };
    Some(link.up() + copied + WORD * RECORDED_STEP_SCALARS)
}

/// Values of the distinct causal tile masks the efficient attention makes for an unpacked
/// batch of `t` positions on burn's ops: only the diagonal tiles hide keys, and a full one and
/// the partial last one differ (a one-position tile hides nothing).
pub fn causal_tile_mask_values(t: u64) -> u64 {
    let tile = ATTENTION_TILE as u64;
    let full = if t >= tile { tile * tile } else { 0 };
    let last = t % tile;
    let partial = if last > 1 { last * last } else { 0 };
    full + partial
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LlamaConfig;

    /// tiny-smol, B = 1, T = 64, eager: 256 B of ids, 504 of labels, 8,192 of RoPE tables and
    /// 16,384 of mask — the 25,336 B a step uploads on wgpu (tests/tests/gpu).
    #[test]
    fn a_tiny_smol_step_uploads_its_batch() {
        let s = Scenario::new(LlamaConfig::tiny_smol(), 1, 64);
        let link = step_link(&s).unwrap();
        assert_eq!(
            (link.ids, link.labels, link.rope, link.mask),
            (256, 504, 8192, 16384)
        );
        assert_eq!(link.up(), 25_336);
        // The efficient attention at T = 300: one full diagonal tile and a 44-position one.
        let efficient = Scenario {
            attention: AttentionKind::Efficient,
            ..Scenario::new(LlamaConfig::tiny_smol(), 2, 300)
        };
        assert_eq!(
            step_link(&efficient).unwrap().mask,
            4 * (128 * 128 + 44 * 44)
        );
    }
}
