//! Mistral's sliding window in the eager attention's mask, against transformers
//! (`tests/corpus/sliding_window`, by its script: a tiny Mistral with a window of 5 and its
//! logits over 16 positions). napkin's logits equal transformers'; without the window they do
//! not (the window bites); the efficient attention and generation, which do not window, refuse
//! the sequence by name.

use std::path::{Path, PathBuf};

use napkin_core::config::AttentionKind;
use napkin_core::device::DeviceKind;
use napkin_core::io::load_hf_llama;
use napkin_core::kernels::values::to_f32_vec;
use napkin_core::model::TokenBatch;
use napkin_core::model::generate::KvCache;
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
    assert!(model.check_positions(ids.len()).is_ok());
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

    model.attention = AttentionKind::Efficient;
    let refused = model.check_positions(ids.len()).unwrap_err().to_string();
    assert!(refused.contains("sliding window of 5"), "{refused}");
    let mut cache = KvCache::default();
    let refused = model
        .next_token_logits(&ids, &mut cache)
        .unwrap_err()
        .to_string();
    assert!(refused.contains("16 positions"), "{refused}");
}
