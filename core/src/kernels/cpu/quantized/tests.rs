//! The block products against their definition: the SIMD kernels give the portable kernel's
//! sums, the portable kernel gives `dequantize(W) · dequantize(q8(x))` (the integer sums are
//! exact), and the 8-bit activations stay within their rounding bound of the f32 product.

use half::f16;

use super::*;
use crate::rng::SplitMix64;

fn uniform(rng: &mut SplitMix64) -> f32 {
    rng.next_f64() as f32 * 2.0 - 1.0
}

/// Random rows in `format` with scales like a real checkpoint's (|w| ≲ 0.1).
fn random_matrix(format: BlockFormat, rows: usize, cols: usize, seed: u64) -> QuantizedMatrix {
    let mut rng = SplitMix64(seed);
    let mut bytes = Vec::new();
    let random_bytes = |rng: &mut SplitMix64, n: usize, bytes: &mut Vec<u8>| {
        bytes.extend((0..n).map(|_| (rng.next_u64() & 0xff) as u8))
    };
    if format.values_per_block() == SUPER_BLOCK {
        for _ in 0..rows * cols / SUPER_BLOCK {
            // Every byte of the packed scales, nibbles, bit pairs and i8 scales at random
            // (−128 included); d (and dmin) small enough for |w| ≲ 0.1.
            let half = |rng: &mut SplitMix64, at: f32| {
                f16::from_f32(at * (0.5 + rng.next_f64() as f32)).to_le_bytes()
            };
            match format {
                BlockFormat::Q6K => {
                    random_bytes(&mut rng, 208, &mut bytes);
                    bytes.extend(half(&mut rng, 2e-5));
                }
                _ => {
                    bytes.extend(half(&mut rng, 1e-4));
                    bytes.extend(half(&mut rng, 1e-4));
                    let rest = if format == BlockFormat::Q5K { 172 } else { 140 };
                    random_bytes(&mut rng, rest, &mut bytes);
                }
            }
        }
        return QuantizedMatrix::new(format, rows, cols, bytes).unwrap();
    }
    if format == BlockFormat::Nf4 {
        // An absmax like a real checkpoint's, every code at random.
        for _ in 0..rows * cols / nf4::UNIT {
            bytes.extend((0.05 + 0.1 * rng.next_f64() as f32).to_le_bytes());
            random_bytes(&mut rng, nf4::UNIT / 2, &mut bytes);
        }
        return QuantizedMatrix::new(format, rows, cols, bytes).unwrap();
    }
    for _ in 0..rows * cols / BLOCK {
        let d = f16::from_f32(0.002 + 0.01 * rng.next_f64() as f32);
        bytes.extend(d.to_le_bytes());
        match format {
            BlockFormat::Q4_0 => bytes.extend((0..16).map(|_| (rng.next_u64() & 0xff) as u8)),
            BlockFormat::Q4_1 => {
                bytes.extend(f16::from_f32(-0.08 * rng.next_f64() as f32).to_le_bytes());
                bytes.extend((0..16).map(|_| (rng.next_u64() & 0xff) as u8));
            }
            // Every i8 value, −128 included (the sign trick's edge case).
            BlockFormat::Q8_0 => bytes.extend((0..32).map(|_| (rng.next_u64() & 0xff) as u8)),
            _ => unreachable!(),
        }
    }
    QuantizedMatrix::new(format, rows, cols, bytes).unwrap()
}

/// The portable kernel and every SIMD kernel this CPU can run.
fn kernels_this_cpu_runs() -> Vec<RowKernel> {
    let mut kernels = vec![RowKernel::Scalar];
    #[cfg(target_arch = "x86_64")]
    {
        if x86::has_avx2() {
            kernels.push(RowKernel::Avx2);
        }
        if x86::has_vnni() {
            kernels.push(RowKernel::Vnni);
        }
    }
    kernels
}

fn activations(tokens: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut rng = SplitMix64(seed);
    (0..tokens * cols)
        .map(|_| 3.0 * uniform(&mut rng))
        .collect()
}

fn dequantized(w: &QuantizedMatrix) -> Vec<f32> {
    let mut out = vec![0.0; w.rows() * w.cols()];
    for (r, row) in out.chunks_exact_mut(w.cols()).enumerate() {
        w.dequantize_row(r, row);
    }
    out
}

const FORMATS: [BlockFormat; 7] = BlockFormat::BLOCKED;

/// `cols` for the formats with blocks of 32 (and NF4's units of 64 when it is a multiple),
/// `k_cols` for the K-quants' super-blocks of 256.
fn columns(format: BlockFormat, cols: usize, k_cols: usize) -> usize {
    if cols.is_multiple_of(format.values_per_block()) {
        cols
    } else {
        k_cols
    }
}

/// What NF4's integer code values can move a product of row `r` by: half a step (`absmax /
/// 32768`) per weight times `|x|`; 0 for the formats whose integers are the weights' own.
fn code_rounding_bound(w: &QuantizedMatrix, r: usize, x: &[f64]) -> f64 {
    if w.format() != BlockFormat::Nf4 {
        return 0.0;
    }
    let units = w.row(r).chunks_exact(nf4::UNIT_BYTES);
    units
        .zip(x.chunks_exact(nf4::UNIT))
        .map(|(unit, x)| {
            let absmax = f32::from_le_bytes([unit[0], unit[1], unit[2], unit[3]]) as f64;
            absmax / 32768.0 * x.iter().map(|v| v.abs()).sum::<f64>()
        })
        .sum()
}
const BITS: [ActivationBits; 2] = [ActivationBits::Eight, ActivationBits::Sixteen];

/// Token t's activations as the blocks hold them (`d·q`), padding dropped.
fn dequantized_activations(x: &QuantizedActivations, t: usize) -> Vec<f64> {
    let n = x.cols() / BLOCK;
    let scales = &x.scales(t)[..n];
    let values: Vec<i32> = match x.bits() {
        ActivationBits::Eight => x.blocks(t)[..n]
            .iter()
            .flat_map(|b| b.qs.map(i32::from))
            .collect(),
        ActivationBits::Sixteen => x.wide_blocks(t)[..n]
            .iter()
            .flat_map(|b| b.qs.map(i32::from))
            .collect(),
    };
    values
        .iter()
        .enumerate()
        .map(|(i, &q)| q as f64 * scales[i / BLOCK] as f64)
        .collect()
}

#[test]
fn the_portable_kernel_is_the_dot_product_of_the_dequantized_blocks() {
    let rows = 12;
    for (format, bits) in FORMATS.into_iter().flat_map(|f| BITS.map(|b| (f, b))) {
        let cols = columns(format, 160, 512);
        let w = random_matrix(format, rows, cols, 1);
        let x = QuantizedActivations::with_bits(&activations(3, cols, 2), cols, bits);
        let mut y = vec![0.0; 3 * rows];
        for r in 0..rows {
            let mut out = [0.0; 3];
            scalar::row(format, w.row(r), &x, &mut out);
            for t in 0..3 {
                y[t * rows + r] = out[t];
            }
        }
        let wf = dequantized(&w);
        for t in 0..3 {
            let xq = dequantized_activations(&x, t);
            for r in 0..rows {
                let exact: f64 = wf[r * cols..(r + 1) * cols]
                    .iter()
                    .zip(&xq)
                    .map(|(&a, &b)| a as f64 * b)
                    .sum();
                let scale: f64 = wf[r * cols..(r + 1) * cols]
                    .iter()
                    .zip(&xq)
                    .map(|(&a, &b)| (a as f64 * b).abs())
                    .sum();
                let got = y[t * rows + r] as f64;
                let codes = code_rounding_bound(&w, r, &xq);
                assert!(
                    (got - exact).abs() <= 1e-5 * scale + codes,
                    "{format:?} {bits:?} row {r} token {t}: {got} vs {exact} (Σ|w·x| {scale})"
                );
            }
        }
    }
}

#[test]
fn quantized_activations_stay_within_their_rounding_bound() {
    // |Σ w·(x − x̂)| ≤ Σ_b (d_x,b / 2)·Σ_{i∈b} |w_i|: each activation is off by at most half a
    // step (d_x = max|x| / 127 with 8 bits, / 32639 with 16).
    let (rows, cols) = (8, 256);
    for (format, bits) in FORMATS.into_iter().flat_map(|f| BITS.map(|b| (f, b))) {
        let w = random_matrix(format, rows, cols, 3);
        let xf = activations(1, cols, 4);
        let x = QuantizedActivations::with_bits(&xf, cols, bits);
        let mut y = vec![0.0; rows];
        w.matmul(&x, &mut y);
        let wf = dequantized(&w);
        for r in 0..rows {
            let row = &wf[r * cols..(r + 1) * cols];
            let exact: f64 = row
                .iter()
                .zip(&xf)
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum();
            let bound: f64 = row
                .chunks_exact(BLOCK)
                .zip(x.scales(0))
                .map(|(wb, &d)| d as f64 / 2.0 * wb.iter().map(|v| v.abs() as f64).sum::<f64>())
                .sum();
            let err = (y[r] as f64 - exact).abs();
            let xf64: Vec<f64> = xf.iter().map(|&v| f64::from(v)).collect();
            let bound = bound + code_rounding_bound(&w, r, &xf64);
            assert!(
                err <= bound * 1.001 + 1e-6,
                "{format:?} row {r}: error {err} > bound {bound}"
            );
            assert!(
                err > 0.0 || bound == 0.0,
                "the 8-bit activations changed nothing?"
            );
        }
    }
}

#[test]
fn every_kernel_this_cpu_runs_matches_the_portable_one() {
    // Rows of blocks of 32 in whole groups of eight (512) and not (576: two groups and two
    // blocks, which the group kernels end with zero blocks); the K-quants' rows are whole
    // super-blocks. An odd number of rows: the prompt kernels' tiles of two rows end with one
    // row alone.
    let rows = 41;
    let kernels = kernels_this_cpu_runs();
    let cases = FORMATS
        .into_iter()
        .flat_map(|f| BITS.map(|b| (f, b)))
        .flat_map(|(f, b)| [columns(f, 576, 768), columns(f, 512, 768)].map(|cols| (f, b, cols)));
    for (format, bits, cols) in cases {
        let w = random_matrix(format, rows, cols, 5);
        // 1 token (decoding) and prompts of several (the K-quants' 16-bit kernels take one or
        // two tokens' activations as split bytes, more with their codes widened).
        for tokens in [1, 2, 3, 4, 7, 8, 9, 17] {
            let x = QuantizedActivations::with_bits(&activations(tokens, cols, 6), cols, bits);
            let mut reference = vec![0.0; rows * tokens];
            scalar::rows(format, w.bytes.as_slice(), &x, &mut reference);
            for &kernel in &kernels {
                let mut got = vec![0.0; rows * tokens];
                kernel.rows(format, w.bytes.as_slice(), &x, &mut got);
                for (i, (a, b)) in got.iter().zip(&reference).enumerate() {
                    let (r, t) = (i / tokens, i % tokens);
                    assert!(
                        (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                        "{kernel:?} {format:?} {bits:?} row {r} token {t}/{tokens}: {a} vs {b}"
                    );
                }
            }
        }
    }
}

#[test]
fn every_f32_row_kernel_matches_the_portable_one_to_rounding() {
    // Lengths with and without the kernels' 8-value steps (LoRA's r = 16, SmolLM2's 576, odd
    // rests); every row kernel this CPU picks runs f32 rows.
    let kernels = kernels_this_cpu_runs();
    let rows = 5;
    for cols in [1, 7, 8, 16, 31, 40, 576, 1003] {
        let wf = activations(rows, cols, 21);
        let w = QuantizedMatrix::from_f32(rows, cols, wf.clone());
        for tokens in [1, 3] {
            let xs = activations(tokens, cols, 22);
            let x = QuantizedActivations::new(&xs, cols);
            for &kernel in &kernels {
                let mut got = vec![0.0; rows * tokens];
                kernel.rows(BlockFormat::F32, w.bytes.as_slice(), &x, &mut got);
                for (i, got) in got.iter().enumerate() {
                    let (r, t) = (i / tokens, i % tokens);
                    let terms = wf[r * cols..(r + 1) * cols]
                        .iter()
                        .zip(&xs[t * cols..(t + 1) * cols]);
                    let (exact, magnitude) = terms.fold((0.0f64, 0.0f64), |(e, m), (a, b)| {
                        let p = f64::from(*a) * f64::from(*b);
                        (e + p, m + p.abs())
                    });
                    assert!(
                        (f64::from(*got) - exact).abs() <= 1e-6 * magnitude,
                        "{kernel:?} cols {cols} row {r} token {t}: {got} vs {exact}"
                    );
                }
            }
        }
    }
}

#[test]
fn sixteen_bit_activations_split_into_two_signed_bytes_exactly() {
    // The extremes of the range, both signs, and values around each multiple of 256.
    let mut values: Vec<f32> = vec![1.0, -1.0, 0.5, -0.5, 0.0];
    values.extend((0..27).map(|i| (i as f32 - 13.0) * 256.0 / 32639.0 + 1e-6));
    values.extend((0..32 * 7 - values.len()).map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0));
    let x = QuantizedActivations::with_bits(&values, values.len(), ActivationBits::Sixteen);
    let mut extremes = (0, 0);
    for (wide, split) in x.wide_blocks(0).iter().zip(x.split_blocks(0)) {
        for i in 0..BLOCK {
            let q = wide.qs[i] as i32;
            assert_eq!(
                256 * split.high[i] as i32 + split.low[i] as i32,
                q,
                "value {q}"
            );
            extremes = (extremes.0.min(q), extremes.1.max(q));
        }
    }
    assert_eq!(
        extremes,
        (-32639, 32639),
        "the range the bytes can hold, used"
    );
}

#[test]
fn a_token_gets_the_same_bits_alone_or_in_a_prompt() {
    // Decoding and prefilling the same tokens must agree exactly (a prompt's logits are those
    // of its tokens decoded one by one): every kernel — one token, a few, eight side by side
    // and a partial group of eight, rows in tiles or alone, rows of whole groups of eight blocks
    // or not (576: two groups and two blocks) — sums a token's blocks in the same order.
    let rows = 25;
    let cases = FORMATS
        .into_iter()
        .flat_map(|f| BITS.map(|b| (f, b)))
        .flat_map(|(f, b)| [columns(f, 256, 512), columns(f, 576, 768)].map(|cols| (f, b, cols)));
    for (format, bits, cols) in cases {
        let w = random_matrix(format, rows, cols, 12);
        for tokens in [3, 9] {
            let xs = activations(tokens, cols, 13);
            let x = QuantizedActivations::with_bits(&xs, cols, bits);
            let mut all = vec![0.0; tokens * rows];
            w.matmul(&x, &mut all);
            for t in 0..tokens {
                let one =
                    QuantizedActivations::with_bits(&xs[t * cols..(t + 1) * cols], cols, bits);
                let mut y = vec![0.0; rows];
                w.matmul(&one, &mut y);
                let prompt = &all[t * rows..(t + 1) * rows];
                assert!(
                    prompt
                        .iter()
                        .zip(&y)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{format:?} {bits:?} {cols} columns, token {t} of {tokens}: {:?} vs {:?}",
                    &prompt[..4],
                    &y[..4]
                );
            }
        }
    }
}

#[test]
fn a_prompt_product_is_each_tokens_product_and_f32_rows_are_plain_dot_products() {
    let (rows, cols) = (300, 64);
    let xs = activations(5, cols, 7);
    let mut w = random_matrix(BlockFormat::Q4_1, rows, cols, 8);
    let wf = dequantized(&w);
    for pass in 0..2 {
        let x = QuantizedActivations::new(&xs, cols);
        let mut all = vec![0.0; 5 * rows];
        w.matmul(&x, &mut all);
        for t in 0..5 {
            let one = QuantizedActivations::new(&xs[t * cols..(t + 1) * cols], cols);
            let mut y = vec![0.0; rows];
            w.matmul(&one, &mut y);
            assert_eq!(
                &all[t * rows..(t + 1) * rows],
                &y[..],
                "{:?} token {t}",
                w.format()
            );
        }
        if pass == 0 {
            w = QuantizedMatrix::from_f32(rows, cols, wf.clone());
        } else {
            let exact: f32 = wf[..cols].iter().zip(&xs[..cols]).map(|(a, b)| a * b).sum();
            assert!((all[0] - exact).abs() < 1e-4, "{} vs {exact}", all[0]);
        }
    }
}

#[test]
fn an_f32_matrix_holds_its_values_in_their_own_memory_as_little_endian_bytes() {
    // A model's f32 weights (a 113 MB embedding for SmolLM2) become a matrix without a copy:
    // the matrix reads the vector it was given, and its rows read back the values.
    let (rows, cols) = (3, 40);
    let values = activations(rows, cols, 5);
    let expected = values.clone();
    let at = values.as_ptr().cast::<u8>();
    let w = QuantizedMatrix::from_f32(rows, cols, values);
    assert_eq!(w.stored_bytes().as_ptr(), at, "the values were copied");
    let little_endian: Vec<u8> = expected.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(w.stored_bytes(), &little_endian[..]);
    let mut row = vec![0.0; cols];
    w.dequantize_row(2, &mut row);
    assert_eq!(row, &expected[2 * cols..]);
}

#[test]
fn reordered_and_shared_rows_give_each_rows_product_in_its_place() {
    let a = random_matrix(BlockFormat::Q8_0, 3, 64, 9);
    let b = random_matrix(BlockFormat::Q4_0, 2, 64, 10);
    let swapped = a.with_rows_in_order(&[2, 0, 1]);
    assert_eq!(swapped.row(0), a.row(2));
    assert_eq!(swapped.row(1), a.row(0));
    // Reordering a reordered matrix composes the orders.
    let back = swapped.with_rows_in_order(&[1, 2, 0]);
    assert_eq!(back.row(0), a.row(0));
    assert_eq!(back.row(2), a.row(2));
    // The same blocks read in place from a range of a shared buffer.
    let mut file = vec![7u8; 5];
    file.extend_from_slice(a.bytes.as_slice());
    let buffer: SharedBuffer = Arc::new(file);
    let in_place = QuantizedMatrix::new(
        BlockFormat::Q8_0,
        3,
        64,
        BlockBytes::shared(buffer.clone(), 5..5 + a.resident_bytes()).unwrap(),
    )
    .unwrap();
    assert!(BlockBytes::shared(buffer, 5..5 + a.resident_bytes() + 1).is_none());
    for tokens in [1, 4] {
        let xs = activations(tokens, 64, 12);
        let x = QuantizedActivations::new(&xs, 64);
        let alone = |w: &QuantizedMatrix| {
            let mut out = vec![0.0; tokens * w.rows()];
            w.matmul(&x, &mut out);
            out
        };
        let (ya, yb, ys) = (alone(&a), alone(&b), alone(&swapped));
        for t in 0..tokens {
            let row = |y: &[f32], r: usize| y[t * 3 + r];
            assert_eq!(
                [row(&ys, 0), row(&ys, 1), row(&ys, 2)],
                [row(&ya, 2), row(&ya, 0), row(&ya, 1)]
            );
        }
        assert_eq!(alone(&in_place), ya);
        // Several products in one pass: each part's output is its own product's, bit for bit.
        let each = QuantizedMatrix::matmul_each(&[&swapped, &b, &in_place], &x);
        assert_eq!(each, vec![ys, yb, ya]);
    }
    assert!(QuantizedMatrix::new(BlockFormat::Q4_1, 1, 48, vec![0; 30]).is_err());
    assert!(QuantizedMatrix::new(BlockFormat::Q4_1, 2, 64, vec![0; 79]).is_err());
}

#[test]
fn rounding_by_truncation_rounds_ties_away_from_zero_as_round_does() {
    let edge = [
        0.0f32,
        -0.0,
        0.5,
        -0.5,
        1.5,
        -1.5,
        2.5,
        -2.5,
        0.499_999_97,
        -0.499_999_97,
        126.5,
        -126.5,
        127.0,
        32_638.5,
        -32_638.5,
        32_639.0,
        8_388_607.0,
        f32::NAN,
    ];
    let mut rng = SplitMix64(7);
    let random = (0..200_000).map(|i| {
        let scale = [1.0, 127.0, 32_639.0][i % 3];
        uniform(&mut rng) * scale
    });
    for y in edge.into_iter().chain(random) {
        assert_eq!(
            activations::rounded(y),
            y.round() as i32,
            "{y:e} rounds to {}",
            y.round()
        );
    }
}

/// Blocks that probe the quantizers' edges: ties at both widths' steps (a block whose largest
/// value makes `d` exactly 1), zeros, one NaN, an infinity, a subnormal maximum, an outlier
/// beside small values, then random blocks over many magnitudes.
fn edge_and_random_blocks() -> Vec<[f32; BLOCK]> {
    let mut blocks = vec![[0.0f32; BLOCK]];
    for max in [127.0f32, 32_639.0] {
        let mut ties: [f32; BLOCK] = std::array::from_fn(|i| i as f32 - 15.5);
        ties[31] = max;
        ties[30] = -(max - 0.5);
        blocks.push(ties);
    }
    let mut rng = SplitMix64(11);
    let mut random = || std::array::from_fn(|_| 3.0 * uniform(&mut rng));
    let mut with_nan: [f32; BLOCK] = random();
    with_nan[5] = f32::NAN;
    let mut with_inf: [f32; BLOCK] = random();
    with_inf[9] = f32::NEG_INFINITY;
    // A maximum whose `d` is subnormal: `1/d` is infinite, so are the quotients.
    let mut tiny = [0.0f32; BLOCK];
    tiny[3] = 1e-37;
    tiny[4] = -3e-38;
    tiny[5] = f32::from_bits(1);
    let mut outlier: [f32; BLOCK] = std::array::from_fn(|i| 1e-3 * (i as f32 - 16.0));
    outlier[17] = 250.0;
    blocks.extend([with_nan, with_inf, tiny, outlier]);
    for k in 0..2000 {
        let scale = 10f32.powi(k % 13 - 6);
        blocks.push(random().map(|v| v * scale));
    }
    blocks
}

#[cfg(target_arch = "x86_64")]
#[test]
fn the_avx2_quantizers_give_the_portable_ones_bits() {
    if !x86::has_avx2() {
        return;
    }
    for block in edge_and_random_blocks() {
        let (want, want_halves) = activations::quantize_block(&block);
        // SAFETY: the CPU has AVX2 (checked above).
        let (got, got_halves) = unsafe { activations_x86::quantize_block(&block) };
        assert_eq!(
            (
                got.qs,
                got.d.to_bits(),
                got.sum,
                got.d_sum.to_bits(),
                got_halves
            ),
            (
                want.qs,
                want.d.to_bits(),
                want.sum,
                want.d_sum.to_bits(),
                want_halves
            ),
            "8 bits: {block:?}"
        );
        let (want, want_split, want_d, want_sum, want_halves) = activations::quantize_wide(&block);
        // SAFETY: as above.
        let (got, got_split, got_d, got_sum, got_halves) =
            unsafe { activations_x86::quantize_wide(&block) };
        assert_eq!(
            (
                got.qs,
                got_split.low,
                got_split.high,
                got_d.to_bits(),
                got_sum,
                got_halves
            ),
            (
                want.qs,
                want_split.low,
                want_split.high,
                want_d.to_bits(),
                want_sum,
                want_halves
            ),
            "16 bits: {block:?}"
        );
    }
}

#[test]
fn quantized_blocks_round_each_value_to_the_nearest_step() {
    // The portable quantizers against their definition, value by value: `q = round(x / d)`
    // clamped to the width's largest value, NaN as 0, `d = max|x| / max`.
    for block in edge_and_random_blocks() {
        let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for (max, qs) in [
            (
                127.0f32,
                activations::quantize_block(&block).0.qs.map(i32::from),
            ),
            (
                32_639.0,
                activations::quantize_wide(&block).0.qs.map(i32::from),
            ),
        ] {
            let d = amax / max;
            let inverse = if d > 0.0 { 1.0 / d } else { 0.0 };
            let want = block.map(|v| {
                let y = v * inverse;
                if y.is_nan() {
                    0
                } else {
                    y.clamp(-max, max).round() as i32
                }
            });
            assert_eq!(qs, want, "{max}: {block:?}");
        }
    }
}

#[test]
fn an_nf4_matrix_holds_the_tensors_codes_and_absmax() {
    // Plain and double-quantized scales, blocks of one unit and of two (a block spans rows
    // when the row is not a whole number of blocks: 192 columns, blocks of 128).
    use crate::config::Nf4Config;
    use crate::quant::nf4::Nf4Tensor;
    for (block_size, double_quant, cols) in [(64, false, 128), (64, true, 576), (128, true, 192)] {
        let rows = 9;
        let values = activations(rows, cols, 30);
        let config = Nf4Config {
            block_size,
            double_quant,
        };
        let tensor = Nf4Tensor::quantize(&values, &[rows, cols], &config).unwrap();
        let w = QuantizedMatrix::from_nf4(&tensor).unwrap();
        assert_eq!(
            (w.rows(), w.cols(), w.format()),
            (rows, cols, BlockFormat::Nf4)
        );
        assert_eq!(w.resident_bytes(), rows * cols / 64 * 36);
        let want = tensor.dequantize();
        let got = dequantized(&w);
        assert!(
            got.iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "block {block_size}, double {double_quant}: {:?} vs {:?}",
            &got[..4],
            &want[..4]
        );
    }
    let refuse = |cols: usize, block_size: usize| {
        let values = activations(2, cols, 31);
        let config = Nf4Config {
            block_size,
            double_quant: false,
        };
        let tensor = Nf4Tensor::quantize(&values, &[2, cols], &config).unwrap();
        QuantizedMatrix::from_nf4(&tensor).unwrap_err()
    };
    assert!(
        refuse(96, 32).contains("multiples of 64"),
        "{}",
        refuse(96, 32)
    );
    assert!(
        refuse(128, 32).contains("blocks of 32"),
        "{}",
        refuse(128, 32)
    );
}
