//! The float32 mean as torch computes it on the CPU, to the bit: the offset of double
//! quantization is bitsandbytes' `absmax.mean()`, so matching bitsandbytes means adding in
//! torch's order.
//!
//! torch's CPU `sum` of a contiguous float32 vector (ATen's cascade sum) reads it as 8-lane
//! vectors, four of them side by side (`[n/32, 4, 8]`), and keeps each of the 32 running sums
//! as a cascade of four levels: every 16 (or more, for long inputs) vectors are summed into
//! level 0, which is then carried into level 1, and so on, so that only numbers of similar size
//! meet. The four vector sums are added together lane by lane, then the scalar tail, then the
//! eight lanes one by one. `mean` is that sum divided by the length in float32.
//!
//! Checked against torch 2.15 on an AVX-512 machine, whose sum kernel's vectors are 256 bits
//! wide there as on AVX2 (`tests/corpus/torch_sum`: every length from 1 to 300 and nine longer
//! ones up to 262,144, positive and of both signs, on one thread: equal to the bit; 10⁶ values
//! and `ATEN_CPU_CAPABILITY=default` were also equal when tried). torch splits a sum of 32,768
//! values or more between its threads when it has several, which changes the order; the bound
//! for that case is in `tests/tests/integration/nf4_parity.rs`.

/// Lanes of ATen's `Vectorized<float>` in its sum kernel.
const LANES: usize = 8;
/// Vectors summed side by side (ATen's `ilp_factor`).
const SIDE_BY_SIDE: usize = 4;
/// Levels of the cascade.
const LEVELS: usize = 4;

/// `Σ x` in torch's CPU order (see the module docs).
pub fn torch_cpu_sum(x: &[f32]) -> f32 {
    if x.len() < LANES {
        // Too short for a vector: the same cascade over single values.
        let (singles, _) = x.as_chunks::<1>();
        return row_sum(singles)[0];
    }
    let (vectors, tail) = x.as_chunks::<LANES>();
    let lanes = row_sum(vectors);
    let mut total = 0.0f32;
    for &v in tail {
        total += v;
    }
    for lane in lanes {
        total += lane;
    }
    total
}

/// `Σ x / n` in torch's CPU order (see the module docs); 0 for an empty slice.
pub fn torch_cpu_mean(x: &[f32]) -> f32 {
    if x.is_empty() {
        return 0.0;
    }
    torch_cpu_sum(x) / x.len() as f32
}

/// Lane-wise `a += b`.
fn add<const W: usize>(a: &mut [f32; W], b: &[f32; W]) {
    a.iter_mut().zip(b).for_each(|(a, b)| *a += b);
}

/// ATen's `row_sum`: the items as rows of [`SIDE_BY_SIDE`], one cascade per column, the rest
/// added to the first column, then the columns added together.
fn row_sum<const W: usize>(items: &[[f32; W]]) -> [f32; W] {
    let rows = items.len() / SIDE_BY_SIDE;
    let (whole, rest) = items.split_at(rows * SIDE_BY_SIDE);
    let mut columns = cascade(whole);
    for item in rest {
        add(&mut columns[0], item);
    }
    for k in 1..SIDE_BY_SIDE {
        let column = columns[k];
        add(&mut columns[0], &column);
    }
    columns[0]
}

/// ATen's `multi_row_sum` with [`SIDE_BY_SIDE`] columns: `items[i·4 + k]` is row i, column k.
fn cascade<const W: usize>(items: &[[f32; W]]) -> [[f32; W]; SIDE_BY_SIDE] {
    let size = items.len() / SIDE_BY_SIDE;
    let row = |i: usize| &items[i * SIDE_BY_SIDE..(i + 1) * SIDE_BY_SIDE];
    let level_power = 4.max(ceil_log2(size) / LEVELS as u32);
    let step = 1usize << level_power;
    let mask = step - 1;
    let mut acc = [[[0.0f32; W]; SIDE_BY_SIDE]; LEVELS];
    let mut i = 0;
    while i + step <= size {
        for _ in 0..step {
            for (sum, item) in acc[0].iter_mut().zip(row(i)) {
                add(sum, item);
            }
            i += 1;
        }
        for level in 1..LEVELS {
            let (below, above) = acc.split_at_mut(level);
            for (sum, carried) in above[0].iter_mut().zip(&mut below[level - 1]) {
                add(sum, carried);
                *carried = [0.0; W];
            }
            if i & (mask << (level as u32 * level_power)) != 0 {
                break;
            }
        }
    }
    for i in i..size {
        for (sum, item) in acc[0].iter_mut().zip(row(i)) {
            add(sum, item);
        }
    }
    let [mut total, higher @ ..] = acc;
    for level in &higher {
        for (sum, part) in total.iter_mut().zip(level) {
            add(sum, part);
        }
    }
    total
}

/// ATen's `CeilLog2`: ⌈log₂ x⌉, and 1 for x ≤ 2.
fn ceil_log2(x: usize) -> u32 {
    if x <= 2 {
        return 1;
    }
    usize::BITS - (x - 1).leading_zeros()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceil_log2_follows_aten() {
        let cases = [
            (0, 1),
            (1, 1),
            (2, 1),
            (3, 2),
            (4, 2),
            (5, 3),
            (16, 4),
            (17, 5),
        ];
        for (x, want) in cases {
            assert_eq!(ceil_log2(x), want, "CeilLog2({x})");
        }
    }

    #[test]
    fn short_sums_and_exact_sums_are_plain_sums() {
        assert_eq!(torch_cpu_sum(&[]), 0.0);
        assert_eq!(torch_cpu_sum(&[1.5, 2.0, -0.25]), 3.25);
        // Small integers add exactly in any order.
        let ints: Vec<f32> = (0..1000).map(|i| (i % 7) as f32).collect();
        let want: f32 = ints.iter().sum();
        assert_eq!(torch_cpu_sum(&ints), want);
        assert_eq!(torch_cpu_mean(&[2.0; 37]), 2.0);
    }

    #[test]
    fn the_order_is_torchs_not_a_running_sum() {
        // 1 followed by many values below half its ULP: a running sum loses every one of them,
        // torch's 32 partial sums keep them apart from the 1 until the end.
        let mut x = vec![1.0f32];
        x.extend(std::iter::repeat_n(2f32.powi(-25), 4095));
        let running: f32 = x.iter().sum();
        assert_eq!(running, 1.0);
        assert!(torch_cpu_sum(&x) > 1.0);
    }
}
