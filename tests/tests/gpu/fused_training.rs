//! Training's fused RMSNorm, RoPE and SwiGLU on the GPU (`kernels/gpu/fused/`), forward and
//! backward, against burn's ops (the formula op by op on the same device) and against f64 on
//! the host: widths that are and are not multiples of the kernels' 64 units, one row and many,
//! a strided input, a trainable and a frozen gain, gates from −12 to 12, odd head counts and
//! narrow heads at scattered positions, and both ways the
//! backward writes its result (over the incoming buffers, or into new ones when something else
//! holds them). Each case checks by the kernels' launch counter that they ran, and that the
//! reference did not. RoPE equals burn's ops to the bit (the same products and sums).

use burn::tensor::activation::silu;
use burn::tensor::{Device, Distribution, Tensor};
use napkin_core::kernels::gpu::fused::launches;
use napkin_core::kernels::gpu::fused::rope::rope_heads;
use napkin_core::kernels::values::to_f32_vec;
use napkin_core::kernels::{rms_norm, swiglu};
use napkin_core::model::matmul_wt::matmul_wt;
use napkin_core::model::rope::RopeTables;

use super::{ONE_AT_A_TIME, wgpu_device};

const EPS: f64 = 1e-5;

/// The largest `|a − e|` over the values, relative to the largest `|e|` (the error of a
/// normwise comparison; a value-by-value ratio would judge a sum that cancels against its own
/// tiny result).
fn worst(a: &[f32], exact: &[f64]) -> f64 {
    assert_eq!(a.len(), exact.len());
    let scale = exact.iter().fold(0f64, |m, e| m.max(e.abs()));
    let diff = a
        .iter()
        .zip(exact)
        .fold(0f64, |m, (&a, &e)| m.max((a as f64 - e).abs()));
    diff / scale
}

/// Three figures as `a, b, c` in scientific notation.
fn three(v: &[f64; 3]) -> String {
    format!("{:.1e}, {:.1e}, {:.1e}", v[0], v[1], v[2])
}

/// RMSNorm and its gradients in f64 for rows of `dim`, given the upstream gradient `dy`:
/// `(y, ∂x, ∂w)`.
fn rms_norm_f64(x: &[f32], w: &[f32], dy: &[f32], dim: usize) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut y, mut dx, mut dw) = (vec![], vec![], vec![0f64; dim]);
    for (row, grad) in x.chunks(dim).zip(dy.chunks(dim)) {
        let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / dim as f64;
        let r = 1.0 / (ms + EPS).sqrt();
        let dot: f64 = (0..dim)
            .map(|i| w[i] as f64 * grad[i] as f64 * row[i] as f64)
            .sum();
        for i in 0..dim {
            let (v, g, wi) = (row[i] as f64, grad[i] as f64, w[i] as f64);
            y.push(wi * v * r);
            dx.push(r * wi * g - v * r.powi(3) * dot / dim as f64);
            dw[i] += g * v * r;
        }
    }
    (y, dx, dw)
}

/// One RMSNorm case run fused or as burn's ops: `(y, ∂x, ∂w)` as f32 values. With `shared`, the
/// norm's output is added to a tracked zero tensor, so the gradient that reaches the norm is
/// also the other operand's (the backward then cannot write over it).
fn run_rms_norm(
    x0: &Tensor<3>,
    w0: &Tensor<1>,
    up: &Tensor<3>,
    fused: bool,
    gain_trains: bool,
    shared: bool,
) -> (Vec<f32>, Vec<f32>, Option<Vec<f32>>) {
    let x = x0.clone().require_grad();
    let w = if gain_trains {
        w0.clone().require_grad()
    } else {
        w0.clone()
    };
    let y = if fused {
        rms_norm(x.clone(), w.clone(), EPS)
    } else {
        let inv = (x.clone().square().mean_dim(2) + EPS).sqrt().recip();
        w.clone().unsqueeze::<3>() * (x.clone() * inv)
    };
    let out = match shared {
        true => y.clone() + Tensor::zeros(y.dims(), &y.device()).require_grad(),
        false => y.clone(),
    };
    let grads = (out * up.clone()).sum().backward();
    let dx = x.grad(&grads).expect("∂x");
    let dw = w.grad(&grads).map(to_f32_vec);
    (to_f32_vec(y.inner()), to_f32_vec(dx), dw)
}

/// A `[b, t, dim]` input, strided when `transposed` (the transpose of a `[t, b, dim]` one).
fn input(device: &Device, [b, t, dim]: [usize; 3], transposed: bool) -> Tensor<3> {
    let normal = Distribution::Normal(0.5, 2.0);
    match transposed {
        true => Tensor::<3>::random([t, b, dim], normal, device).swap_dims(0, 1),
        false => Tensor::<3>::random([b, t, dim], normal, device),
    }
}

#[test]
fn fused_rms_norm_forward_and_backward_equal_burns_ops_and_f64() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device().autodiff();
    device.seed(21);
    let (mut vs_f64, mut vs_burn) = ([0f64; 3], [0f64; 3]);
    let shapes = [
        [1, 1, 64],
        [2, 37, 80],
        [3, 5, 1000],
        [1, 3, 576],
        [2, 4, 7],
    ];
    for (case, shape) in shapes.into_iter().enumerate() {
        let dim = shape[2];
        let x0 = input(&device, shape, case % 2 == 1);
        let w0 = Tensor::<1>::random([dim], Distribution::Normal(1.0, 0.3), &device);
        let up = Tensor::<3>::random(shape, Distribution::Normal(0.0, 1.0), &device);
        let (x, w, dy) = (
            to_f32_vec(x0.clone()),
            to_f32_vec(w0.clone()),
            to_f32_vec(up.clone()),
        );
        let (y64, dx64, dw64) = rms_norm_f64(&x, &w, &dy, dim);
        for gain_trains in [true, false] {
            for shared in [false, true] {
                let before = launches();
                let (y, dx, dw) = run_rms_norm(&x0, &w0, &up, true, gain_trains, shared);
                let ran = launches() - before;
                let expected = if gain_trains { 3 } else { 2 };
                assert_eq!(ran, expected, "{shape:?}: fused launches (forward, ∂w, ∂x)");
                let before = launches();
                let (y_ref, dx_ref, dw_ref) =
                    run_rms_norm(&x0, &w0, &up, false, gain_trains, shared);
                assert_eq!(launches(), before, "{shape:?}: the reference is burn's ops");
                let what = format!("{shape:?}, gain trains {gain_trains}, shared ∂y {shared}");
                let exact = [
                    worst(&y, &y64),
                    worst(&dx, &dx64),
                    dw.as_ref().map_or(0.0, |dw| worst(dw, &dw64)),
                ];
                let to_f64 = |v: &[f32]| v.iter().map(|&v| v as f64).collect::<Vec<_>>();
                let burn = [
                    worst(&y, &to_f64(&y_ref)),
                    worst(&dx, &to_f64(&dx_ref)),
                    match (&dw, &dw_ref) {
                        (Some(dw), Some(dw_ref)) => worst(dw, &to_f64(dw_ref)),
                        (None, None) => 0.0,
                        _ => panic!("{what}: ∂w on one side only"),
                    },
                ];
                assert_eq!(dw.is_some(), gain_trains, "{what}");
                for k in 0..3 {
                    vs_f64[k] = vs_f64[k].max(exact[k]);
                    vs_burn[k] = vs_burn[k].max(burn[k]);
                }
            }
        }
    }
    eprintln!(
        "fused RMSNorm on the GPU, worst relative error (y, ∂x, ∂w): against f64 {}, \
         against burn's ops {}",
        three(&vs_f64),
        three(&vs_burn)
    );
    for (k, name) in ["y", "∂x", "∂w"].into_iter().enumerate() {
        assert!(vs_f64[k] < 1e-5, "{name}: {:e} against f64", vs_f64[k]);
        assert!(
            vs_burn[k] < 1e-5,
            "{name}: {:e} against burn's ops",
            vs_burn[k]
        );
    }
}

/// One SwiGLU case fused or as burn's ops: `(h, ∂g, ∂u)`. With `held`, a copy of the gate's
/// handle is alive through the backward, so it cannot write `∂g` over the gate.
fn run_swiglu(
    g0: &Tensor<3>,
    u0: &Tensor<3>,
    up: &Tensor<3>,
    fused: bool,
    held: bool,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    // `* 1`: tracked inputs that are produced by an op, as the projections' outputs are.
    let (g_leaf, u_leaf) = (g0.clone().require_grad(), u0.clone().require_grad());
    let (g, u) = (g_leaf.clone() * 1.0, u_leaf.clone() * 1.0);
    let holder = held.then(|| g.clone().inner());
    let h = match fused {
        true => swiglu(g, u),
        false => silu(g) * u,
    };
    let grads = (h.clone() * up.clone()).sum().backward();
    drop(holder);
    let dg = g_leaf.grad(&grads).expect("∂g");
    let du = u_leaf.grad(&grads).expect("∂u");
    (to_f32_vec(h.inner()), to_f32_vec(dg), to_f32_vec(du))
}

#[test]
fn fused_swiglu_forward_and_backward_equal_burns_ops_and_f64() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device().autodiff();
    device.seed(22);
    let (mut vs_f64, mut vs_burn) = ([0f64; 3], [0f64; 3]);
    for (case, shape) in [[1, 1, 64], [2, 37, 160], [1, 3, 1536], [3, 2, 7]]
        .into_iter()
        .enumerate()
    {
        let [b, t, f] = shape;
        let g0 = match case % 2 == 1 {
            true => Tensor::<3>::random([t, b, f], Distribution::Uniform(-12.0, 12.0), &device)
                .swap_dims(0, 1),
            false => Tensor::<3>::random(shape, Distribution::Uniform(-12.0, 12.0), &device),
        };
        let u0 = Tensor::<3>::random(shape, Distribution::Normal(0.0, 1.0), &device);
        let up = Tensor::<3>::random(shape, Distribution::Normal(0.0, 1.0), &device);
        let (g, u, dh) = (
            to_f32_vec(g0.clone()),
            to_f32_vec(u0.clone()),
            to_f32_vec(up.clone()),
        );
        let mut exact = [vec![], vec![], vec![]];
        for i in 0..g.len() {
            let (g, u, dh) = (g[i] as f64, u[i] as f64, dh[i] as f64);
            let s = 1.0 / (1.0 + (-g).exp());
            exact[0].push(g * s * u);
            exact[1].push(dh * u * s * (1.0 + g * (1.0 - s)));
            exact[2].push(dh * g * s);
        }
        for held in [false, true] {
            let before = launches();
            let fused = run_swiglu(&g0, &u0, &up, true, held);
            assert_eq!(
                launches() - before,
                2,
                "{shape:?}: fused launches (forward, backward)"
            );
            let before = launches();
            let reference = run_swiglu(&g0, &u0, &up, false, held);
            assert_eq!(launches(), before, "{shape:?}: the reference is burn's ops");
            let fused = [fused.0, fused.1, fused.2];
            let reference = [reference.0, reference.1, reference.2];
            for k in 0..3 {
                let burn: Vec<f64> = reference[k].iter().map(|&v| v as f64).collect();
                vs_f64[k] = vs_f64[k].max(worst(&fused[k], &exact[k]));
                vs_burn[k] = vs_burn[k].max(worst(&fused[k], &burn));
            }
        }
    }
    eprintln!(
        "fused SwiGLU on the GPU, worst relative error (h, ∂g, ∂u): against f64 {}, \
         against burn's ops {}",
        three(&vs_f64),
        three(&vs_burn)
    );
    for (k, name) in ["h", "∂g", "∂u"].into_iter().enumerate() {
        assert!(vs_f64[k] < 1e-5, "{name}: {:e} against f64", vs_f64[k]);
        assert!(
            vs_burn[k] < 1e-5,
            "{name}: {:e} against burn's ops",
            vs_burn[k]
        );
    }
}

/// Without autodiff (generation's prompt, checkpointing's graph-free forward) the fused
/// forwards run alone: one launch each, the tracked path's values.
#[test]
fn untracked_fused_forwards_are_one_launch_each() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device();
    device.seed(23);
    let x = Tensor::<3>::random([2, 9, 200], Distribution::Normal(0.0, 2.0), &device);
    let w = Tensor::<1>::random([200], Distribution::Normal(1.0, 0.3), &device);
    let before = launches();
    let y = to_f32_vec(rms_norm(x.clone(), w.clone(), EPS));
    let h = to_f32_vec(swiglu(x.clone(), x.clone() * 0.5));
    assert_eq!(launches() - before, 2, "one launch each");
    let (xs, ws) = (to_f32_vec(x), to_f32_vec(w));
    let (y64, _, _) = rms_norm_f64(&xs, &ws, &vec![0.0; xs.len()], 200);
    let h64: Vec<f64> = xs
        .iter()
        .map(|&g| {
            let g = g as f64;
            g / (1.0 + (-g).exp()) * g * 0.5
        })
        .collect();
    let (ey, eh) = (worst(&y, &y64), worst(&h, &h64));
    assert!(
        ey < 1e-6 && eh < 1e-6,
        "RMSNorm {ey:e}, SwiGLU {eh:e} against f64"
    );
}

/// One RoPE case fused (rotated and split into heads in one launch) or as burn's ops
/// (`RopeTables::apply` on the heads): the rotated heads and `∂x`, as `[B, n, T, Dh]` and
/// `[B, T, n·Dh]` values. With `strided`, the loss reads the heads through a transposed view,
/// so the gradient reaches the backward with other strides (as a product's does).
fn run_rope(
    x0: &Tensor<3>,
    tables: &RopeTables,
    up: &Tensor<4>,
    heads: usize,
    fused: bool,
    strided: bool,
) -> (Vec<f32>, Vec<f32>) {
    let [b, t, width] = x0.dims();
    let leaf = x0.clone().require_grad();
    let x = leaf.clone() * 1.0;
    let heads_of = |y: Tensor<3>| y.reshape([b, t, heads, width / heads]).swap_dims(1, 2);
    let y = match fused {
        true => rope_heads(x, &tables.cos, &tables.sin, heads, burn::tensor::DType::F32)
            .expect("f32 on wgpu"),
        false => tables.apply(heads_of(x)),
    };
    assert_eq!(y.dims(), [b, heads, t, width / heads]);
    let loss = match strided {
        true => (y.clone().swap_dims(1, 2) * up.clone().swap_dims(1, 2)).sum(),
        false => (y.clone() * up.clone()).sum(),
    };
    let grads = loss.backward();
    (
        to_f32_vec(y.inner()),
        to_f32_vec(leaf.grad(&grads).expect("∂x")),
    )
}

#[test]
fn fused_rope_forward_and_backward_equal_burns_ops_and_f64() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device().autodiff();
    device.seed(24);
    let (mut vs_f64, mut vs_burn) = ([0f64; 2], [0f64; 2]);
    // (B, T, heads, Dh): SmolLM2's 64, an odd head count, a narrow head; two batch rows at
    // different positions.
    for (b, t, heads, dh) in [(1, 1, 9, 64), (2, 37, 3, 16), (1, 5, 5, 2)] {
        let inv_freq: Vec<f32> = (0..dh / 2)
            .map(|j| 1.0 / 10_000f32.powf((2 * j) as f32 / dh as f32))
            .collect();
        let positions: Vec<u32> = (0..b * t).map(|i| (i * 97 % 1000) as u32).collect();
        let tables = RopeTables::new(&inv_freq, &positions, b, t, &device);
        let width = heads * dh;
        let x0 = Tensor::<3>::random([b, t, width], Distribution::Normal(0.0, 1.0), &device);
        let up = Tensor::<4>::random([b, heads, t, dh], Distribution::Normal(0.0, 1.0), &device);
        let (x, dy) = (to_f32_vec(x0.clone()), to_f32_vec(up.clone()));
        let (cos, sin) = (
            to_f32_vec(tables.cos.clone()),
            to_f32_vec(tables.sin.clone()),
        );
        // f64: y in [B, n, T, Dh] order, ∂x in [B, T, n·Dh] order.
        let half = dh / 2;
        let (mut y64, mut dx64) = (vec![0f64; x.len()], vec![0f64; x.len()]);
        for bi in 0..b {
            for ti in 0..t {
                let row = bi * t + ti;
                for h in 0..heads {
                    for j in 0..dh {
                        let at = row * width + h * dh + j;
                        let (c, s) = (cos[row * dh + j] as f64, sin[row * dh + j] as f64);
                        let partner = if j < half { at + half } else { at - half };
                        let sign = if j < half { -1.0 } else { 1.0 };
                        let out = ((bi * heads + h) * t + ti) * dh + j;
                        y64[out] = x[at] as f64 * c + sign * x[partner] as f64 * s;
                        // ∂x[at] = ∂y[at]·c + (the partner's ∂y)·(its s) with the sign flipped.
                        let out_partner = if j < half { out + half } else { out - half };
                        let pj = if j < half { j + half } else { j - half };
                        let s_partner = sin[row * dh + pj] as f64;
                        dx64[at] = dy[out] as f64 * c - sign * dy[out_partner] as f64 * s_partner;
                    }
                }
            }
        }
        for strided in [false, true] {
            let before = launches();
            let (y, dx) = run_rope(&x0, &tables, &up, heads, true, strided);
            assert_eq!(
                launches() - before,
                2,
                "({b}, {t}, {heads}, {dh}): fused launches"
            );
            let before = launches();
            let (y_ref, dx_ref) = run_rope(&x0, &tables, &up, heads, false, strided);
            assert_eq!(launches(), before, "the reference is burn's ops");
            let to_f64 = |v: &[f32]| v.iter().map(|&v| v as f64).collect::<Vec<_>>();
            vs_f64[0] = vs_f64[0].max(worst(&y, &y64));
            vs_f64[1] = vs_f64[1].max(worst(&dx, &dx64));
            vs_burn[0] = vs_burn[0].max(worst(&y, &to_f64(&y_ref)));
            vs_burn[1] = vs_burn[1].max(worst(&dx, &to_f64(&dx_ref)));
        }
    }
    eprintln!(
        "fused RoPE on the GPU, worst relative error (y, ∂x): against f64 {:.1e}, {:.1e}, against \
         burn's ops {:.1e}, {:.1e}",
        vs_f64[0], vs_f64[1], vs_burn[0], vs_burn[1]
    );
    for (k, name) in ["y", "∂x"].into_iter().enumerate() {
        assert!(vs_f64[k] < 1e-6, "{name}: {:e} against f64", vs_f64[k]);
        assert!(
            vs_burn[k] < 1e-6,
            "{name}: {:e} against burn's ops",
            vs_burn[k]
        );
    }
}

/// RoPE writing 16-bit heads (the attention under autocast): the f32 rotation rounded once,
/// so bit for bit the f32 kernel's heads cast to f16; and its backward, reading the 16-bit
/// heads' gradient, bit for bit the f32 backward on that gradient widened. One launch each
/// way, no cast.
#[test]
fn fused_rope_writes_16_bit_heads_rounded_once() {
    use burn::tensor::DType;
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device().autodiff();
    device.seed(25);
    for (b, t, heads, dh) in [(1, 7, 9, 64), (2, 37, 3, 16)] {
        let inv_freq: Vec<f32> = (0..dh / 2)
            .map(|j| 1.0 / 10_000f32.powf((2 * j) as f32 / dh as f32))
            .collect();
        let positions: Vec<u32> = (0..b * t).map(|i| (i * 97 % 1000) as u32).collect();
        let tables = RopeTables::new(&inv_freq, &positions, b, t, &device);
        let x0 = Tensor::<3>::random([b, t, heads * dh], Distribution::Normal(0.0, 1.0), &device);
        // The upstream gradient as the 16-bit product would hand it back.
        let up16 = Tensor::<4>::random([b, heads, t, dh], Distribution::Normal(0.0, 1.0), &device)
            .cast(DType::F16);
        let run = |out: DType| {
            let leaf = x0.clone().require_grad();
            let before = launches();
            let y = rope_heads(leaf.clone() * 1.0, &tables.cos, &tables.sin, heads, out)
                .expect("f32 projection on wgpu");
            assert_eq!(y.dtype(), out);
            let up = match out {
                DType::F32 => up16.clone().cast(DType::F32),
                _ => up16.clone(),
            };
            // `sum` of a 16-bit product: its gradient reaches RoPE's backward as 16-bit ones.
            let grads = (y.clone() * up).sum().backward();
            let dx = leaf.grad(&grads).expect("∂x");
            assert_eq!(dx.dtype(), DType::F32, "the projection's gradient is f32");
            let fused = launches() - before;
            (y.inner().cast(DType::F16), to_f32_vec(dx), fused)
        };
        let (y16, dx16, launched16) = run(DType::F16);
        let (y32, dx32, launched32) = run(DType::F32);
        assert_eq!(
            launched16, 2,
            "({b}, {t}, {heads}, {dh}): one launch each way"
        );
        assert_eq!(launched32, 2);
        assert_eq!(
            y16.into_data().try_to_vec::<half::f16>().expect("f16"),
            y32.into_data().try_to_vec::<half::f16>().expect("f16"),
            "({b}, {t}, {heads}, {dh}): the 16-bit heads are the f32 ones rounded once"
        );
        // The 16-bit run's upstream gradient is `up16 · 1` in f16, the f32 run's the same
        // values widened: the backward reads the same numbers.
        assert_eq!(
            dx16, dx32,
            "({b}, {t}, {heads}, {dh}): the backward of 16-bit heads"
        );
    }
}

/// `x · Wᵀ` with its GPU backward (`model/matmul_wt.rs`, which forms `∂W` as `[out, in]`):
/// the values and both gradients of burn's `x.matmul(w.transpose())`, for an odd shape, with
/// both operands trained, and with the weight frozen (no `∂W`).
#[test]
fn x_wt_on_the_gpu_gives_burns_gradients() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device().autodiff();
    device.seed(25);
    let x0 = Tensor::<2>::random([7, 33], Distribution::Normal(0.0, 1.0), &device);
    let w0 = Tensor::<2>::random([19, 33], Distribution::Normal(0.0, 1.0), &device);
    let up = Tensor::<2>::random([7, 19], Distribution::Normal(0.0, 1.0), &device);
    for weight_trains in [true, false] {
        let run = |ours: bool| {
            let x = x0.clone().require_grad();
            let w = match weight_trains {
                true => w0.clone().require_grad(),
                false => w0.clone(),
            };
            let y = match ours {
                true => matmul_wt(x.clone(), w.clone()),
                false => x.clone().matmul(w.clone().transpose()),
            };
            let grads = (y.clone() * up.clone()).sum().backward();
            let dw = w.grad(&grads).map(to_f32_vec);
            (
                to_f32_vec(y.inner()),
                to_f32_vec(x.grad(&grads).expect("∂x")),
                dw,
            )
        };
        let ((y, dx, dw), (y_ref, dx_ref, dw_ref)) = (run(true), run(false));
        let to_f64 = |v: &[f32]| v.iter().map(|&v| v as f64).collect::<Vec<_>>();
        let (ey, edx) = (worst(&y, &to_f64(&y_ref)), worst(&dx, &to_f64(&dx_ref)));
        assert!(ey < 1e-6 && edx < 1e-6, "y {ey:e}, ∂x {edx:e}");
        match (dw, dw_ref) {
            (Some(dw), Some(dw_ref)) => {
                let e = worst(&dw, &to_f64(&dw_ref));
                assert!(e < 1e-6, "∂W {e:e}");
            }
            (None, None) => assert!(!weight_trains),
            _ => panic!("∂W on one side only"),
        }
    }
}

/// The eager attention's fused scale, mask and softmax (`kernels/gpu/fused/softmax.rs`) against
/// burn's `softmax(s·scale + mask)` and f64: a causal mask shared by the batch and one per batch
/// row (packed sequences), rows shorter and longer than the kernel's 64 units, strided scores,
/// and both ways the backward writes.
#[test]
fn fused_softmax_forward_and_backward_equal_burns_ops_and_f64() {
    use burn::tensor::TensorData;
    use napkin_core::config::MASKED;
    use napkin_core::kernels::gpu::fused::softmax::scaled_masked_softmax;
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device().autodiff();
    device.seed(26);
    let (mut vs_f64, mut vs_burn) = ([0f64; 2], [0f64; 2]);
    for (b, h, t, per_row) in [(1, 3, 5, false), (2, 2, 37, true), (1, 1, 130, false)] {
        let scale = 1.0 / 8f64.sqrt();
        // Causal, and for packed rows a second sequence starting at t/2 in batch row 1.
        let mask_rows = if per_row { b } else { 1 };
        let mut mask = vec![0f32; mask_rows * t * t];
        for r in 0..mask_rows {
            for i in 0..t {
                for j in 0..t {
                    let other_sequence = r == 1 && (i >= t / 2) != (j >= t / 2);
                    if j > i || other_sequence {
                        mask[(r * t + i) * t + j] = MASKED;
                    }
                }
            }
        }
        let mask_t =
            Tensor::<4>::from_data(TensorData::new(mask.clone(), [mask_rows, 1, t, t]), &device);
        // Strided: the transpose of the last two axes of a random tensor.
        let s0 = Tensor::<4>::random([b, h, t, t], Distribution::Normal(0.0, 3.0), &device)
            .swap_dims(2, 3);
        let up = Tensor::<4>::random([b, h, t, t], Distribution::Normal(0.0, 1.0), &device);
        let (s, dp) = (to_f32_vec(s0.clone()), to_f32_vec(up.clone()));
        let (mut p64, mut ds64) = (vec![0f64; s.len()], vec![0f64; s.len()]);
        for row in 0..b * h * t {
            let (bi, i) = (row / (h * t), row % t);
            let m = (if per_row { bi } else { 0 } * t + i) * t;
            let z: Vec<f64> = (0..t)
                .map(|j| s[row * t + j] as f64 * scale + mask[m + j] as f64)
                .collect();
            let top = z.iter().copied().fold(f64::MIN, f64::max);
            let total: f64 = z.iter().map(|v| (v - top).exp()).sum();
            let p: Vec<f64> = z.iter().map(|v| (v - top).exp() / total).collect();
            let dot: f64 = (0..t).map(|j| dp[row * t + j] as f64 * p[j]).sum();
            for j in 0..t {
                p64[row * t + j] = p[j];
                ds64[row * t + j] = scale * p[j] * (dp[row * t + j] as f64 - dot);
            }
        }
        for held in [false, true] {
            let run = |fused: bool| {
                let leaf = s0.clone().require_grad();
                let scores = leaf.clone() * 1.0;
                let holder = held.then(|| scores.clone().inner());
                let p = match fused {
                    true => scaled_masked_softmax(scores, scale, &mask_t).expect("f32 on wgpu"),
                    false => burn::tensor::activation::softmax(scores * scale + mask_t.clone(), 3),
                };
                let grads = (p.clone() * up.clone()).sum().backward();
                drop(holder);
                (
                    to_f32_vec(p.inner()),
                    to_f32_vec(leaf.grad(&grads).expect("∂s")),
                )
            };
            let before = launches();
            let (p, ds) = run(true);
            assert_eq!(launches() - before, 2, "({b}, {h}, {t}): fused launches");
            let before = launches();
            let (p_ref, ds_ref) = run(false);
            assert_eq!(launches(), before, "the reference is burn's ops");
            let to_f64 = |v: &[f32]| v.iter().map(|&v| v as f64).collect::<Vec<_>>();
            vs_f64[0] = vs_f64[0].max(worst(&p, &p64));
            vs_f64[1] = vs_f64[1].max(worst(&ds, &ds64));
            vs_burn[0] = vs_burn[0].max(worst(&p, &to_f64(&p_ref)));
            vs_burn[1] = vs_burn[1].max(worst(&ds, &to_f64(&ds_ref)));
        }
    }
    eprintln!(
        "fused softmax on the GPU, worst relative error (p, ∂s): against f64 {:.1e}, {:.1e}, \
         against burn's ops {:.1e}, {:.1e}",
        vs_f64[0], vs_f64[1], vs_burn[0], vs_burn[1]
    );
    for (k, name) in ["p", "∂s"].into_iter().enumerate() {
        assert!(vs_f64[k] < 1e-5, "{name}: {:e} against f64", vs_f64[k]);
        assert!(
            vs_burn[k] < 1e-5,
            "{name}: {:e} against burn's ops",
            vs_burn[k]
        );
    }
}

/// The fused softmax on 16-bit scores (the attention under autocast, `model/attention.rs`):
/// f16 in and out, f32 arithmetic inside. Against f64 on the same f16 inputs, each output is
/// off by its own rounding to f16 (11 significant bits: at most 2⁻¹¹ ≈ 4.9e-4 of a value);
/// `∂s` reads the rounded `p`, so a second rounding's worth. Held to 1e-3 of the largest
/// value, where an f32 kernel's output is 1e-5 (above).
#[test]
fn fused_softmax_on_f16_scores_rounds_only_its_outputs() {
    use burn::tensor::{DType, TensorData};
    use napkin_core::config::MASKED;
    use napkin_core::kernels::gpu::fused::softmax::scaled_masked_softmax;
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device().autodiff();
    device.seed(27);
    let to_f16 = |v: Vec<f32>| -> Vec<f32> {
        v.into_iter()
            .map(|x| half::f16::from_f32(x).to_f32())
            .collect()
    };
    let mut worst_seen = [0f64; 2];
    for (b, h, t) in [(1, 3, 5), (2, 2, 37), (1, 1, 130)] {
        let scale = 1.0 / 8f64.sqrt();
        let mut mask = vec![0f32; t * t];
        for i in 0..t {
            for j in i + 1..t {
                mask[i * t + j] = MASKED;
            }
        }
        let mask_t = Tensor::<4>::from_data(TensorData::new(mask.clone(), [1, 1, t, t]), &device);
        let s = to_f16(to_f32_vec(Tensor::<4>::random(
            [b, h, t, t],
            Distribution::Normal(0.0, 3.0),
            &device,
        )));
        let dp = to_f16(to_f32_vec(Tensor::<4>::random(
            [b, h, t, t],
            Distribution::Normal(0.0, 1.0),
            &device,
        )));
        let (mut p64, mut ds64) = (vec![0f64; s.len()], vec![0f64; s.len()]);
        for row in 0..b * h * t {
            let i = row % t;
            let z: Vec<f64> = (0..t)
                .map(|j| s[row * t + j] as f64 * scale + mask[i * t + j] as f64)
                .collect();
            let top = z.iter().copied().fold(f64::MIN, f64::max);
            let total: f64 = z.iter().map(|v| (v - top).exp()).sum();
            let p: Vec<f64> = z.iter().map(|v| (v - top).exp() / total).collect();
            let dot: f64 = (0..t).map(|j| dp[row * t + j] as f64 * p[j]).sum();
            for j in 0..t {
                p64[row * t + j] = p[j];
                ds64[row * t + j] = scale * p[j] * (dp[row * t + j] as f64 - dot);
            }
        }
        let half = |v: &[f32]| {
            Tensor::<4>::from_data(TensorData::new(v.to_vec(), [b, h, t, t]), &device)
                .cast(DType::F16)
        };
        let leaf = half(&s).require_grad();
        let before = launches();
        let p = scaled_masked_softmax(leaf.clone() * 1.0, scale, &mask_t).expect("f16 on wgpu");
        assert_eq!(
            p.dtype(),
            DType::F16,
            "the probabilities keep the scores' dtype"
        );
        let grads = (p.clone() * half(&dp)).sum().backward();
        assert_eq!(launches() - before, 2, "({b}, {h}, {t}): fused launches");
        let ds = leaf.grad(&grads).expect("∂s");
        assert_eq!(ds.dtype(), DType::F16);
        let (p, ds) = (
            to_f32_vec(p.inner().cast(DType::F32)),
            to_f32_vec(ds.cast(DType::F32)),
        );
        worst_seen[0] = worst_seen[0].max(worst(&p, &p64));
        worst_seen[1] = worst_seen[1].max(worst(&ds, &ds64));
    }
    eprintln!(
        "fused softmax on f16 scores, worst relative error against f64 (p, ∂s): {:.1e}, {:.1e}",
        worst_seen[0], worst_seen[1]
    );
    for (k, name) in ["p", "∂s"].into_iter().enumerate() {
        assert!(
            worst_seen[k] < 1e-3,
            "{name}: {:e} against f64",
            worst_seen[k]
        );
    }
}

/// The causal-LM loss on the GPU (`kernels/gpu/fused/cross_entropy.rs`, through
/// `causal_lm_loss`) against burn's log-softmax, gather and weighted sum on the same device and
/// against f64: two batch rows with ignored labels, vocabularies narrower and wider than the
/// kernel's 64 units, strided logits, and both ways the backward writes.
#[test]
fn fused_loss_forward_and_backward_equal_burns_ops_and_f64() {
    use burn::tensor::activation::log_softmax;
    use burn::tensor::{Int, TensorData};
    use napkin_core::model::{IGNORE_INDEX, causal_lm_loss};
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device().autodiff();
    device.seed(27);
    let (mut vs_f64, mut vs_burn) = ([0f64; 2], [0f64; 2]);
    for (b, t, v) in [(2, 5, 37), (1, 9, 1000), (2, 3, 64)] {
        let labels: Vec<i64> = (0..b * t)
            .map(|i| match i % 4 {
                1 => IGNORE_INDEX,
                _ => ((i * 7919) % v) as i64,
            })
            .collect();
        // Strided: the transpose of the first two axes of a random tensor.
        let x0 =
            Tensor::<3>::random([t, b, v], Distribution::Normal(0.0, 3.0), &device).swap_dims(0, 1);
        let x = to_f32_vec(x0.clone());
        // f64: the summed NLL and its gradient (∂sum = 1).
        let (mut sum64, mut dx64) = (0f64, vec![0f64; x.len()]);
        for row in 0..b * t {
            let (bi, ti) = (row / t, row % t);
            if ti + 1 == t {
                continue;
            }
            let label = labels[bi * t + ti + 1];
            if label == IGNORE_INDEX {
                continue;
            }
            let z = &x[row * v..(row + 1) * v];
            let top = z.iter().map(|&x| x as f64).fold(f64::MIN, f64::max);
            let lse = top + z.iter().map(|&x| (x as f64 - top).exp()).sum::<f64>().ln();
            sum64 += lse - z[label as usize] as f64;
            for j in 0..v {
                dx64[row * v + j] = (z[j] as f64 - lse).exp();
            }
            dx64[row * v + label as usize] -= 1.0;
        }
        for held in [false, true] {
            let run = |fused: bool| {
                let leaf = x0.clone().require_grad();
                let logits = leaf.clone() * 1.0;
                let holder = held.then(|| logits.clone().inner());
                let sum = match fused {
                    true => causal_lm_loss(logits, &labels).expect("a loss").sum,
                    false => {
                        let shifted: Vec<(i64, f32)> = labels
                            .chunks(t)
                            .flat_map(|row| row[1..].iter())
                            .map(|&l| match l {
                                IGNORE_INDEX => (0, 0.0),
                                l => (l, 1.0),
                            })
                            .collect();
                        let classes: Vec<i64> = shifted.iter().map(|s| s.0).collect();
                        let weights: Vec<f32> = shifted.iter().map(|s| s.1).collect();
                        let classes = Tensor::<3, Int>::from_data(
                            TensorData::new(classes, [b, t - 1, 1]),
                            &device,
                        );
                        let weights = Tensor::<3>::from_data(
                            TensorData::new(weights, [b, t - 1, 1]),
                            &device,
                        );
                        let log_probs = log_softmax(logits.narrow(1, 0, t - 1), 2);
                        (log_probs.gather(2, classes) * weights).sum().neg()
                    }
                };
                let grads = sum.clone().backward();
                drop(holder);
                (
                    to_f32_vec(sum.inner()),
                    to_f32_vec(leaf.grad(&grads).expect("∂x")),
                )
            };
            let before = launches();
            let (sum, dx) = run(true);
            assert_eq!(launches() - before, 2, "({b}, {t}, {v}): fused launches");
            let before = launches();
            let (sum_ref, dx_ref) = run(false);
            assert_eq!(launches(), before, "the reference is burn's ops");
            let to_f64 = |v: &[f32]| v.iter().map(|&v| v as f64).collect::<Vec<_>>();
            vs_f64[0] = vs_f64[0].max(worst(&sum, &[sum64]));
            vs_f64[1] = vs_f64[1].max(worst(&dx, &dx64));
            vs_burn[0] = vs_burn[0].max(worst(&sum, &to_f64(&sum_ref)));
            vs_burn[1] = vs_burn[1].max(worst(&dx, &to_f64(&dx_ref)));
        }
    }
    eprintln!(
        "fused loss on the GPU, worst relative error (sum, ∂x): against f64 {:.1e}, {:.1e}, \
         against burn's ops {:.1e}, {:.1e}",
        vs_f64[0], vs_f64[1], vs_burn[0], vs_burn[1]
    );
    for (k, name) in ["sum", "∂x"].into_iter().enumerate() {
        assert!(vs_f64[k] < 1e-5, "{name}: {:e} against f64", vs_f64[k]);
        assert!(
            vs_burn[k] < 1e-5,
            "{name}: {:e} against burn's ops",
            vs_burn[k]
        );
    }
}

/// Each label's log-probability read on the GPU for a preference loss (`label_log_probs`,
/// through the cross-entropy kernel's rows, `row_nll`) against f64: strided logits with and
/// without a graph, vocabularies narrower and wider than the kernel's 64 units, ignored labels
/// and each row's first position read 0; the kernel's launch counter says it ran (once).
#[test]
fn label_log_probs_on_the_gpu_equal_f64() {
    use napkin_core::model::{IGNORE_INDEX, label_log_probs};
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut vs_f64 = 0f64;
    for (b, t, v) in [(2, 5, 37), (1, 9, 1000), (3, 4, 64)] {
        let labels: Vec<i64> = (0..b * t)
            .map(|i| match i % 4 {
                1 => IGNORE_INDEX,
                _ => ((i * 7919) % v) as i64,
            })
            .collect();
        for tracked in [false, true] {
            let device = match tracked {
                true => wgpu_device().autodiff(),
                false => wgpu_device(),
            };
            device.seed(29);
            let x0 = Tensor::<3>::random([t, b, v], Distribution::Normal(0.0, 3.0), &device)
                .swap_dims(0, 1);
            let x = to_f32_vec(x0.clone());
            let mut want = vec![0f64; b * t];
            for row in 0..b {
                for pos in 1..t {
                    let label = labels[row * t + pos];
                    if label == IGNORE_INDEX {
                        continue;
                    }
                    let z = &x[(row * t + pos - 1) * v..(row * t + pos) * v];
                    let top = z.iter().map(|&x| x as f64).fold(f64::MIN, f64::max);
                    let lse = top + z.iter().map(|&x| (x as f64 - top).exp()).sum::<f64>().ln();
                    want[row * t + pos] = z[label as usize] as f64 - lse;
                }
            }
            let before = launches();
            let got = label_log_probs(x0, &labels).expect("log-probabilities");
            assert_eq!(launches() - before, 1, "({b}, {t}, {v}): one launch");
            vs_f64 = vs_f64.max(worst(&got, &want));
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                if w == 0.0 {
                    assert_eq!(g, 0.0, "({b}, {t}, {v}) [{i}]: a label that does not count");
                }
            }
        }
    }
    eprintln!("label log-probabilities on the GPU, worst relative error against f64 {vs_f64:.1e}");
    assert!(vs_f64 < 1e-5, "{vs_f64:e} against f64");
}

/// A LoRA linear's fused `base + s·low` (`kernels/gpu/fused/scaled_add.rs`): the values and
/// both gradients of burn's `base + low * s`, for a strided adapter product, with the base
/// trained and frozen, and both ways the forward writes.
#[test]
fn fused_scaled_add_equals_burns_ops() {
    use napkin_core::kernels::gpu::fused::scaled_add::add_scaled;
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device().autodiff();
    device.seed(28);
    let s = 2.0f64;
    let b0 = Tensor::<2>::random([37, 80], Distribution::Normal(0.0, 1.0), &device);
    let l0 = Tensor::<2>::random([80, 37], Distribution::Normal(0.0, 1.0), &device).transpose();
    let up = Tensor::<2>::random([37, 80], Distribution::Normal(0.0, 1.0), &device);
    for (base_trains, held) in [(true, false), (false, false), (true, true)] {
        let run = |fused: bool| {
            let base_leaf = match base_trains {
                true => b0.clone().require_grad(),
                false => b0.clone(),
            };
            let low_leaf = l0.clone().require_grad();
            let (base, low) = (base_leaf.clone() * 1.0, low_leaf.clone() * 1.0);
            let holder = held.then(|| base.clone().inner());
            let y = match fused {
                true => add_scaled(base, low, s).unwrap_or_else(|_| panic!("f32 on wgpu")),
                false => base + low * s,
            };
            let grads = (y.clone() * up.clone()).sum().backward();
            drop(holder);
            let db = base_leaf.grad(&grads).map(to_f32_vec);
            (
                to_f32_vec(y.inner()),
                db,
                to_f32_vec(low_leaf.grad(&grads).expect("∂low")),
            )
        };
        let before = launches();
        let (y, db, dl) = run(true);
        assert_eq!(
            launches() - before,
            1,
            "one fused launch (its backward is burn's product)"
        );
        let before = launches();
        let (y_ref, db_ref, dl_ref) = run(false);
        assert_eq!(launches(), before, "the reference is burn's ops");
        // Equal to the bit on lavapipe; a GPU compiler may contract `b + s·l` into one
        // fused multiply-add, a rounding apart.
        let what = format!("base trains {base_trains}, held {held}");
        let to_f64 = |v: &[f32]| v.iter().map(|&v| v as f64).collect::<Vec<_>>();
        assert!(worst(&y, &to_f64(&y_ref)) < 1e-6, "{what}: values");
        assert!(worst(&dl, &to_f64(&dl_ref)) < 1e-6, "{what}: ∂low");
        match (db, db_ref) {
            (Some(db), Some(db_ref)) => {
                assert!(worst(&db, &to_f64(&db_ref)) < 1e-6, "{what}: ∂base")
            }
            (None, None) => assert!(!base_trains, "{what}"),
            _ => panic!("{what}: ∂base on one side only"),
        }
    }
}
