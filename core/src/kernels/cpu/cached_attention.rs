//! Causal grouped-query attention of a few new queries over a KV cache on the host: generation's
//! attention (`model/quantized_llama.rs`), split over the team's threads by (token, head) rows.
//!
//! Each row is scores `q·k / √Dh` over the keys it sees, a softmax, and the values weighted by
//! it, in f32 with eight independent running sums per dot product. The same source is compiled
//! twice: for the baseline x86-64 (SSE2: two 4-wide halves of the eight sums) and with AVX2 (one
//! 8-wide register), picked at run time. Both do the same operations on the same lanes in the
//! same order (no fused multiply-add, no reassociation), so they give the same bits; AVX2 halves
//! the instructions of the two inner loops, which grow with the context (at a few hundred tokens
//! the attention was ~5 % of a 1.1B model's decoding step, ~10 % of a 400-token prompt's pass).

use super::team;

/// The cache's shape and where the new queries sit in it.
#[derive(Debug, Clone, Copy)]
pub struct CachedAttention {
    /// Query heads `H`.
    pub heads: usize,
    /// Key/value heads `Hkv` (a divisor of `H`: each serves `H / Hkv` query heads).
    pub kv_heads: usize,
    /// Values per head `Dh`.
    pub head_dim: usize,
    /// Positions in the cache before the first new query.
    pub past: usize,
    /// A sliding window (Mistral's): each query sees its newest `window` keys only.
    pub window: Option<usize>,
}

impl CachedAttention {
    /// Query `i` (position `past + i`) attends to keys `0..=past + i` (the last `window` of them
    /// with a window).
    ///
    /// # Shapes
    /// - `q`: `[T, H·Dh]`; `keys`, `values`: `[S, Hkv·Dh]` with the new tokens' already in
    ///   (`S ≥ past + T`) → `[T, H·Dh]`
    pub fn run(&self, q: &[f32], keys: &[f32], values: &[f32]) -> Vec<f32> {
        let dh = self.head_dim;
        let mut out = vec![0.0f32; q.len()];
        // Tasks of whole (token, head) rows, enough work each that scheduling is noise.
        let seen = keys.len() / (self.kv_heads * dh).max(1);
        let rows_per_task = (16 * 1024 / (seen * dh).max(1)).max(1);
        let mut tasks: Vec<(usize, &mut [f32])> = out
            .chunks_mut(rows_per_task * dh)
            .enumerate()
            .map(|(task, rows)| (task * rows_per_task, rows))
            .collect();
        let wide = has_avx2();
        team::for_each_mut(&mut tasks, |(first, rows)| {
            if wide {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the CPU has AVX2 (`has_avx2`).
                unsafe {
                    self.rows_avx2(*first, rows, q, keys, values)
                };
            } else {
                self.rows(*first, rows, q, keys, values);
            }
        });
        out
    }

    /// [`Self::rows`] compiled with AVX2.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn rows_avx2(
        &self,
        first: usize,
        out: &mut [f32],
        q: &[f32],
        keys: &[f32],
        values: &[f32],
    ) {
        self.rows(first, out, q, keys, values);
    }

    /// Rows `first..` of the output (row `i`: token `i / H`, head `i % H`), `Dh` values each.
    #[inline(always)]
    fn rows(&self, first: usize, out: &mut [f32], q: &[f32], keys: &[f32], values: &[f32]) {
        let (h, dh) = (self.heads, self.head_dim);
        let group = h / self.kv_heads.max(1);
        let kv_width = self.kv_heads * dh;
        let scale = 1.0 / (dh as f32).sqrt();
        let mut scores: Vec<f32> = Vec::new();
        for (i, out) in (first..).zip(out.chunks_exact_mut(dh)) {
            let (token, head) = (i / h, i % h);
            let g = head / group;
            let query = &q[i * dh..(i + 1) * dh];
            let visible = self.past + token + 1;
            let oldest = self.window.map_or(0, |w| visible.saturating_sub(w));
            // Position j's values of key/value head g (score s of key oldest + s).
            let at = |j: usize| j * kv_width + g * dh..j * kv_width + (g + 1) * dh;
            // Plain loops: iterator adaptors (`extend`, `fold`, `for_each`) can stay calls of
            // their own, compiled without AVX2.
            scores.resize(visible - oldest, 0.0);
            let mut max = f32::NEG_INFINITY;
            for (j, s) in (oldest..).zip(scores.iter_mut()) {
                *s = scale * dot(query, &keys[at(j)]);
                max = max.max(*s);
            }
            let mut total = 0.0;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                total += *s;
            }
            for (j, &p) in (oldest..).zip(scores.iter()) {
                let weight = p / total;
                for (o, v) in out.iter_mut().zip(&values[at(j)]) {
                    *o += weight * v;
                }
            }
        }
    }
}

/// `Σ a·b` in eight independent lanes (one vector register with AVX2; a single running sum would
/// be one chain of dependent adds), the lanes then added in order, then the tail.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 8;
    let mut lanes = [0.0f32; LANES];
    let (a_chunks, b_chunks) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let mut tail = 0.0f32;
    for (x, y) in a_chunks.remainder().iter().zip(b_chunks.remainder()) {
        tail += x * y;
    }
    for (x, y) in a_chunks.zip(b_chunks) {
        for i in 0..LANES {
            lanes[i] += x[i] * y[i];
        }
    }
    let mut sum = 0.0f32;
    for lane in lanes {
        sum += lane;
    }
    sum + tail
}

/// Whether the AVX2 build of the rows runs here.
fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = SplitMix64(seed);
        (0..n).map(|_| rng.next_f64() as f32 * 4.0 - 2.0).collect()
    }

    /// A direct evaluation in f64: softmax over the visible keys, values weighted.
    fn reference(a: &CachedAttention, q: &[f32], keys: &[f32], values: &[f32]) -> Vec<f64> {
        let (h, dh) = (a.heads, a.head_dim);
        let kv = a.kv_heads * dh;
        let mut out = vec![0.0; q.len()];
        for (i, row) in out.chunks_exact_mut(dh).enumerate() {
            let (token, head) = (i / h, i % h);
            let g = head / (h / a.kv_heads);
            let query = &q[i * dh..(i + 1) * dh];
            let visible = a.past + token + 1;
            let oldest = a.window.map_or(0, |w| visible.saturating_sub(w));
            let scores: Vec<f64> = (oldest..visible)
                .map(|j| {
                    let key = &keys[j * kv + g * dh..j * kv + (g + 1) * dh];
                    let s: f64 = query
                        .iter()
                        .zip(key)
                        .map(|(x, y)| *x as f64 * *y as f64)
                        .sum();
                    s / (dh as f64).sqrt()
                })
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            for (j, w) in (oldest..).zip(&weights) {
                let value = &values[j * kv + g * dh..j * kv + (g + 1) * dh];
                for (o, v) in row.iter_mut().zip(value) {
                    *o += w / total * *v as f64;
                }
            }
        }
        out
    }

    #[test]
    fn every_build_of_the_rows_is_causal_grouped_attention_with_the_same_bits() {
        // Heads 4 over 2 key/value heads, Dh 12 (a tail after the eight lanes) and 64; one
        // token after 9 cached and 5 tokens after 3; a window of 4 that hides the oldest keys.
        for (dh, past, t, window) in [
            (12, 9, 1, None),
            (64, 3, 5, None),
            (64, 0, 7, None),
            (12, 9, 1, Some(4)),
            (64, 3, 5, Some(4)),
        ] {
            let a = CachedAttention {
                heads: 4,
                kv_heads: 2,
                head_dim: dh,
                past,
                window,
            };
            let s = past + t;
            let q = random(t * 4 * dh, 1);
            let (keys, values) = (random(s * 2 * dh, 2), random(s * 2 * dh, 3));
            let got = a.run(&q, &keys, &values);
            let want = reference(&a, &q, &keys, &values);
            for (g, w) in got.iter().zip(&want) {
                assert!((*g as f64 - w).abs() < 1e-5, "Dh {dh}: {g} vs {w}");
            }
            // The portable build, row by row, gives the run's bits (the AVX2 build where the
            // CPU has it).
            let mut portable = vec![0.0f32; q.len()];
            a.rows(0, &mut portable, &q, &keys, &values);
            assert!(
                portable
                    .iter()
                    .zip(&got)
                    .all(|(p, g)| p.to_bits() == g.to_bits()),
                "Dh {dh}: the builds differ"
            );
        }
    }
}
