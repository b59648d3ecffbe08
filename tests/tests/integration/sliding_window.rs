//! Mistral's sliding window in the eager attention's mask, against transformers
//! (`tests/corpus/sliding_window`, by its script: a tiny Mistral with a window of 5 and its
//! logits over 16 positions). napkin's logits equal transformers'; without the window they do
//! not (the window bites); the efficient attention, generation's KV cache and the quantized
//! engine give them too.

use std::path::{Path, PathBuf};

use napkin_core::config::AttentionKind;
use napkin_core::device::DeviceKind;
use napkin_core::io::load_hf_llama;
use napkin_core::kernels::values::to_f32_vec;
use napkin_core::model::TokenBatch;
use napkin_core::model::generate::KvCache;
use napkin_core::model::quantized_llama::{QuantizedKvCache, QuantizedLlama};
use napkin_tests::{Reference, relative_gap};

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/sliding_window")
}

#[test]
fn the_eager_attention_applies_mistrals_window_as_transformers_does() {
    let reference = Reference::open_file(&corpus().join("reference.safetensors"));
    let (_, ids) = reference.i64("input_ids");
    let (_, want) = reference.f32("logits");
    let ids: Vec<u32> = ids.iter().map(|&i| i as u32).collect();
    let device = DeviceKind::Cpu.open().unwrap();
    let mut model = load_hf_llama(&corpus().join("hf"), &device).unwrap();
    assert_eq!(model.config.sliding_window, Some(5));
    let batch = TokenBatch::single(&ids).unwrap();
    let windowed = relative_gap(&to_f32_vec(model.forward(&batch)), &want);

    let mut unwindowed = model.clone();
    unwindowed.config.sliding_window = None;
    let full = relative_gap(&to_f32_vec(unwindowed.forward(&batch)), &want);
    eprintln!(
        "16 positions, window 5: logits {windowed:.1e} of their scale off transformers'; \
         without the window {full:.1e}"
    );
    assert!(windowed <= 1e-5, "{windowed:e}");
    assert!(full > 1e-2, "the window changes the logits: {full:e}");

    // The efficient attention windows its tiles: the same logits.
    model.attention = AttentionKind::Efficient;
    let efficient = relative_gap(&to_f32_vec(model.forward(&batch)), &want);
    eprintln!("efficient attention: {efficient:.1e}");
    assert!(efficient <= 1e-5, "{efficient:e}");

    // Generation, a prompt of 3 then one token at a time: each position's logits are
    // transformers' row for it, the float model's KV cache and the quantized engine's alike.
    let vocab = model.config.vocab_size;
    let row = |t: usize| &want[t * vocab..(t + 1) * vocab];
    let quantized = QuantizedLlama::from_llama(model.clone()).unwrap();
    let (mut cache, mut quantized_cache) = (KvCache::default(), QuantizedKvCache::default());
    let (mut float_worst, mut quantized_worst) = (0f32, 0f32);
    for (start, end) in std::iter::once((0, 3)).chain((3..ids.len()).map(|t| (t, t + 1))) {
        let new = &ids[start..end];
        let float = model.next_token_logits(new, &mut cache).unwrap();
        let engine = quantized
            .next_token_logits(new, &mut quantized_cache)
            .unwrap();
        float_worst = float_worst.max(relative_gap(&float, row(end - 1)));
        quantized_worst = quantized_worst.max(relative_gap(&engine, row(end - 1)));
    }
    eprintln!(
        "generation over 16 positions: float {float_worst:.1e}, quantized engine {quantized_worst:.1e}"
    );
    assert!(float_worst <= 1e-5, "{float_worst:e}");
    assert!(quantized_worst <= 1e-5, "{quantized_worst:e}");
}
