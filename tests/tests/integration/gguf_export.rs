//! GGUF export: a LoRA-merged fixture model written as F32 GGUF loads back to the same logits
//! bit for bit (names, Q/K permutation, shapes and metadata all right) with a tokenizer that
//! tokenizes as the original; each weight type decodes to its quantizer's blocks, every value
//! within the error its block's scales allow; the tensors' types follow the row lengths. (The
//! quantized engine with adapters: quantized_adapters.rs.)

use napkin_core::config::LlamaConfig;
use napkin_core::device::DeviceKind;
use napkin_core::export::write_gguf_file;
use napkin_core::io::gguf::GgufFile;
use napkin_core::io::gguf::dequant::GgmlType;
use napkin_core::io::gguf::export::{GgufQuant, export_gguf};
use napkin_core::io::{load_hf_llama, load_model};
use napkin_core::kernels::values::to_f32_vec;
use napkin_core::model::Llama;
use napkin_core::tokenizer::TextTokenizer;
use napkin_tests::{Reference, fixture_root, input_batch, model_dirs};

fn scratch(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("napkin-export-{}-{name}", std::process::id()))
}

#[test]
fn an_exported_f32_gguf_loads_to_the_merged_model_with_its_tokenizer() {
    let tokenizer =
        TextTokenizer::from_file(&fixture_root().join("tokenizer/tokenizer.json")).unwrap();
    for dir in model_dirs() {
        let reference = Reference::open(&dir);
        let (batch, _) = input_batch(&reference);
        let device = DeviceKind::Cpu.open().unwrap();
        let (model, _) = load_hf_llama(&dir, &device)
            .unwrap()
            .load_lora(&dir.join("lora"))
            .unwrap();
        let (merged, _) = model.clone().merge_lora();
        let path = scratch(&format!("{}.gguf", reference.name));
        write_gguf_file(&model, &tokenizer, &path, GgufQuant::F32, true).unwrap();
        let loaded = load_model(&path, &device).unwrap();
        assert_eq!(
            loaded.config.num_key_value_heads,
            merged.config.num_key_value_heads
        );
        assert_eq!(
            to_f32_vec(loaded.forward(&batch)),
            to_f32_vec(merged.forward(&batch)),
            "{}",
            reference.name
        );
        let back = TextTokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
        for text in ["Hello, world!", "naïve café 123 456", "a  b\n\nc\t🦀"] {
            assert_eq!(back.encode(text).unwrap(), tokenizer.encode(text).unwrap());
        }
        std::fs::remove_file(&path).ok();
    }
}

/// A block's stored f16 scale at `at`.
fn f16_at(block: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([block[at], block[at + 1]]).to_f32()
}

/// How far one decoded value may be from its source, from the block's own scales.
/// - F16: half an f16 ULP.
/// - Q8_0 (d = max|w|/127, q = round(w/d), ŵ = q·d₁₆): half a step, plus the f16 rounding of d
///   times |q| ≤ 127.
/// - Q4_0 (d = w_max/−8 for the value of largest magnitude, q = min(15, ⌊w/d + 8.5⌋),
///   ŵ = (q − 8)·d₁₆): one step (the value opposite the largest is clamped from level 8 to 7),
///   plus the f16 rounding of d times |q − 8| ≤ 8.
/// - Q4_K, Q5_K and Q6_K: the nearest of the group's levels, as its stored scales express them
///   ([`k_levels`]; llama.cpp's quantizers round each value against the stored scales).
///
/// Each bound has a relative slack of 2⁻¹⁸ for the f32 products and sums on both sides.
fn bounds(ty: GgmlType, source: &[f32], blocks: &[u8]) -> Vec<f32> {
    let slack = |x: f32| x * 2f32.powi(-18);
    let amax = |b: &[f32]| b.iter().fold(0f32, |m, v| m.max(v.abs()));
    match ty {
        GgmlType::F16 => source
            .iter()
            .map(|w| w.abs() * 2f32.powi(-11) + 2f32.powi(-25))
            .collect(),
        GgmlType::Q8_0 | GgmlType::Q4_0 => {
            let (bytes, per) = if ty == GgmlType::Q8_0 {
                (34, 32)
            } else {
                (18, 32)
            };
            source
                .chunks(per)
                .zip(blocks.chunks(bytes))
                .flat_map(|(w, b)| {
                    let m = amax(w);
                    let stored = f16_at(b, 0).abs();
                    let bound = if ty == GgmlType::Q8_0 {
                        let d = m / 127.0;
                        0.5 * d + 127.0 * (d - stored).abs()
                    } else {
                        let d = m / 8.0;
                        d + 8.0 * (d - stored).abs()
                    };
                    std::iter::repeat_n(bound + slack(m), w.len())
                })
                .collect()
        }
        GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K => {
            let bytes = ty.block().unwrap().1 as usize;
            source
                .chunks(256)
                .zip(blocks.chunks(bytes))
                .flat_map(|(w, b)| {
                    k_levels(ty, b)
                        .into_iter()
                        .zip(w)
                        .map(|(levels, &x)| {
                            let nearest = levels
                                .iter()
                                .map(|l| (x - l).abs())
                                .fold(f32::INFINITY, f32::min);
                            let widest = levels.iter().fold(0f32, |m, l| m.max(l.abs()));
                            nearest + slack(widest.max(x.abs()))
                        })
                        .collect::<Vec<_>>()
                })
                .collect()
        }
        other => panic!("no bound for {other:?}"),
    }
}

/// The levels a K-quant super-block can express for each of its 256 values, from its stored
/// scales: d·sc·q − dmin·m per group of 32 (Q4_K: q < 16, Q5_K: q < 32; the 6-bit sc and m as
/// ggml's `get_scale_min_k4` unpacks them), d·sc·(q − 32) per group of 16 (Q6_K, q < 64).
fn k_levels(ty: GgmlType, b: &[u8]) -> Vec<Vec<f32>> {
    let values = |group: usize, levels: Vec<f32>| std::iter::repeat_n(levels, group);
    match ty {
        GgmlType::Q6K => {
            let d = f16_at(b, 208);
            (0..16)
                .flat_map(|g| {
                    let step = d * (b[192 + g] as i8) as f32;
                    values(16, (0..64).map(|q| step * (q - 32) as f32).collect())
                })
                .collect()
        }
        _ => {
            let top = if ty == GgmlType::Q4K { 16 } else { 32 };
            let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
            let s = &b[4..16];
            (0..8)
                .flat_map(|g| {
                    let (sc, m) = if g < 4 {
                        (s[g] & 63, s[g + 4] & 63)
                    } else {
                        (
                            (s[g + 4] & 0x0f) | ((s[g - 4] >> 6) << 4),
                            (s[g + 4] >> 4) | ((s[g] >> 6) << 4),
                        )
                    };
                    let (step, offset) = (d * sc as f32, dmin * m as f32);
                    values(32, (0..top).map(|q| step * q as f32 - offset).collect())
                })
                .collect()
        }
    }
}

/// Each weight type's export, tensor by tensor: its type follows the row length, the file
/// decodes to exactly what napkin's quantizer makes of the weight (the Q8_0 and Q4_0 quantizers
/// are llama.cpp's reference ones bit for bit, and every reader gguf-py's: gguf_files.rs), and
/// every value is within its quantization error, derived from its block's own scales
/// ([`bounds`]). The weights in GGUF order (Q/K permuted) come from the F32 export of the same
/// model, which loads to the same logits bit for bit (the test above).
#[test]
fn each_weight_type_loads_within_its_quantization_error() {
    use napkin_core::io::gguf::quantize::quantize;
    let device = DeviceKind::Cpu.open().unwrap();
    // D = 256 (whole Q4_K blocks), F = 688 (down_proj's rows are not whole blocks of 32).
    let model = Llama::init(&LlamaConfig::small(), &device);
    let source_path = scratch("small-F32.gguf");
    export_gguf(
        &model,
        Vec::new(),
        &source_path,
        GgufQuant::F32,
        false,
        "small",
    )
    .unwrap();
    let source = GgufFile::open(&source_path).unwrap();
    let mut report = Vec::new();
    for (quant, two_d) in [
        (GgufQuant::F16, GgmlType::F16),
        (GgufQuant::Q8_0, GgmlType::Q8_0),
        (GgufQuant::Q4_0, GgmlType::Q4_0),
        (GgufQuant::Q4KS, GgmlType::Q4K),
        (GgufQuant::Q4KM, GgmlType::Q4K),
        (GgufQuant::Q5KS, GgmlType::Q5K),
        (GgufQuant::Q5KM, GgmlType::Q5K),
        (GgufQuant::Q6K, GgmlType::Q6K),
    ] {
        let path = scratch(&format!("small-{quant:?}.gguf"));
        export_gguf(&model, Vec::new(), &path, quant, false, "small").unwrap();
        let gguf = GgufFile::open(&path).unwrap();
        let type_of = |name: &str| gguf.tensors[name].ggml_type;
        assert_eq!(type_of("blk.0.attn_q.weight"), two_d, "{quant:?}");
        assert_eq!(type_of("blk.0.attn_norm.weight"), GgmlType::F32);
        // 688 values a row are not whole blocks of 32 (nor 256): f16 whatever was asked.
        assert_eq!(type_of("blk.0.ffn_down.weight"), GgmlType::F16, "{quant:?}");
        assert_eq!(
            gguf.tensors.keys().collect::<Vec<_>>(),
            source.tensors.keys().collect::<Vec<_>>()
        );
        let (mut worst, mut values) = (0f32, 0usize);
        for (name, info) in &gguf.tensors {
            let (shape, want) = source.read_f32(name).unwrap();
            let (got_shape, got) = gguf.read_f32(name).unwrap();
            assert_eq!(got_shape, shape, "{quant:?} {name}");
            if info.ggml_type == GgmlType::F32 {
                assert_eq!(got, want, "{quant:?} {name}");
                continue;
            }
            let blocks = gguf.tensor_bytes(info);
            let requantized = quantize(info.ggml_type, &want).unwrap();
            assert!(
                blocks == requantized.as_slice(),
                "{quant:?} {name}: the file's blocks are not the quantizer's"
            );
            for (i, ((g, w), bound)) in got
                .iter()
                .zip(&want)
                .zip(bounds(info.ggml_type, &want, blocks))
                .enumerate()
            {
                let error = (g - w).abs();
                assert!(
                    error <= bound,
                    "{quant:?} {name} [{i}]: {w} decoded as {g}, off by {error:e} (bound {bound:e})"
                );
                worst = worst.max(error / bound);
            }
            values += got.len();
        }
        report.push(format!(
            "{quant:?} worst {worst:.3} of its bound ({values} values)"
        ));
        std::fs::remove_file(&path).ok();
    }
    std::fs::remove_file(&source_path).ok();
    eprintln!("quantization error by type: {}", report.join(", "));
}

#[test]
fn the_quantized_engine_follows_the_float_model_on_every_weight_type() {
    use napkin_core::io::gguf::load_gguf_quantized;
    use napkin_core::kernels::cpu::quantized::{ActivationBits, BlockFormat};
    use napkin_core::model::generate::{KvCache, NextToken};
    use napkin_core::model::quantized_llama::QuantizedKvCache;
    let device = DeviceKind::Cpu.open().unwrap();
    device.seed(12);
    let model = Llama::init(&LlamaConfig::small(), &device);
    let ids: Vec<u32> = (0..24).map(|i| (i * 53 % 4096) as u32).collect();
    // Measured on this random model (largest logit gap over the largest logit): 16 bits 3.8e-5
    // (Q8_0; Q4_0, whose head is Q6_K), 5.3e-5 (Q4_K_M), 4.5e-5 (Q5_K_M), 4.4e-5 (Q6_K); 8 bits
    // 1.0e-2 (Q8_0), 1.2e-2 (Q4_0), 1.25e-2 (Q4_K_M), 1.2e-2 (Q5_K_M), 1.1e-2 (Q6_K). Bounds
    // about twice those.
    let bound = |bits: ActivationBits| match bits {
        ActivationBits::Sixteen => 1e-4,
        ActivationBits::Eight => 2.5e-2,
    };
    // Held as: Q4_0/Q8_0 and the K-quants their own blocks, F16 (and the 688-wide ffn_down rows
    // every export writes as F16) as f32.
    for (quant, kept) in [
        (GgufQuant::F16, BlockFormat::F32),
        (GgufQuant::Q8_0, BlockFormat::Q8_0),
        (GgufQuant::Q4_0, BlockFormat::Q4_0),
        (GgufQuant::Q4KM, BlockFormat::Q4K),
        (GgufQuant::Q5KM, BlockFormat::Q5K),
        (GgufQuant::Q6K, BlockFormat::Q6K),
    ] {
        let path = scratch(&format!("engine-{quant:?}.gguf"));
        export_gguf(&model, Vec::new(), &path, quant, false, "small").unwrap();
        let gguf = GgufFile::open(&path).unwrap();
        let loaded = load_gguf_quantized(&gguf).unwrap();
        let float = load_model(&path, &device).unwrap();
        let counts = loaded.format_counts();
        assert!(
            counts.iter().any(|&(f, n)| f == kept && n > 0),
            "{quant:?}: {counts:?}"
        );
        for bits in [ActivationBits::Sixteen, ActivationBits::Eight] {
            let bound = bound(bits);
            let quantized = loaded.clone().with_activation_bits(bits);
            let (mut qc, mut fc) = (QuantizedKvCache::default(), KvCache::default());
            let mut worst = 0.0f32;
            for (t, id) in ids.iter().enumerate() {
                let q = NextToken::next_token_logits(&quantized, &[*id], &mut qc).unwrap();
                let f = NextToken::next_token_logits(&float, &[*id], &mut fc).unwrap();
                let gap = q
                    .iter()
                    .zip(&f)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f32::max);
                let scale = f.iter().map(|v| v.abs()).fold(0.0, f32::max);
                worst = worst.max(gap / scale);
                let top = |l: &[f32]| (0..l.len()).max_by(|&a, &b| l[a].total_cmp(&l[b])).unwrap();
                if quant == GgufQuant::F16 {
                    // Nothing is rounded but the activations: f32 rows take f32 activations.
                    assert!(
                        gap / scale < 1e-5,
                        "{quant:?} position {t}: {}",
                        gap / scale
                    );
                    assert_eq!(top(&q), top(&f));
                }
            }
            eprintln!("{quant:?} {bits:?}: largest logit gap {worst:.2e} of the largest logit");
            assert!(
                worst < bound,
                "{quant:?} {bits:?}: logits off by {worst} of the largest"
            );
        }
        std::fs::remove_file(&path).ok();
    }
}
