//! A GGUF loaded for generation with its blocks kept reads them in place from the file's map:
//! the heap holds no copy of them, neither while loading nor after.

use napkin_core::io::gguf::export::{GgufQuant, export_gguf};
use napkin_core::io::gguf::{GgufFile, load_gguf_quantized};

use super::*;

#[test]
fn a_gguf_loaded_with_its_blocks_kept_holds_no_copy_of_them() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    assert!(is_installed());
    // Every matrix a whole number of blocks (small()'s 688-wide rows would be kept as f32).
    let config = LlamaConfig {
        intermediate_size: 768,
        ..LlamaConfig::small()
    };
    let path = std::env::temp_dir().join(format!("napkin-mapped-{}.gguf", std::process::id()));
    export_gguf(
        &build(&config, None, false),
        Vec::new(),
        &path,
        GgufQuant::Q8_0,
        false,
        "mapped",
    )
    .unwrap();

    let before = live_bytes();
    reset_peak();
    let gguf = GgufFile::open(&path).unwrap();
    let model = load_gguf_quantized(&gguf).unwrap();
    drop(gguf);
    let held = live_bytes().saturating_sub(before);
    let load_peak = peak_bytes().saturating_sub(before);
    let blocks = model.resident_bytes();
    eprintln!(
        "blocks {}, heap held by the loaded model {}, heap peak while loading {}",
        mib(blocks as f64),
        mib(held as f64),
        mib(load_peak as f64)
    );
    // What the heap may hold: the f32 norms and the Q/K row orders (0.03 MiB measured here,
    // 0.04 at the loading peak). A copy of the blocks (5.3 MiB) held 5.34 MiB.
    assert!(
        held * 20 < blocks && load_peak * 20 < blocks,
        "held {held} B, peak {load_peak} B for {blocks} B of blocks"
    );

    // The model still reads the file after its `GgufFile` is gone: a token's logits are finite.
    use napkin_core::model::quantized_llama::QuantizedKvCache;
    let logits = model
        .next_token_logits(&[1, 2, 3], &mut QuantizedKvCache::default())
        .unwrap();
    assert!(logits.len() == config.vocab_size && logits.iter().all(|v| v.is_finite()));
    drop(model);
    std::fs::remove_file(&path).ok();
}
