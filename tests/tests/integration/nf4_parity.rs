//! NF4 quantization against bitsandbytes 0.50 on every case under `<fixtures>/nf4`: codes, packed
//! bytes and absmax bit-exact; dequantized values exact; double quantization exact against the
//! `*_exact` tensors (exact nearest 8-bit rounding); the offset and second-level scales of double
//! quantization bit for bit with bitsandbytes' own on new cases (`tests/corpus/nf4_dq`), its
//! offset being torch's float32 mean (`tests/corpus/torch_sum`).

use napkin_core::config::Nf4Config;
use napkin_core::quant::dynamic_map::dynamic_map_signed;
use napkin_core::quant::nf4::{NF4_CODEBOOK, Nf4Scales, Nf4Tensor};
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

/// Double quantization against bitsandbytes' own output on new cases of blocks 64, 128 and 256
/// (`tests/corpus/nf4_dq`, made by its script): the offset (torch's float32 `mean()`, which
/// napkin adds in torch's order) and the second-level scales bit for bit; the 8-bit codes equal
/// except where bitsandbytes' CPU lookup table takes a neighbour of the nearest code (near a
/// midpoint): there napkin's code is the nearer one; every scale with the same code bit for bit.
#[test]
fn double_quantization_takes_bitsandbytes_offset_and_scales_exactly() {
    let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/nf4_dq");
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(corpus.join("cases.json")).unwrap()).unwrap();
    let blob = std::fs::read(corpus.join("cases.bin")).unwrap();
    let span = |at: &serde_json::Value| {
        let start = at[0].as_u64().unwrap() as usize;
        (start, at[1].as_u64().unwrap() as usize)
    };
    let f32s = |at: &serde_json::Value| -> Vec<f32> {
        let (start, n) = span(at);
        blob[start..start + 4 * n]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    };
    let u8s = |at: &serde_json::Value| -> Vec<u8> {
        let (start, n) = span(at);
        blob[start..start + n].to_vec()
    };
    let code8 = dynamic_map_signed();
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
        assert_eq!(offset.to_bits(), theirs.to_bits(), "block {block}: offset");
        assert_eq!(
            bits(absmax2),
            bits(&f32s(&case["absmax2"])),
            "block {block}: absmax2"
        );
        let their_codes = u8s(&case["qabsmax"]);
        let their_dequant = f32s(&case["absmax_dequant"]);
        let mut flipped = 0;
        for (j, ((&ours, &their), (&a, (mine, want)))) in qabsmax
            .iter()
            .zip(&their_codes)
            .zip(absmax.iter().zip(q.absmax().iter().zip(&their_dequant)))
            .enumerate()
        {
            if ours == their {
                assert_eq!(mine.to_bits(), want.to_bits(), "block {block}: scale {j}");
                continue;
            }
            flipped += 1;
            // absmax − offset over its second-level scale, against the two codes' values.
            let s = (a - offset) * (1.0 / absmax2[j / 256]);
            let (d_ours, d_theirs) = (
                (s - code8[ours as usize]).abs(),
                (s - code8[their as usize]).abs(),
            );
            assert!(
                d_ours <= d_theirs,
                "block {block}: scale {j} ({s}) took code {ours}, bitsandbytes {their} is nearer"
            );
        }
        report.push(format!(
            "block {block}: offset and absmax2 equal, {flipped} of {} codes at bitsandbytes' lookup neighbour",
            qabsmax.len()
        ));
    }
    eprintln!("{}", report.join("\n"));
}

/// torch's float32 sum and mean on the CPU (`tests/corpus/torch_sum`, made by its script): 1 to
/// 300 values and longer vectors up to 262,144, positive and of both signs. On one thread
/// napkin's order is torch's: every sum and mean equal to the bit. With 4 or 16 threads torch
/// splits vectors of 32,768 values or more, in another order; for positive values (what
/// double quantization averages) the two orders are then both within the first-order error of
/// a sum in which each value meets at most 128 additions (torch's four cascade levels of at
/// most 16 plus the tails, lanes and thread partials): 2 · 128 · 2⁻²⁴ · Σx.
#[test]
fn torch_cpu_sums_and_means_are_reproduced_bit_for_bit() {
    use napkin_core::quant::torch_mean::{torch_cpu_mean, torch_cpu_sum};
    use napkin_core::rng::SplitMix64;
    let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/torch_sum");
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(corpus.join("cases.json")).unwrap()).unwrap();
    let (mut exact, mut worst_ulps) = (0, 0i64);
    for case in meta["cases"].as_array().unwrap() {
        let n = case["n"].as_u64().unwrap() as usize;
        let signed = case["signed"].as_bool().unwrap();
        let mut rng = SplitMix64(case["seed"].as_u64().unwrap());
        let x: Vec<f32> = (0..n)
            .map(|_| {
                let k = (rng.next_u64() >> 40) as i64 - if signed { 1 << 23 } else { 0 };
                k as f32 * 2f32.powi(-28)
            })
            .collect();
        let (sum, mean) = (torch_cpu_sum(&x), torch_cpu_mean(&x));
        let want_sum = f32::from_bits(case["sum_bits"].as_u64().unwrap() as u32);
        let want_mean = f32::from_bits(case["mean_bits"].as_u64().unwrap() as u32);
        let what = format!("n {n}, signed {signed}");
        match case["threads"].as_u64().unwrap() {
            1 => {
                assert_eq!(sum.to_bits(), want_sum.to_bits(), "{what}: sum");
                assert_eq!(mean.to_bits(), want_mean.to_bits(), "{what}: mean");
                exact += 1;
            }
            threads if !signed => {
                let total: f64 = x.iter().map(|&v| v as f64).sum();
                let bound = 2.0 * 128.0 * 2f64.powi(-24) * total;
                let gap = (sum as f64 - want_sum as f64).abs();
                assert!(
                    gap <= bound,
                    "{what}, {threads} threads: sums {gap:e} apart"
                );
                worst_ulps =
                    worst_ulps.max((mean.to_bits() as i64 - want_mean.to_bits() as i64).abs());
            }
            _ => {}
        }
    }
    eprintln!(
        "torch's CPU sum: {exact} one-thread cases bit for bit; several threads, positive values: means within {worst_ulps} ULP"
    );
}
