//! Time napkin math: FLOPs of one optimizer step, the bytes it must move, and a roofline
//! verdict (compute- or memory-bound) with a step time for a device.
//!
//! FLOPs count the matrix products only (2 per multiply-add), as napkin's engine runs them:
//! - a linear `x·Wᵀ` over n tokens costs `2·n·in·out` forward; its backward costs the same
//!   again for the input gradient and again for the weight gradient when W trains;
//! - the eager attention computes the full `T × T` scores (no causal skipping):
//!   `4·B·H·T²·Dh` forward (QKᵀ and PV), twice that backward; the memory-efficient one
//!   visits only the key tiles up to the diagonal and, under a sliding window, not past it
//!   (a fraction `f` of the `T × T` pairs, about ½ at long context without one) and recomputes QKᵀ in the backward: `4·f·B·H·T²·Dh` forward,
//!   2.5 times that backward;
//! - LoRA adds `2·n·r·(in + out)` per adapted linear forward, twice that backward;
//! - gradient checkpointing recomputes every block's forward once in the backward.
//!
//! Bytes moved are a lower bound: weights read once per pass (and, for NF4, the dequantized f32
//! weight written and read again), the kept activations written once and read once, the
//! logits four times (written, log-softmax read and write, backward), and the optimizer's
//! read-modify-write of parameters, gradients and state.

use serde::{Deserialize, Deserializer, Serialize};

use super::inventory::{Kind, Scenario, inventory, totals_by_kind};
use super::row_layout::Size;
use crate::config::{ATTENTION_TILE, AttentionKind, LoraTarget, OptimizerKind};

/// FLOPs and bytes of one optimizer step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StepWork {
    /// Forward FLOPs (all micro-batches).
    pub forward_flops: f64,
    /// Backward FLOPs (without recomputation).
    pub backward_flops: f64,
    /// FLOPs of the forward recomputed by gradient checkpointing.
    pub recompute_flops: f64,
    /// FLOPs LoRA saves against full fine-tuning of the same model (no weight gradients of
    /// the frozen base), net of the adapters' own.
    pub lora_saved_flops: f64,
    /// Bytes the step must move to and from memory.
    pub bytes_moved: f64,
    /// Bytes the step moves over the host link on a discrete GPU (its batch up, the loss back:
    /// [`super::link::step_link`]); the weights are resident.
    pub link_bytes: f64,
}

impl StepWork {
    /// All FLOPs.
    pub fn flops(&self) -> f64 {
        self.forward_flops + self.backward_flops + self.recompute_flops
    }

    /// FLOPs per byte moved.
    pub fn arithmetic_intensity(&self) -> f64 {
        self.flops() / self.bytes_moved.max(1.0)
    }
}

/// Forward FLOPs of one micro-batch, split into (blocks, head), and the backward's.
fn micro_batch_flops(s: &Scenario, weights_train: bool) -> (f64, f64, f64) {
    let c = &s.config;
    let n = s.tokens() as f64;
    let (b, t) = (s.micro_batch as f64, s.seq_len as f64);
    let layers = c.num_hidden_layers as f64;
    let linears: f64 = c
        .block_linears()
        .iter()
        .map(|&(_, out, inp)| (out * inp) as f64)
        .sum();
    let lora: f64 = s.lora.as_ref().map_or(0.0, |l| {
        c.block_linears()
            .iter()
            .zip(LoraTarget::ALL)
            .filter(|(_, target)| l.targets(*target))
            .map(|(&(_, out, inp), _)| (l.r * (out + inp)) as f64)
            .sum()
    });
    // DoRA per adapted linear and forward: the norm's `A·Wᵀ` (2·r·in·out, whatever the
    // tokens); with dropout, the dropped input's base product and its input gradient.
    let (dora_norms, dora_dropped): (f64, f64) =
        s.lora
            .as_ref()
            .filter(|l| l.use_dora)
            .map_or((0.0, 0.0), |l| {
                let adapted = c
                    .block_linears()
                    .iter()
                    .zip(LoraTarget::ALL)
                    .filter(|(_, target)| l.targets(*target))
                    .map(|(&(_, out, inp), _)| (out * inp) as f64)
                    .sum::<f64>();
                let dropped = if l.dropout > 0.0 { adapted } else { 0.0 };
                (2.0 * l.r as f64 * adapted, dropped)
            });
    let full_scores = 4.0 * b * c.num_attention_heads as f64 * t * t * c.head_dim as f64;
    let (attention, attention_backward) = match s.attention {
        AttentionKind::Eager => (full_scores, 2.0 * full_scores),
        AttentionKind::Efficient => {
            let visited = full_scores * visited_fraction(s.seq_len, c.sliding_window);
            (visited, 2.5 * visited)
        }
    };
    let block_forward =
        layers * (2.0 * n * (linears + lora + dora_dropped) + attention + dora_norms);
    let head_forward = 2.0 * n * (c.vocab_size * c.hidden_size) as f64;
    let weight_grads = if weights_train { 1.0 } else { 0.0 };
    let backward = layers
        * (2.0 * n * linears * (1.0 + weight_grads)
            + 2.0 * 2.0 * n * lora
            + 2.0 * n * dora_dropped
            + attention_backward)
        + head_forward * (1.0 + weight_grads);
    (block_forward, head_forward, backward)
}

/// The fraction of the `T × T` (query, key) pairs the memory-efficient attention computes:
/// each query tile meets the key tiles up to and including its diagonal one, less those whose
/// newest key is already past the tile's first query's `window` (Mistral's sliding window).
pub fn visited_fraction(t: usize, window: Option<usize>) -> f64 {
    let tile = ATTENTION_TILE;
    let pairs: usize = (0..t)
        .step_by(tile)
        .map(|start| {
            let end = (start + tile).min(t);
            let keys: usize = (0..end)
                .step_by(tile)
                .map(|k| (k, (k + tile).min(end)))
                .filter(|&(_, k_end)| window.is_none_or(|w| k_end - 1 + w > start))
                .map(|(k, k_end)| k_end - k)
                .sum();
            (end - start) * keys
        })
        .sum();
    pairs as f64 / (t * t).max(1) as f64
}

/// The work of one optimizer step of `s`.
pub fn step_work(s: &Scenario) -> StepWork {
    let micro = s.accumulation.max(1) as f64;
    let full = s.lora.is_none() && s.nf4.is_none();
    let (blocks, head, backward) = micro_batch_flops(s, full);
    let recompute = if s.checkpoints_blocks() { blocks } else { 0.0 };
    // DPO's reference: one more forward of the base, adapters off.
    let reference = if s.objective.has_reference() {
        let base = Scenario {
            lora: None,
            ..s.clone()
        };
        let (rb, rh, _) = micro_batch_flops(&base, full);
        rb + rh
    } else {
        0.0
    };
    // LoRA's saving: what full fine-tuning of the same model would cost, minus this.
    let lora_saved = if s.lora.is_some() {
        let full_scenario = Scenario {
            lora: None,
            nf4: None,
            ..s.clone()
        };
        let (fb, fh, fbw) = micro_batch_flops(&full_scenario, true);
        micro * ((fb + fh + fbw) - (blocks + head + backward))
    } else {
        0.0
    };

    let totals = totals_by_kind(&inventory(s));
    let kind = |k: Kind| totals.get(&k).copied().unwrap_or(0) as f64;
    let weights = kind(Kind::Weights) + kind(Kind::QuantCodes) + kind(Kind::QuantScales);
    // NF4: every pass writes and reads the dequantized weight of each block linear: f32, or
    // the 16-bit compute dtype where the GPU kernel writes it (the CPU backends keep f32).
    let dequantized_value = if s.half_compute && s.kernels.on_gpu() {
        2.0
    } else {
        4.0
    };
    let dequantized = if s.nf4.is_some() {
        let c = &s.config;
        2.0 * dequantized_value
            * c.num_hidden_layers as f64
            * c.block_linears()
                .iter()
                .map(|&(_, out, inp)| (out * inp) as f64)
                .sum::<f64>()
    } else {
        0.0
    };
    let passes = if s.checkpoints_blocks() { 3.0 } else { 2.0 }
        + if s.objective.has_reference() {
            1.0
        } else {
            0.0
        };
    // The logits cross memory four times whole or chunked (the chunked loss keeps none, but
    // each chunk's are written, read by the loss, overwritten by their gradient and read).
    let logits = (s
        .rows
        .bytes(Size::rows(s.tokens(), s.config.vocab_size as u64), 4)
        * u64::from(s.chunks_loss())) as f64;
    let activations = 2.0 * kind(Kind::SavedActivations) + 4.0 * (kind(Kind::Logits) + logits);
    let trainable_values = kind(Kind::Gradients) / 4.0;
    let optimizer_bytes_per_value = match s.optimizer {
        OptimizerKind::AdamW => 28.0,     // read p, g, m, v; write p, m, v
        OptimizerKind::AdamW8bit => 13.0, // 8-bit moments
        OptimizerKind::Sgd => 20.0,       // read p, g, momentum; write p, momentum
    };
    let bytes = micro * (passes * (weights + dequantized) + activations + 4.0 * trainable_values)
        + optimizer_bytes_per_value * trainable_values;
    StepWork {
        forward_flops: micro * (blocks + head + reference),
        backward_flops: micro * backward,
        recompute_flops: micro * recompute,
        lora_saved_flops: lora_saved,
        bytes_moved: bytes,
        link_bytes: super::link::step_link(s).map_or(0.0, |l| (l.up() + l.read_back) as f64),
    }
}

/// A device's peak rates and memory, from its vendor's data sheet (dense, no sparsity), or
/// measured on this machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DevicePreset {
    /// Short name (`t4`, `rtx4090`, `this-machine`).
    pub id: String,
    /// Display name.
    pub name: String,
    /// f32 FLOP/s (CUDA cores / CPU).
    pub f32_flops: f64,
    /// 16-bit FLOP/s (tensor cores, f32 accumulation).
    pub half_flops: f64,
    /// Memory bandwidth, bytes/s.
    pub bandwidth: f64,
    /// Device memory, bytes (10⁹-based as vendors state it; unbounded for "this machine",
    /// which JSON writes as `null`).
    #[serde(deserialize_with = "null_as_unbounded")]
    pub memory: f64,
    /// The host link's bytes per second in each direction (None: the device is the host, or
    /// reads host memory in place).
    #[serde(default)]
    pub link_bytes_per_second: Option<f64>,
}

/// JSON has no infinity: serde_json writes it as `null`; read `null` back as unbounded.
fn null_as_unbounded<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::INFINITY))
}

/// The GPU presets.
pub fn device_presets() -> Vec<DevicePreset> {
    let preset = |id: &str, name: &str, f32_t: f64, half_t: f64, gb_s: f64, gb: f64| DevicePreset {
        id: id.into(),
        name: name.into(),
        f32_flops: f32_t * 1e12,
        half_flops: half_t * 1e12,
        bandwidth: gb_s * 1e9,
        memory: gb * 1e9,
        link_bytes_per_second: link_of(id),
    };
    vec![
        preset("t4", "NVIDIA T4 16 GB", 8.1, 65.0, 320.0, 16.0),
        preset("rtx3090", "NVIDIA RTX 3090 24 GB", 35.6, 71.0, 936.0, 24.0),
        preset(
            "rtx4090",
            "NVIDIA RTX 4090 24 GB",
            82.6,
            165.2,
            1008.0,
            24.0,
        ),
        preset(
            "a100-40gb",
            "NVIDIA A100 40 GB SXM",
            19.5,
            312.0,
            1555.0,
            40.0,
        ),
        preset(
            "a100-80gb",
            "NVIDIA A100 80 GB SXM",
            19.5,
            312.0,
            2039.0,
            80.0,
        ),
        preset("h100", "NVIDIA H100 80 GB SXM", 67.0, 989.0, 3350.0, 80.0),
        preset("m2", "Apple M2 (10-core GPU, 16 GB)", 3.6, 3.6, 100.0, 16.0),
    ]
}

/// The host link of a preset GPU (`offload::host_links`' rates): PCIe 3.0 x16 for the T4,
/// 4.0 for the RTX 3090/4090 and the A100, 5.0 for the H100 SXM; Apple silicon reads host
/// memory in place.
fn link_of(id: &str) -> Option<f64> {
    let link = match id {
        "t4" => "pcie3",
        "rtx3090" | "rtx4090" | "a100-40gb" | "a100-80gb" => "pcie4",
        "h100" => "pcie5",
        _ => return None,
    };
    super::offload::host_links()
        .into_iter()
        .find(|l| l.id == link)
        .and_then(|l| l.bytes_per_second)
}

/// The device preset named `id`.
pub fn device_preset(id: &str) -> Option<DevicePreset> {
    let id = id.to_ascii_lowercase().replace('_', "-");
    device_presets().into_iter().find(|d| d.id == id)
}

/// Which roof limits the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    /// FLOPs / peak FLOP/s is the larger time.
    Compute,
    /// Bytes / bandwidth is the larger time.
    Memory,
}

/// The roofline's answer for a step on a device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RooflineTime {
    /// The device.
    pub device: String,
    /// FLOP/s used (f32 or 16-bit).
    pub peak_flops: f64,
    /// Seconds at peak FLOP/s.
    pub compute_seconds: f64,
    /// Seconds at full bandwidth.
    pub memory_seconds: f64,
    /// The verdict.
    pub bound: Bound,
    /// Seconds on the host link (the batch up, the loss back), not overlapped with compute.
    #[serde(default)]
    pub link_seconds: f64,
    /// Predicted step time: the larger of the two, plus the link's (a lower bound; real
    /// kernels reach a fraction of peak).
    pub step_seconds: f64,
    /// Arithmetic intensity at which the device turns compute-bound (FLOP/byte).
    pub ridge_point: f64,
    /// The step's arithmetic intensity.
    pub arithmetic_intensity: f64,
    /// Tokens per second at the predicted step time.
    pub tokens_per_second: f64,
}

/// The roofline time of `work` on `device`, computing in 16-bit when `half` is set.
pub fn roofline(work: &StepWork, tokens: f64, device: &DevicePreset, half: bool) -> RooflineTime {
    let peak = if half {
        device.half_flops
    } else {
        device.f32_flops
    };
    let compute = work.flops() / peak;
    let memory = work.bytes_moved / device.bandwidth;
    let link = device
        .link_bytes_per_second
        .map_or(0.0, |rate| work.link_bytes / rate);
    let step = compute.max(memory) + link;
    RooflineTime {
        device: device.name.clone(),
        peak_flops: peak,
        compute_seconds: compute,
        memory_seconds: memory,
        bound: if compute >= memory {
            Bound::Compute
        } else {
            Bound::Memory
        },
        link_seconds: link,
        step_seconds: step,
        ridge_point: peak / device.bandwidth,
        arithmetic_intensity: work.arithmetic_intensity(),
        tokens_per_second: tokens / step,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{LlamaConfig, LoraConfig, Nf4Config};

    fn smollm2() -> Scenario {
        Scenario::new(LlamaConfig::smollm2_135m(), 1, 256)
    }

    /// Under a window of 256 each 128-query tile from the third on meets three key tiles (its
    /// own and two older): 1 + 2 + 6·3 = 21 of 64 at T = 1024. (That the kernel's own tile
    /// plan visits this fraction is checked beside it, in `kernels/efficient_attention.rs`.)
    #[test]
    fn a_sliding_window_skips_the_tiles_past_it() {
        assert_eq!(visited_fraction(1024, Some(256)), 21.0 / 64.0);
        assert_eq!(
            visited_fraction(1024, Some(4096)),
            visited_fraction(1024, None)
        );
    }

    /// Tile pairs up to the diagonal: 1 of 1 at T = 128, 3 of 4 at 256, 36 of 64 at 1024.
    #[test]
    fn the_efficient_attention_visits_the_tiles_up_to_the_diagonal() {
        assert_eq!(visited_fraction(100, None), 1.0);
        assert_eq!(visited_fraction(256, None), 0.75);
        assert_eq!(visited_fraction(1024, None), 36.0 / 64.0);
        let eager = Scenario::new(LlamaConfig::smollm2_135m(), 1, 1024);
        let efficient = Scenario {
            attention: AttentionKind::Efficient,
            ..eager.clone()
        };
        let (e, f) = (step_work(&eager), step_work(&efficient));
        let c = &eager.config;
        let scores = 4.0 * 9.0 * 1024.0 * 1024.0 * 64.0 * c.num_hidden_layers as f64;
        let fraction = 36.0 / 64.0;
        assert!((e.forward_flops - f.forward_flops - scores * (1.0 - fraction)).abs() < 1.0);
        let backward_change = 2.0 * scores - 2.5 * scores * fraction;
        assert!((e.backward_flops - f.backward_flops - backward_change).abs() < 1.0);
    }

    /// A discrete GPU's step adds its batch's time on the host link (PCIe 5.0 for the H100:
    /// 63 GB/s), counted from `predict::link` — ids, labels, RoPE tables, the mask, the loss.
    #[test]
    fn the_link_adds_the_batchs_transfer_on_a_discrete_gpu_only() {
        let s = Scenario::new(LlamaConfig::smollm2_135m(), 1, 512);
        let w = step_work(&s);
        let l = super::super::link::step_link(&s).unwrap();
        assert_eq!(w.link_bytes, (l.up() + l.read_back) as f64);
        assert!(w.link_bytes > 1e6); // the [T, T] f32 mask alone is 1 MiB
        let h100 = device_preset("h100").unwrap();
        let r = roofline(&w, 512.0, &h100, false);
        assert!((r.link_seconds - w.link_bytes / 63e9).abs() < 1e-12);
        assert!(
            (r.step_seconds - r.compute_seconds.max(r.memory_seconds) - r.link_seconds).abs()
                < 1e-12
        );
        let m2 = device_preset("m2").unwrap();
        assert_eq!(roofline(&w, 512.0, &m2, false).link_seconds, 0.0);
    }

    /// Full fine-tuning costs the textbook 6·N·tokens for the matmul weights plus attention,
    /// and the backward is twice the forward.
    #[test]
    fn full_fine_tuning_is_six_flops_per_weight_and_token() {
        let s = smollm2();
        let w = step_work(&s);
        let c = &s.config;
        let n = 256.0;
        let weights = (c.num_parameters()
            - 2 * c.hidden_size as u64 * c.num_hidden_layers as u64
            - c.hidden_size as u64) as f64; // all matmul weights (tied head counted once)
        let attention = c.num_hidden_layers as f64 * 4.0 * 9.0 * n * n * 64.0;
        assert!((w.forward_flops - (2.0 * n * weights + attention)).abs() < 1.0);
        assert!((w.backward_flops - 2.0 * w.forward_flops).abs() < 1.0);
        assert_eq!(w.recompute_flops, 0.0);
    }

    /// LoRA drops the frozen weights' gradients (about a third of full fine-tuning's matmul
    /// work), checkpointing adds one forward of the blocks.
    #[test]
    fn lora_saves_the_weight_gradients_and_checkpointing_recomputes() {
        let full = step_work(&smollm2());
        let lora = step_work(&Scenario {
            lora: Some(LoraConfig::default()),
            nf4: Some(Nf4Config::default()),
            ..smollm2()
        });
        let saved = lora.lora_saved_flops / full.flops();
        assert!((0.25..0.34).contains(&saved), "{saved}");
        assert!((full.flops() - lora.flops() - lora.lora_saved_flops).abs() < 1.0);
        let ckpt = step_work(&Scenario {
            checkpointing: true,
            ..smollm2()
        });
        assert!(ckpt.recompute_flops > 0.8 * full.forward_flops);
        assert!(ckpt.recompute_flops < full.forward_flops);
    }

    /// In f32 on an RTX 3090 (ridge ≈ 38 FLOP/byte), a LoRA step over 32 × 128 tokens
    /// (≈ 116 FLOP/byte) is compute-bound; full fine-tuning of two tokens in bf16 on an A100
    /// is all optimizer traffic (memory-bound).
    #[test]
    fn roofline_verdicts() {
        let rtx3090 = device_preset("rtx3090").unwrap();
        let a100 = device_preset("a100-80gb").unwrap();
        let big = Scenario {
            lora: Some(LoraConfig::default()),
            ..Scenario::new(LlamaConfig::smollm2_135m(), 32, 128)
        };
        let r = roofline(&step_work(&big), 32.0 * 128.0, &rtx3090, false);
        assert_eq!(r.bound, Bound::Compute, "{r:?}");
        let one = step_work(&Scenario::new(LlamaConfig::smollm2_135m(), 1, 2));
        let r = roofline(&one, 2.0, &a100, true);
        assert_eq!(r.bound, Bound::Memory, "{r:?}");
        assert!(r.memory_seconds > 10.0 * r.compute_seconds);
    }
}
