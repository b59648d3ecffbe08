//! NF4 quantization against bitsandbytes 0.50 on every case under `<fixtures>/nf4`: codes, packed
//! bytes and absmax bit-exact; dequantized values exact; double quantization exact against the
//! `*_exact` tensors (exact nearest 8-bit rounding).

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
