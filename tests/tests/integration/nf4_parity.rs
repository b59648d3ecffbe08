//! NF4 quantization against bitsandbytes 0.50 on every case under `<fixtures>/nf4`: codes, packed
//! bytes and absmax bit-exact; dequantized values exact; double quantization exact against the
//! `*_exact` tensors (exact nearest 8-bit rounding); the offset of double quantization within
//! 2 ULP of bitsandbytes' own (torch's float32 mean) on new cases (`tests/corpus/nf4_dq`).

use napkin_core::config::Nf4Config;
use napkin_core::tricks::dynamic_map::dynamic_map_signed;
use napkin_core::tricks::nf4::{NF4_CODEBOOK, Nf4Scales, Nf4Tensor};
use napkin_tests::{Reference, nf4_cases};

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn nf4_codes_packing_absmax_and_dequant_are_bit_exact() {
    for (name, path, json) in nf4_cases() {
        let reference = Reference::open_file(&path);
        let (shape, input) = reference.f32("input");
        let block_size = json["blocksize"].as_u64().expect("blocksize") as usize;
        let config = Nf4Config {
            block_size,
            double_quant: false,
        };
        let q = Nf4Tensor::quantize(&input, &shape, &config).unwrap();

        assert_eq!(
            bits(&reference.f32("codebook").1),
            bits(&NF4_CODEBOOK),
            "{name}: codebook"
        );
        assert_eq!(q.codes(), reference.u8("codes"), "{name}: codes");
        assert_eq!(q.packed, reference.u8("packed"), "{name}: packed bytes");
        assert_eq!(
            bits(&q.absmax()),
            bits(&reference.f32("absmax").1),
            "{name}: absmax"
        );
        assert_eq!(
            bits(&q.dequantize()),
            bits(&reference.f32("dequant").1),
            "{name}: dequant"
        );
    }
}

#[test]
fn double_quantization_is_exact_against_exact_nearest_rounding() {
    let mut checked = 0;
    for (name, path, json) in nf4_cases() {
        if json["double_quant"] != serde_json::Value::Bool(true) {
            continue;
        }
        checked += 1;
        let reference = Reference::open_file(&path);
        let (shape, input) = reference.f32("input");
        let block_size = json["blocksize"].as_u64().expect("blocksize") as usize;
        let config = Nf4Config {
            block_size,
            double_quant: true,
        };
        let q = Nf4Tensor::quantize(&input, &shape, &config).unwrap();

        assert_eq!(
            bits(&dynamic_map_signed()),
            bits(&reference.f32("dq.code8").1),
            "{name}: code8"
        );
        // The codes do not change under double quantization; only the scales do.
        assert_eq!(q.packed, reference.u8("packed"), "{name}: packed bytes");
        let Nf4Scales::Double {
            offset,
            qabsmax,
            absmax2,
        } = &q.scales
        else {
            panic!("{name}: expected double-quantized scales");
        };
        assert_eq!(
            offset.to_bits(),
            reference.scalar("dq.offset").to_bits(),
            "{name}: offset"
        );
        assert_eq!(
            bits(absmax2),
            bits(&reference.f32("dq.absmax2").1),
            "{name}: absmax2"
        );
        assert_eq!(
            qabsmax,
            &reference.u8("dq.qabsmax_exact"),
            "{name}: qabsmax (exact)"
        );
        assert_eq!(
            bits(&q.absmax()),
            bits(&reference.f32("dq.absmax_dequant_exact").1),
            "{name}: absmax'"
        );
        assert_eq!(
            bits(&q.dequantize()),
            bits(&reference.f32("dequant_dq_exact").1),
            "{name}: dequant"
        );
    }
    assert!(
        checked > 0,
        "no double-quantization case under the fixture root"
    );
}

/// Double quantization against bitsandbytes' own offset (torch's float32 `mean()`, whose
/// summation order follows torch's vectorized kernels and so the CPU: not reproducible in
/// general) on new cases of blocks 64, 128 and 256 (`tests/corpus/nf4_dq`, made by its
/// script). napkin's offset is the correctly rounded mean. Measured: the offsets differ by 0 or
/// 1 ULP (bound 2); the second-level scales and the dequantized scales with the same 8-bit code
/// by at most 2 ULP of the offset; 0–3 of ~845 8-bit codes differ (bound 1 %) — where
/// `absmax − offset` sits at a rounding boundary, and where bitsandbytes' CPU search does not
/// round to the nearest code (it happens with equal offsets too).
#[test]
fn double_quantization_offset_is_within_two_ulp_of_bitsandbytes() {
    let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/nf4_dq");
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(corpus.join("cases.json")).unwrap()).unwrap();
    let blob = std::fs::read(corpus.join("cases.bin")).unwrap();
    let f32s = |at: &serde_json::Value| -> Vec<f32> {
        let (start, n) = (
            at[0].as_u64().unwrap() as usize,
            at[1].as_u64().unwrap() as usize,
        );
        blob[start..start + 4 * n]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    };
    let u8s = |at: &serde_json::Value| -> Vec<u8> {
        let (start, n) = (
            at[0].as_u64().unwrap() as usize,
            at[1].as_u64().unwrap() as usize,
        );
        blob[start..start + n].to_vec()
    };
    let mut report = Vec::new();
    for case in meta["cases"].as_array().unwrap() {
        let block = case["block"].as_u64().unwrap() as usize;
        let absmax = f32s(&case["absmax"]);
        // A weight whose blocks have exactly these absmax values: the value, then zeros.
        let mut weight = vec![0.0f32; absmax.len() * block];
        for (b, &a) in absmax.iter().enumerate() {
            weight[b * block] = a;
        }
        let config = Nf4Config {
            block_size: block,
            double_quant: true,
        };
        let q = Nf4Tensor::quantize(&weight, &[weight.len()], &config).unwrap();
        let Nf4Scales::Double {
            offset,
            qabsmax,
            absmax2,
        } = &q.scales
        else {
            panic!("double-quantized scales expected");
        };
        let theirs = case["offset"].as_f64().unwrap() as f32;
        let ulps = (offset.to_bits() as i64 - theirs.to_bits() as i64).abs();
        let their_codes = u8s(&case["qabsmax"]);
        let flipped = qabsmax
            .iter()
            .zip(&their_codes)
            .filter(|(a, b)| a != b)
            .count();
        let their_absmax2 = f32s(&case["absmax2"]);
        let their_dequant = f32s(&case["absmax_dequant"]);
        let worst = q
            .absmax()
            .iter()
            .zip(&their_dequant)
            .zip(qabsmax.iter().zip(&their_codes))
            .filter(|(_, (a, b))| a == b)
            .map(|((x, y), _)| (x - y).abs())
            .fold(0.0f32, f32::max);
        // absmax2 = max |absmax − offset| over 256 scales: it moves with the offset.
        let absmax2_diff = absmax2
            .iter()
            .zip(&their_absmax2)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            absmax2_diff <= 2.0 * (offset.next_up() - offset),
            "block {block}: absmax2 differs by {absmax2_diff}"
        );
        report.push(format!(
            "block {block}: offset {ulps} ULP, absmax2 within {absmax2_diff:e}, {flipped} of {} codes differ, same-code scales within {worst:e}",
            qabsmax.len()
        ));
        assert!(
            ulps <= 2,
            "block {block}: offset {offset} vs {theirs} ({ulps} ULP)"
        );
        assert!(
            worst <= 2.0 * (offset.next_up() - offset),
            "block {block}: {worst}"
        );
        assert!(
            flipped * 100 <= qabsmax.len(),
            "block {block}: {flipped} codes differ"
        );
    }
    eprintln!("{}", report.join("\n"));
}
