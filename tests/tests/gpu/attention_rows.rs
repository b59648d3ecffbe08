//! Generation's attention over the KV cache in one launch on the GPU
//! (`kernels/gpu/attention_rows.rs`): the values of an f64 attention and of burn's ops (the eager
//! path of `model/attention.rs` on wgpu) for grouped and ungrouped heads, head sizes below, at
//! and above the kernel's 64 units, caches of 1 to 300 keys, one new token and four with a
//! causal mask, two batch rows with masks of their own, strided queries and keys; what it does
//! not take (tracked, too many rows) is left to burn's ops.

use burn::tensor::activation::softmax;
use burn::tensor::{Distribution, Tensor, TensorData};
use napkin_core::config::MASKED;
use napkin_core::kernels::gpu::attention_rows::{ROWS_IN_ONE_LAUNCH, few_rows};
use napkin_core::kernels::values::to_f32_vec;

use super::{ONE_AT_A_TIME, wgpu_device};

/// One case: batch rows, query heads, K/V heads, head size, cached keys before the new
/// tokens, new tokens.
struct Case {
    b: usize,
    h: usize,
    hkv: usize,
    dh: usize,
    past: usize,
    t: usize,
}

/// The additive mask `[B, 1, T, S]`: new token `i` of batch row `r` sees keys
/// `0..=past + i` minus the first `r` (a left-padded row).
fn mask_values(c: &Case) -> Vec<f32> {
    let s = c.past + c.t;
    (0..c.b)
        .flat_map(|r| {
            (0..c.t).flat_map(move |i| {
                (0..s).map(move |j| if j > c.past + i || j < r { MASKED } else { 0.0 })
            })
        })
        .collect()
}

/// The attention in f64 → `[B, T, H·Dh]`, from row-major `q` `[B, H, T, Dh]`, `k`, `v`
/// `[B, Hkv, S, Dh]`, `mask` `[B, 1, T, S]`.
fn reference(c: &Case, q: &[f32], k: &[f32], v: &[f32], mask: &[f32]) -> Vec<f64> {
    let s = c.past + c.t;
    let group = c.h / c.hkv;
    let scale = 1.0 / (c.dh as f64).sqrt();
    let mut out = vec![0f64; c.b * c.t * c.h * c.dh];
    for b in 0..c.b {
        for h in 0..c.h {
            let g = h / group;
            for t in 0..c.t {
                let q_row = &q[((b * c.h + h) * c.t + t) * c.dh..][..c.dh];
                let scores: Vec<f64> = (0..s)
                    .map(|j| {
                        let key = &k[((b * c.hkv + g) * s + j) * c.dh..][..c.dh];
                        let dot: f64 = q_row
                            .iter()
                            .zip(key)
                            .map(|(&x, &y)| x as f64 * y as f64)
                            .sum();
                        dot * scale + mask[(b * c.t + t) * s + j] as f64
                    })
                    .collect();
                let top = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|x| (x - top).exp()).collect();
                let total: f64 = e.iter().sum();
                for d in 0..c.dh {
                    let value: f64 = (0..s)
                        .map(|j| e[j] / total * v[((b * c.hkv + g) * s + j) * c.dh + d] as f64)
                        .sum();
                    out[((b * c.t + t) * c.h + h) * c.dh + d] = value;
                }
            }
        }
    }
    out
}

/// burn's ops as the eager path runs them → `[B, T, H·Dh]`.
fn burn_ops(c: &Case, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, mask: Tensor<4>) -> Tensor<3> {
    let s = c.past + c.t;
    let group = c.h / c.hkv;
    let q = q.reshape([c.b, c.hkv, group * c.t, c.dh]);
    let scores = q.matmul(k.swap_dims(2, 3)) * (c.dh as f64).powf(-0.5);
    let scores = scores.reshape([c.b, c.h, c.t, s]) + mask;
    let probs = softmax(scores, 3).reshape([c.b, c.hkv, group * c.t, s]);
    probs
        .matmul(v)
        .reshape([c.b, c.h, c.t, c.dh])
        .swap_dims(1, 2)
        .reshape([c.b, c.t, c.h * c.dh])
}

#[test]
fn attention_of_a_few_new_tokens_in_one_launch_equals_burns_ops_and_an_f64_attention() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device();
    device.seed(5);
    let cases = [
        // SmolLM2-135M's heads (9 over 3 K/V heads of 64), a decoded token.
        Case {
            b: 1,
            h: 9,
            hkv: 3,
            dh: 64,
            past: 0,
            t: 1,
        },
        Case {
            b: 1,
            h: 9,
            hkv: 3,
            dh: 64,
            past: 99,
            t: 1,
        },
        Case {
            b: 1,
            h: 9,
            hkv: 3,
            dh: 64,
            past: 296,
            t: 4,
        },
        // tiny-smol-like heads of 16; TinyLlama's 32 over 4; heads wider than 64 units.
        Case {
            b: 1,
            h: 6,
            hkv: 2,
            dh: 16,
            past: 7,
            t: 1,
        },
        Case {
            b: 1,
            h: 32,
            hkv: 4,
            dh: 64,
            past: 40,
            t: 2,
        },
        Case {
            b: 1,
            h: 4,
            hkv: 4,
            dh: 128,
            past: 63,
            t: 1,
        },
        // Two batch rows with masks of their own.
        Case {
            b: 2,
            h: 4,
            hkv: 2,
            dh: 32,
            past: 20,
            t: 2,
        },
    ];
    let mut worst_reference = 0f64;
    let mut worst_burn = 0f64;
    for c in &cases {
        let s = c.past + c.t;
        // q as the model hands it over: heads split off `[B, T, H·Dh]`, a strided view.
        let q = Tensor::<3>::random(
            [c.b, c.t, c.h * c.dh],
            Distribution::Normal(0.0, 2.0),
            &device,
        )
        .reshape([c.b, c.t, c.h, c.dh])
        .swap_dims(1, 2);
        // Keys strided too (the transpose of a `[Dh, S]` per head); values contiguous.
        let k = Tensor::<4>::random(
            [c.b, c.hkv, c.dh, s],
            Distribution::Normal(0.0, 2.0),
            &device,
        )
        .swap_dims(2, 3);
        let v = Tensor::<4>::random(
            [c.b, c.hkv, s, c.dh],
            Distribution::Normal(0.0, 1.0),
            &device,
        );
        let mask_host = mask_values(c);
        let mask = Tensor::<4>::from_data(
            TensorData::new(mask_host.clone(), [c.b, 1, c.t, s]),
            &device,
        );
        let fused = few_rows(&q, &k, &v, &mask).expect("a few untracked f32 rows on wgpu");
        assert_eq!(fused.dims(), [c.b, c.t, c.h * c.dh]);
        let fused = to_f32_vec(fused);
        let by_burn = to_f32_vec(burn_ops(c, q.clone(), k.clone(), v.clone(), mask));
        let v_host = to_f32_vec(v);
        let exact = reference(c, &to_f32_vec(q), &to_f32_vec(k), &v_host, &mask_host);
        // The values' sum's scale: the largest |v| of the head (the output is a weighted mean).
        let scale = v_host.iter().fold(0f64, |m, &x| m.max(x.abs() as f64));
        for ((&y, &z), &e) in fused.iter().zip(&by_burn).zip(&exact) {
            worst_reference = worst_reference.max((y as f64 - e).abs() / scale);
            worst_burn = worst_burn.max((y - z).abs() as f64 / scale);
        }
    }
    eprintln!(
        "attention of a few new tokens in one launch: worst error {worst_reference:.1e} of the \
         values' largest magnitude against f64, {worst_burn:.1e} against burn's ops"
    );
    assert!(worst_reference < 1e-5, "{worst_reference:e} against f64");
    assert!(worst_burn < 1e-5, "{worst_burn:e} against burn's ops");
}

#[test]
fn tracked_queries_and_longer_ones_keep_burns_ops() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device();
    let kv = |d: &burn::tensor::Device| Tensor::<4>::ones([1, 2, 8, 16], d);
    let t = ROWS_IN_ONE_LAUNCH + 1;
    let long = Tensor::<4>::ones([1, 4, t, 16], &device);
    let mask = Tensor::<4>::zeros([1, 1, t, 8], &device);
    assert!(
        few_rows(&long, &kv(&device), &kv(&device), &mask).is_none(),
        "more new tokens than one launch takes"
    );
    let train = device.autodiff();
    let mask = Tensor::<4>::zeros([1, 1, 1, 8], &train);
    let tracked = Tensor::<4>::ones([1, 4, 1, 16], &train).require_grad();
    assert!(
        few_rows(&tracked, &kv(&train), &kv(&train), &mask).is_none(),
        "queries that need a gradient"
    );
    let untracked = Tensor::<4>::ones([1, 4, 1, 16], &train);
    let y = few_rows(&untracked, &kv(&train), &kv(&train), &mask)
        .expect("untracked rows on the autodiff device");
    assert!(
        y.is_autodiff(),
        "the result comes back on the autodiff device"
    );
}
