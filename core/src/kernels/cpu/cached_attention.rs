//! Causal grouped-query attention of a few new queries over a KV cache on the host: generation's
//! attention (`model/quantized_llama.rs`), split over the team's threads by (token, head) rows.
//!
//! The cache is laid out for the two inner loops ([`HostKv`]):
//! - keys in tiles of eight positions, `[Dh, 8]` a tile (one dimension's eight positions side by
//!   side), so that a query's value times one 8-wide row of a tile adds to eight scores at once:
//!   no horizontal sum per dot product, and the scores come out as vectors for the softmax;
//! - values position-major, `[S, Dh]`, so that eight output dimensions accumulate in one
//!   register over all positions.
//!
//! Each row is scores `q·k / √Dh` over the keys it sees (four tiles side by side: four independent
//! chains of adds), a softmax (`fused/exp.rs`'s vectorized `exp`), and the values weighted
//! by it, in f32. The same source is compiled twice: for the baseline x86-64 (SSE2: each 8-lane
//! step as two 4-wide halves) and with AVX2 (one 8-wide register), picked at run time. Both do the
//! same operations on the same lanes in the same order (no fused multiply-add, no reassociation),
//! so they give the same bits, and a row's bits do not depend on how many tokens are new (scoring
//! a text equals decoding it token by token).

use super::fused::exp::exp_in_place;
use super::team;

/// Positions a key tile holds.
const TILE: usize = 8;

/// Eight f32 lanes: one AVX2 register, two SSE2 ones.
type Lanes = [f32; TILE];

/// One block's cached keys and values, every key/value head's apart (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct HostKv {
    kv_heads: usize,
    head_dim: usize,
    len: usize,
    /// Per key/value head: tiles of [`TILE`] positions, `[⌈S/8⌉, Dh]` rows of eight lanes
    /// (positions), positions past `len` zero.
    keys: Vec<Vec<Lanes>>,
    /// Per key/value head: `[S, Dh]`.
    values: Vec<Vec<f32>>,
}

impl HostKv {
    /// An empty cache for `kv_heads` heads of `head_dim` values.
    pub fn new(kv_heads: usize, head_dim: usize) -> Self {
        Self {
            kv_heads,
            head_dim,
            len: 0,
            keys: vec![Vec::new(); kv_heads],
            values: vec![Vec::new(); kv_heads],
        }
    }

    /// Positions cached.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends the new tokens' keys (RoPE applied) and values.
    ///
    /// # Shapes
    /// - `keys`, `values`: `[T, Hkv·Dh]`
    pub fn append(&mut self, keys: &[f32], values: &[f32]) {
        let dh = self.head_dim;
        let width = self.kv_heads * dh;
        for (k_row, v_row) in keys.chunks_exact(width).zip(values.chunks_exact(width)) {
            let (tile, lane) = (self.len / TILE, self.len % TILE);
            for g in 0..self.kv_heads {
                let tiles = &mut self.keys[g];
                if lane == 0 {
                    tiles.resize((tile + 1) * dh, [0.0; TILE]);
                }
                for (row, &k) in tiles[tile * dh..]
                    .iter_mut()
                    .zip(&k_row[g * dh..(g + 1) * dh])
                {
                    row[lane] = k;
                }
                self.values[g].extend_from_slice(&v_row[g * dh..(g + 1) * dh]);
            }
            self.len += 1;
        }
    }

    /// The bytes the cache's values take (the tiles' zero padding included).
    pub fn bytes(&self) -> usize {
        let keys: usize = self.keys.iter().map(Vec::len).sum();
        let values: usize = self.values.iter().map(Vec::len).sum();
        (keys * TILE + values) * size_of::<f32>()
    }
}

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
    /// - `q`: `[T, H·Dh]`; `cache` holds `S ≥ past + T` positions, the new tokens' already in
    ///   → `[T, H·Dh]`
    pub fn run(&self, q: &[f32], cache: &HostKv) -> Vec<f32> {
        let dh = self.head_dim;
        let mut out = vec![0.0f32; q.len()];
        // Tasks of whole (token, head) rows, enough work each that scheduling is noise.
        let rows_per_task = (16 * 1024 / (cache.len() * dh).max(1)).max(1);
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
                    self.rows_avx2(*first, rows, q, cache)
                };
            } else {
                self.rows(*first, rows, q, cache);
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
    unsafe fn rows_avx2(&self, first: usize, out: &mut [f32], q: &[f32], cache: &HostKv) {
        self.rows(first, out, q, cache);
    }

    /// Rows `first..` of the output (row `i`: token `i / H`, head `i % H`), `Dh` values each.
    #[inline(always)]
    fn rows(&self, first: usize, out: &mut [f32], q: &[f32], cache: &HostKv) {
        let (h, dh) = (self.heads, self.head_dim);
        let group = h / self.kv_heads.max(1);
        let scale = 1.0 / (dh as f32).sqrt();
        let mut scores: Vec<[f32; TILE]> = Vec::new();
        for (i, out) in (first..).zip(out.chunks_exact_mut(dh)) {
            let (token, head) = (i / h, i % h);
            let g = head / group;
            let (keys, values) = (&cache.keys[g], &cache.values[g]);
            let query = &q[i * dh..(i + 1) * dh];
            let visible = self.past + token + 1;
            let oldest = self.window.map_or(0, |w| visible.saturating_sub(w));
            let (first_tile, end_tile) = (oldest / TILE, visible.div_ceil(TILE));

            // Scores, eight positions a vector, four tiles at a time.
            scores.clear();
            let tiles = &keys[first_tile * dh..end_tile * dh];
            let mut quads = tiles.chunks_exact(4 * dh);
            for quad in quads.by_ref() {
                let (t01, t23) = quad.split_at(2 * dh);
                let ((t0, t1), (t2, t3)) = (t01.split_at(dh), t23.split_at(dh));
                let mut acc = [[0.0f32; TILE]; 4];
                for ((((&x, r0), r1), r2), r3) in query.iter().zip(t0).zip(t1).zip(t2).zip(t3) {
                    add_scaled(&mut acc[0], x, r0);
                    add_scaled(&mut acc[1], x, r1);
                    add_scaled(&mut acc[2], x, r2);
                    add_scaled(&mut acc[3], x, r3);
                }
                scores.extend_from_slice(&acc);
            }
            for tile in quads.remainder().chunks_exact(dh) {
                let mut acc = [0.0f32; TILE];
                for (&x, row) in query.iter().zip(tile) {
                    add_scaled(&mut acc, x, row);
                }
                scores.push(acc);
            }

            // Softmax over the positions oldest..visible: the first and last tiles' other
            // lanes are −∞, which `fast_exp` makes 0. Lane-wise maxima and sums (vectors),
            // then the lanes in order.
            let base = first_tile * TILE;
            let flat = scores.as_flattened_mut();
            let (head_end, tail_start) = (oldest - base, visible - base);
            flat[..head_end].fill(f32::NEG_INFINITY);
            flat[tail_start..].fill(f32::NEG_INFINITY);
            let mut maxima = [f32::NEG_INFINITY; TILE];
            for s in scores.iter_mut() {
                for l in 0..TILE {
                    s[l] *= scale;
                    maxima[l] = maxima[l].max(s[l]);
                }
            }
            let mut max = f32::NEG_INFINITY;
            for m in maxima {
                max = max.max(m);
            }
            exp_in_place(scores.as_flattened_mut(), max, 1.0);
            let mut totals = [0.0f32; TILE];
            for s in scores.iter() {
                for l in 0..TILE {
                    totals[l] += s[l];
                }
            }
            let mut total = 0.0f32;
            for lane in totals {
                total += lane;
            }
            let inverse = 1.0 / total;
            for p in scores.as_flattened_mut() {
                *p *= inverse;
            }

            // Values: 32 output dimensions in four registers over every position seen, then
            // 8 in one, then one at a time.
            let weights = &scores.as_flattened()[head_end..tail_start];
            let rows = &values[oldest * dh..visible * dh];
            let mut c = 0;
            while c + 4 * TILE <= dh {
                let acc: [Lanes; 4] = weighted_sum(weights, rows, dh, c);
                out[c..c + 4 * TILE].copy_from_slice(acc.as_flattened());
                c += 4 * TILE;
            }
            while c + TILE <= dh {
                let acc: [Lanes; 1] = weighted_sum(weights, rows, dh, c);
                out[c..c + TILE].copy_from_slice(acc.as_flattened());
                c += TILE;
            }
            for c in c..dh {
                let mut acc = 0.0f32;
                for (&w, row) in weights.iter().zip(rows.chunks_exact(dh)) {
                    acc += w * row[c];
                }
                out[c] = acc;
            }
        }
    }
}

/// `acc += x·row`, lane by lane.
#[inline(always)]
fn add_scaled(acc: &mut Lanes, x: f32, row: &Lanes) {
    for l in 0..TILE {
        acc[l] += x * row[l];
    }
}

/// `Σ_p w_p · rows[p][from..from + 8N]` in N independent registers (N chains of adds).
///
/// # Shapes
/// - `weights`: `[P]`; `rows`: `[P, Dh]` → `[N, 8]`
#[inline(always)]
fn weighted_sum<const N: usize>(
    weights: &[f32],
    rows: &[f32],
    dh: usize,
    from: usize,
) -> [Lanes; N] {
    let mut acc = [[0.0f32; TILE]; N];
    for (&w, row) in weights.iter().zip(rows.chunks_exact(dh)) {
        let (part, _) = row[from..from + N * TILE].as_chunks::<TILE>();
        for (acc, v) in acc.iter_mut().zip(part) {
            add_scaled(acc, w, v);
        }
    }
    acc
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

    /// A direct evaluation in f64 on `[S, Hkv·Dh]` keys and values: softmax over the visible
    /// keys, values weighted.
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
        // token after 9 cached, 5 tokens after 3, 7 from nothing, 3 after 38 (whole groups of
        // four tiles and a remainder); windows of 4 and 11 that hide the oldest keys, inside a
        // tile and across tiles.
        for (dh, past, t, window) in [
            (12, 9, 1, None),
            (64, 3, 5, None),
            (64, 0, 7, None),
            (64, 38, 3, None),
            (12, 9, 1, Some(4)),
            (64, 3, 5, Some(4)),
            (64, 38, 3, Some(11)),
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
            let mut cache = HostKv::new(2, dh);
            cache.append(&keys[..past * 2 * dh], &values[..past * 2 * dh]);
            cache.append(&keys[past * 2 * dh..], &values[past * 2 * dh..]);
            let got = a.run(&q, &cache);
            let want = reference(&a, &q, &keys, &values);
            for (g, w) in got.iter().zip(&want) {
                assert!((*g as f64 - w).abs() < 1e-5, "Dh {dh}: {g} vs {w}");
            }
            // The portable build, row by row, gives the run's bits (the AVX2 build where the
            // CPU has it).
            let mut portable = vec![0.0f32; q.len()];
            a.rows(0, &mut portable, &q, &cache);
            assert!(
                portable
                    .iter()
                    .zip(&got)
                    .all(|(p, g)| p.to_bits() == g.to_bits()),
                "Dh {dh}: the builds differ"
            );
            // Each new token alone, as decoding runs them, gives the same bits as all at once.
            for token in 0..t {
                let alone = CachedAttention {
                    past: past + token,
                    ..a
                };
                let row = 4 * dh;
                let mut prefix = HostKv::new(2, dh);
                let end = (past + token + 1) * 2 * dh;
                prefix.append(&keys[..end], &values[..end]);
                let one = alone.run(&q[token * row..(token + 1) * row], &prefix);
                assert!(
                    one.iter()
                        .zip(&got[token * row..(token + 1) * row])
                        .all(|(x, y)| x.to_bits() == y.to_bits()),
                    "Dh {dh}: token {token} alone differs"
                );
            }
        }
    }

    #[test]
    fn the_cache_keeps_eight_positions_a_key_tile() {
        let (dh, kv) = (3, 2);
        let mut cache = HostKv::new(kv, dh);
        let rows: Vec<f32> = (0..9 * kv * dh).map(|x| x as f32).collect();
        cache.append(&rows, &rows);
        assert_eq!(cache.len(), 9);
        // Two tiles a head, position 8 the second tile's first lane; values position-major.
        assert_eq!(cache.keys[1].len(), 2 * dh);
        assert_eq!(cache.keys[1][dh + 1][0], rows[8 * kv * dh + dh + 1]);
        assert_eq!(
            cache.values[1][8 * dh..],
            rows[8 * kv * dh + dh..9 * kv * dh]
        );
        assert_eq!(cache.bytes(), (2 * 2 * dh * TILE + 2 * 9 * dh) * 4);
    }
}
