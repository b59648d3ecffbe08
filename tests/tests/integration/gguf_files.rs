//! GGUF loading on synthetic files made from the fixture models: llama.cpp names and the Q/K
//! permutation give back the HF model exactly; malformed files are typed errors.

use napkin_core::Error;
use napkin_core::config::LlamaConfig;
use napkin_core::device::DeviceKind;
use napkin_core::io::SafetensorsCheckpoint;
use napkin_core::io::gguf::llama::{gguf_name, permute_rows};
use napkin_core::io::{load_hf_llama, load_model};
use napkin_core::kernels::values::to_f32_vec;
use napkin_core::model::TokenBatch;
use napkin_tests::{GgufTestValue, ONE_MODEL, model_dir, model_dirs, write_gguf};

/// The fixture model as llama.cpp's converter would write it (F32): arch `llama` with Q and K
/// rows permuted, or a Qwen2 / Qwen3 as arch `qwen2` / `qwen3` with HF's rows (what its
/// converter does, checked against the converter's own files in families.rs).
pub(crate) fn fixture_as_gguf(dir: &std::path::Path, path: &std::path::Path) {
    let config = LlamaConfig::from_hf_file(&dir.join("config.json")).unwrap();
    let ckpt = SafetensorsCheckpoint::open(dir).unwrap();
    let arch = match (config.qkv_bias, config.qk_norm) {
        (true, _) => "qwen2",
        (_, true) => "qwen3",
        _ => "llama",
    };
    let tensors: Vec<(String, Vec<usize>, Vec<f32>)> = config
        .hf_parameter_shapes()
        .into_iter()
        .map(|(hf, shape)| {
            let values = ckpt.read_f32(&hf, &shape).unwrap();
            let values = if arch != "llama" {
                values
            } else if hf.ends_with("q_proj.weight") {
                permute_rows(&values, config.num_attention_heads, shape[1])
            } else if hf.ends_with("k_proj.weight") {
                permute_rows(&values, config.num_key_value_heads, shape[1])
            } else {
                values
            };
            (gguf_name(&hf).unwrap(), shape, values)
        })
        .collect();
    use GgufTestValue::{F32, Str, U32};
    let metadata = [
        ("general.architecture".to_string(), Str(arch.into())),
        (
            format!("{arch}.embedding_length"),
            U32(config.hidden_size as u32),
        ),
        (
            format!("{arch}.feed_forward_length"),
            U32(config.intermediate_size as u32),
        ),
        (
            format!("{arch}.block_count"),
            U32(config.num_hidden_layers as u32),
        ),
        (
            format!("{arch}.attention.head_count"),
            U32(config.num_attention_heads as u32),
        ),
        (
            format!("{arch}.attention.head_count_kv"),
            U32(config.num_key_value_heads as u32),
        ),
        (
            format!("{arch}.rope.freq_base"),
            F32(config.rope_theta as f32),
        ),
        (
            format!("{arch}.attention.layer_norm_rms_epsilon"),
            F32(config.rms_norm_eps as f32),
        ),
        (
            format!("{arch}.context_length"),
            U32(config.max_position_embeddings as u32),
        ),
        (format!("{arch}.vocab_size"), U32(config.vocab_size as u32)),
        // The head width, which Qwen3's is not D / H.
        (
            format!("{arch}.attention.key_length"),
            U32(config.head_dim as u32),
        ),
        (
            format!("{arch}.attention.value_length"),
            U32(config.head_dim as u32),
        ),
    ];
    let metadata: Vec<(&str, GgufTestValue)> = metadata
        .iter()
        .map(|(key, value)| (key.as_str(), value.clone()))
        .collect();
    write_gguf(path, &metadata, &tensors);
}

#[test]
fn gguf_of_a_fixture_model_loads_to_the_same_logits() {
    let device = DeviceKind::Cpu.open().unwrap();
    let batch = TokenBatch::single(&[5, 3, 8, 1, 9, 2]).unwrap();
    for dir in model_dirs() {
        let path = std::env::temp_dir().join(format!(
            "napkin-{}-{}.gguf",
            std::process::id(),
            dir.display().to_string().len()
        ));
        fixture_as_gguf(&dir, &path);
        let from_gguf = to_f32_vec(load_model(&path, &device).unwrap().forward(&batch));
        let from_hf = to_f32_vec(load_hf_llama(&dir, &device).unwrap().forward(&batch));
        assert_eq!(from_gguf, from_hf, "{}", dir.display());
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn malformed_gguf_files_are_typed_errors() {
    let device = DeviceKind::Cpu.open().unwrap();
    let dir = &model_dir(ONE_MODEL);
    let path = std::env::temp_dir().join(format!("napkin-bad-{}.gguf", std::process::id()));
    fixture_as_gguf(dir, &path);
    let good = std::fs::read(&path).unwrap();
    let expect_error = |bytes: &[u8], what: &str, needles: &[&str]| {
        std::fs::write(&path, bytes).unwrap();
        match load_model(&path, &device) {
            Err(Error::Checkpoint { message, .. }) => {
                assert!(
                    needles.iter().any(|n| message.contains(n)),
                    "{what}: {message}"
                )
            }
            other => panic!(
                "{what}: expected a Checkpoint error, got {:?}",
                other.map(|_| "a model")
            ),
        }
    };
    // Cut in the header: "truncated" or a count that "cannot fit"; cut in the data: a tensor's bytes
    // "lie outside the data section".
    for cut in [0, 3, 10, 24, 100, good.len() / 2, good.len() - 1] {
        expect_error(
            &good[..cut],
            &format!("truncated at {cut}"),
            &["truncated", "cannot fit", "outside the"],
        );
    }
    let mut bad = good.clone();
    bad[0] = b'X';
    expect_error(&bad, "wrong magic", &["not a GGUF file"]);
    let mut bad = good.clone();
    bad[4..8].copy_from_slice(&7u32.to_le_bytes());
    expect_error(&bad, "wrong version", &["version 7"]);
    let mut bad = good.clone();
    bad[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    expect_error(&bad, "absurd tensor count", &["cannot fit"]);
    std::fs::remove_file(&path).unwrap();
}

/// One type's seeded random blocks and gguf-py's dequantization of them
/// (`tests/corpus/ggml/make_reference.py`).
fn gguf_py_oracle(name: &str) -> (Vec<u8>, Vec<f32>) {
    let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/ggml");
    let blocks = std::fs::read(corpus.join(format!("{name}.blocks"))).unwrap();
    let expected = std::fs::read(corpus.join(format!("{name}.f32")))
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    (blocks, expected)
}

/// Fails unless `got` equals gguf-py's `expected` bit for bit, naming the first difference.
fn assert_bit_for_bit(name: &str, got: &[f32], expected: &[f32]) {
    let differ = |(a, b): &(&f32, &f32)| a.to_bits() != b.to_bits();
    let count = got.iter().zip(expected).filter(differ).count();
    let first = got.iter().zip(expected).find(differ);
    assert_eq!(
        (got.len(), count),
        (expected.len(), 0),
        "{name}: {count} of {} values differ; first (napkin, gguf-py): {first:?}",
        expected.len()
    );
}

/// Every ggml type napkin dequantizes, against gguf-py (llama.cpp's Python reader, from PyPI)
/// on seeded random blocks: bit for bit.
#[test]
fn ggml_dequantization_equals_gguf_py() {
    use napkin_core::io::gguf::dequant::GgmlType;
    for (name, id) in [
        ("Q4_0", 2),
        ("Q4_1", 3),
        ("Q5_0", 6),
        ("Q5_1", 7),
        ("Q8_0", 8),
        ("Q2_K", 10),
        ("Q3_K", 11),
        ("Q4_K", 12),
        ("Q5_K", 13),
        ("Q6_K", 14),
    ] {
        let (blocks, expected) = gguf_py_oracle(name);
        let ty = GgmlType::from_id(id).unwrap();
        let got = ty
            .dequantize(&blocks, expected.len())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_bit_for_bit(name, &got, &expected);
    }
}

/// The generation kernels' own dequantization of the block formats they keep (the products are
/// checked against it in `kernels::cpu::quantized`), against the same gguf-py oracle: bit for bit.
#[test]
fn kept_block_formats_dequantize_as_gguf_py() {
    use napkin_core::kernels::cpu::quantized::{BlockFormat, QuantizedMatrix};
    for (name, format) in [
        ("Q4_0", BlockFormat::Q4_0),
        ("Q4_1", BlockFormat::Q4_1),
        ("Q8_0", BlockFormat::Q8_0),
        ("Q4_K", BlockFormat::Q4K),
        ("Q5_K", BlockFormat::Q5K),
        ("Q6_K", BlockFormat::Q6K),
    ] {
        let (blocks, expected) = gguf_py_oracle(name);
        let matrix = QuantizedMatrix::new(format, 1, expected.len(), blocks)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut got = vec![0.0f32; expected.len()];
        matrix.dequantize_row(0, &mut got);
        assert_bit_for_bit(name, &got, &expected);
    }
}

/// The quantizers napkin writes GGUF files with, against gguf-py's (bit-exact with llama.cpp's
/// reference quantizers) on seeded rows, a block of exact ties and a block of zeros; F16 and
/// BF16 also on halfway values, subnormals and overflow. (The K-quants and 5-bit blocks:
/// against llama.cpp itself, below.)
#[test]
fn ggml_quantization_equals_gguf_py() {
    use napkin_core::io::gguf::dequant::GgmlType;
    use napkin_core::io::gguf::quantize::quantize;
    let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/ggml");
    let values: Vec<f32> = std::fs::read(corpus.join("quantize.f32"))
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    // The 16-bit floats also on their edge cases: halfway values, subnormals, overflow.
    let halves: Vec<f32> = std::fs::read(corpus.join("quantize-halves.f32"))
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let with_halves: Vec<f32> = values.iter().chain(&halves).copied().collect();
    for (name, ty, input) in [
        ("Q8_0", GgmlType::Q8_0, &values),
        ("Q4_0", GgmlType::Q4_0, &values),
        ("F16", GgmlType::F16, &with_halves),
        ("BF16", GgmlType::Bf16, &with_halves),
    ] {
        let expected = std::fs::read(corpus.join(format!("quantize-{name}.blocks"))).unwrap();
        let got = quantize(ty, input).unwrap();
        assert_eq!(got.len(), expected.len(), "{name}");
        let differ: Vec<usize> = (0..got.len()).filter(|&i| got[i] != expected[i]).collect();
        assert!(
            differ.is_empty(),
            "{name}: {} of {} bytes differ, first at {:?}",
            differ.len(),
            got.len(),
            differ.first()
        );
    }
}

/// Every block type napkin writes, against llama.cpp's own quantizer (`ggml_quantize_chunk` of
/// the library llama-cpp-python 0.3.36 ships, no importance matrix) on 30 rows of 256 values:
/// weight-like, wide, heavy-tailed, one-signed, constant, zero, below f16's range, eight
/// scales in one row, one outlier, exact halves (`corpus/ggml/make_llama_cpp_reference.py`).
/// Bit for bit: the K-quants' searches included.
#[test]
fn every_written_block_type_equals_llama_cpp_quantizer() {
    use napkin_core::io::gguf::dequant::GgmlType;
    use napkin_core::io::gguf::quantize::quantize;
    let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/ggml");
    let values: Vec<f32> = std::fs::read(corpus.join("llama-cpp-quantize.f32"))
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(values.len(), 30 * 256);
    for (name, ty) in [
        ("Q4_K", GgmlType::Q4K),
        ("Q5_K", GgmlType::Q5K),
        ("Q6_K", GgmlType::Q6K),
        ("Q5_0", GgmlType::Q5_0),
        ("Q5_1", GgmlType::Q5_1),
        ("Q4_0", GgmlType::Q4_0),
        ("Q8_0", GgmlType::Q8_0),
    ] {
        let expected = std::fs::read(corpus.join(format!("llama-cpp-{name}.blocks"))).unwrap();
        let got = quantize(ty, &values).unwrap();
        assert_eq!(got.len(), expected.len(), "{name}");
        let (per, bytes) = ty.block().unwrap();
        let blocks_differing: Vec<usize> = got
            .chunks(bytes as usize)
            .zip(expected.chunks(bytes as usize))
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .map(|(i, _)| i)
            .collect();
        assert!(
            blocks_differing.is_empty(),
            "{name}: {} of {} blocks differ from llama.cpp's (blocks of {per}: {blocks_differing:?})",
            blocks_differing.len(),
            got.len() / bytes as usize
        );
    }
}
