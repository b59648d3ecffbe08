//! What loading a model for training puts on a CUDA device, allocation by allocation, as
//! transformers, bitsandbytes and peft do it — the first part of a process whose reserved bytes
//! `device_process.rs` replays.
//!
//! Read off the allocator's own history of `measure.py`'s processes (`tests/corpus/
//! pytorch_profile/allocator/`, transformers 5.17, bitsandbytes 0.50, peft 0.21):
//! - a 16- or 32-bit model is loaded on the CPU and moved with `.to("cuda")`, which copies each
//!   parameter and buffer in module order (embedding; per layer q, k, v, o, gate, up, down and
//!   the two norms; the final norm; the rotary tables; the head);
//! - a 4-bit model is loaded straight to the device (`device_map`) in the checkpoint's key order
//!   (sorted names, so layer 10 comes before layer 2). transformers first takes and frees one
//!   block the size of everything it will load (`caching_allocator_warmup`, releases since
//!   2025), so the weights land in one segment. Each 4-bit weight arrives in the loading dtype,
//!   bitsandbytes quantizes it (codes, absmax, with double quantization the absmax's own codes
//!   and scales, a few small tables) and frees it. peft's `prepare_model_for_kbit_training`
//!   ends with `empty_cache()` (releases since 2025);
//! - peft then adds each adapter's A and B in the base layer's dtype (the compute dtype under
//!   bitsandbytes) and casts them to f32 one by one (TRL's `DPOTrainer` then casts a quantized
//!   model's to bf16, one by one).
//!
//! Spring 2024's releases (`Stack::SPRING_2024`, from their sources, not measured): no warm-up
//! block and no `empty_cache()`; transformers 4's bitsandbytes quantizer loaded in f16 when no
//! dtype was given, and `prepare_model_for_kbit_training` then cast the other parameters to f32.
//! The current releases load a 4-bit model in the checkpoint's dtype; this takes it to be
//! `setup.dtype` (the fixtures' checkpoints are f32).

use super::tape::Allocation;
use super::{Method, PyTorchSetup, TorchDtype};
use crate::config::{LlamaConfig, LoraTarget};

/// Ids of the load's blocks start here (a step's ids are far below).
pub const LOAD_IDS: usize = usize::MAX / 4;

/// One step of the load: an allocation, a free, or `empty_cache()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadEvent {
    /// An allocation or a free.
    Block(Allocation),
    /// `torch.cuda.empty_cache()`.
    EmptyCache,
}

/// A decoder layer's weights in module order: (projection, out features, in features).
fn layer_linears(config: &LlamaConfig) -> [(LoraTarget, u64, u64); 7] {
    let (d, f) = (config.hidden_size as u64, config.intermediate_size as u64);
    let (q, kv) = (config.q_dim() as u64, config.kv_dim() as u64);
    [
        (LoraTarget::QProj, q, d),
        (LoraTarget::KProj, kv, d),
        (LoraTarget::VProj, kv, d),
        (LoraTarget::OProj, d, q),
        (LoraTarget::GateProj, f, d),
        (LoraTarget::UpProj, f, d),
        (LoraTarget::DownProj, d, f),
    ]
}

/// Where the allocations go, with ids handed out in order.
struct Recorder {
    events: Vec<LoadEvent>,
    next: usize,
}

impl Recorder {
    fn malloc(&mut self, bytes: u64) -> (usize, u64) {
        self.next += 1;
        let id = LOAD_IDS + self.next;
        self.events
            .push(LoadEvent::Block(Allocation::Malloc { id, bytes }));
        (id, bytes)
    }

    fn free(&mut self, (id, bytes): (usize, u64)) {
        self.events
            .push(LoadEvent::Block(Allocation::Free { id, bytes }));
    }
}

/// The load of `config` for `setup`'s method, then peft's adapters, in `setup.stack`'s
/// releases.
pub fn load_events(config: &LlamaConfig, setup: &PyTorchSetup) -> Vec<LoadEvent> {
    let mut r = Recorder {
        events: vec![],
        next: 0,
    };
    let w = setup.dtype.bytes();
    let (d, vocab) = (config.hidden_size as u64, config.vocab_size as u64);
    let rotary = (config.head_dim / 2) as u64 * 4;
    match setup.method {
        Method::Full | Method::Lora => {
            r.malloc(vocab * d * w);
            for _ in 0..config.num_hidden_layers {
                for (_, out, fan_in) in layer_linears(config) {
                    r.malloc(out * fan_in * w);
                }
                r.malloc(d * w);
                r.malloc(d * w);
            }
            r.malloc(d * w);
            r.malloc(rotary);
            r.malloc(rotary);
            if !config.tie_word_embeddings {
                r.malloc(vocab * d * w);
            }
        }
        Method::QLora {
            double_quant,
            block_size,
            ..
        } => {
            // transformers 4's bitsandbytes quantizer loaded in f16 when no dtype was given;
            // later releases load the checkpoint's dtype (`setup.dtype`: the fixtures' models
            // are f32).
            let w = if setup.stack.bnb_loads_in_f16 {
                TorchDtype::F16.bytes()
            } else {
                w
            };
            let values: u64 = layer_linears(config)
                .iter()
                .map(|(_, out, fan_in)| out * fan_in)
                .sum::<u64>()
                * config.num_hidden_layers as u64;
            let tables = if config.tie_word_embeddings { 1 } else { 2 };
            let dense = (tables * vocab * d + (2 * config.num_hidden_layers as u64 + 1) * d) * w;
            if setup.stack.allocator_warmup {
                let block = r.malloc(values / 2 + dense);
                r.free(block);
            }
            let head = (!config.tie_word_embeddings).then(|| r.malloc(vocab * d * w));
            let embedding = r.malloc(vocab * d * w);
            let linears = layer_linears(config);
            let values_of = |t: LoraTarget| {
                let (_, out, fan_in) = linears
                    .iter()
                    .find(|(target, _, _)| *target == t)
                    .expect("every projection");
                out * fan_in
            };
            let mut norms = vec![];
            // Every layer's keys come in the same order (and layer 10 before layer 2, which
            // changes no size): input_layernorm, mlp.{down,gate,up}, post_attention_layernorm,
            // self_attn.{k,o,q,v}.
            for _ in 0..config.num_hidden_layers {
                norms.push(r.malloc(d * w));
                for t in [
                    LoraTarget::DownProj,
                    LoraTarget::GateProj,
                    LoraTarget::UpProj,
                ] {
                    quantize(&mut r, values_of(t), w, block_size, double_quant);
                }
                norms.push(r.malloc(d * w));
                for t in [
                    LoraTarget::KProj,
                    LoraTarget::OProj,
                    LoraTarget::QProj,
                    LoraTarget::VProj,
                ] {
                    quantize(&mut r, values_of(t), w, block_size, double_quant);
                }
            }
            let final_norm = r.malloc(d * w);
            r.malloc(rotary);
            r.malloc(rotary);
            // prepare_model_for_kbit_training: each 16-bit parameter that is not 4-bit to f32,
            // in `model.parameters()` order, the new tensor made before the old one goes.
            if setup.kbit_prepared() && w != 4 {
                let dense = std::iter::once(embedding)
                    .chain(norms)
                    .chain([final_norm])
                    .chain(head);
                for block in dense {
                    r.malloc(block.1 / w * 4);
                    r.free(block);
                }
            }
            if setup.kbit_prepared() && setup.stack.kbit_prepare_empties_cache {
                r.events.push(LoadEvent::EmptyCache);
            }
        }
    }
    if let Some(lora) = &setup.lora {
        let made_in = match setup.method {
            Method::QLora { .. } => setup.compute_dtype,
            _ => setup.dtype,
        };
        let rank = lora.r as u64;
        let mut adapters = vec![];
        for _ in 0..config.num_hidden_layers {
            for (target, out, fan_in) in layer_linears(config) {
                if lora.targets.contains(&target) {
                    adapters.push(r.malloc(rank * fan_in * made_in.bytes()));
                    adapters.push(r.malloc(out * rank * made_in.bytes()));
                }
            }
        }
        if made_in != TorchDtype::F32 {
            adapters = adapters
                .into_iter()
                .map(|block| {
                    let cast = r.malloc(block.1 / made_in.bytes() * 4);
                    r.free(block);
                    cast
                })
                .collect();
        }
        // TRL's DPOTrainer then casts a quantized model's adapters to bf16, one by one.
        if setup.adapter_bytes() == 2 {
            for block in adapters {
                r.malloc(block.1 / 2);
                r.free(block);
            }
        }
    }
    r.events
}

/// bitsandbytes quantizing one weight of `values` that arrived in `w` bytes a value.
fn quantize(r: &mut Recorder, values: u64, w: u64, block_size: u64, double_quant: bool) {
    let blocks = values.div_ceil(block_size);
    let weight = r.malloc(values * w);
    let absmax = r.malloc(blocks * 4);
    r.malloc(values.div_ceil(2)); // the codes
    r.malloc(64); // the 16-value code table
    let scratch = [r.malloc(64), r.malloc(4)];
    scratch.into_iter().for_each(|b| r.free(b));
    if double_quant {
        r.malloc(4); // the absmax's offset
        let scratch = [r.malloc(88), r.malloc(4)];
        scratch.into_iter().rev().for_each(|b| r.free(b));
        let centred = r.malloc(blocks * 4);
        r.malloc(1024); // the 8-bit code table
        r.malloc(blocks.div_ceil(256) * 4); // second-level scales
        r.malloc(blocks); // the absmax's codes
        r.malloc(1024);
        r.free(centred);
        r.free(absmax);
    }
    r.free(weight);
}
