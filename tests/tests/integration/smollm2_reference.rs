//! SmolLM2-135M's next-token logits against an independent float64 Llama written here from
//! scratch in plain Rust (no burn), reading the GGUF tensors exactly as stored.
//!
//! The reference follows llama.cpp's own conventions rather than ours: the query and key rows
//! stay in the converter's permuted order and RoPE rotates adjacent pairs `(2i, 2i+1)`
//! ("normal" rope), where napkin un-permutes the rows at load time and rotates the two halves
//! (Hugging Face's `rotate_half`). Agreement therefore also proves the un-permutation.

use napkin_core::device::DeviceKind;
use napkin_core::io::gguf::{GgufFile, load_gguf_llama};
use napkin_core::kernels::values::to_f32_vec;
use napkin_core::model::TokenBatch;
use napkin_core::tokenizer::TextTokenizer;

use super::smollm2::smollm2_path;

/// A row-major matrix `[rows, cols]` in f64.
struct Matrix {
    rows: usize,
    cols: usize,
    values: Vec<f64>,
}

impl Matrix {
    fn read(gguf: &GgufFile, name: &str) -> Matrix {
        let (shape, values) = gguf.read_f32(name).unwrap();
        let (rows, cols) = match shape[..] {
            [n] => (1, n),
            [r, c] => (r, c),
            _ => panic!("{name}: unexpected shape {shape:?}"),
        };
        Matrix {
            rows,
            cols,
            values: values.into_iter().map(f64::from).collect(),
        }
    }

    fn row(&self, r: usize) -> &[f64] {
        &self.values[r * self.cols..(r + 1) * self.cols]
    }

    /// `W x` for `W: [rows, cols]`, `x: [cols]`.
    fn apply(&self, x: &[f64]) -> Vec<f64> {
        assert_eq!(x.len(), self.cols);
        (0..self.rows)
            .map(|r| self.row(r).iter().zip(x).map(|(w, v)| w * v).sum())
            .collect()
    }
}

fn rms_norm(x: &[f64], weight: &Matrix, eps: f64) -> Vec<f64> {
    let mean_square = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (mean_square + eps).sqrt();
    x.iter()
        .zip(weight.row(0))
        .map(|(v, w)| v * inv * w)
        .collect()
}

/// llama.cpp's "normal" RoPE on one head in place: pairs `(2i, 2i+1)` turn by
/// `position · base^(-2i/Dh)`.
fn rope_adjacent_pairs(head: &mut [f64], position: usize, base: f64) {
    let dh = head.len();
    for i in 0..dh / 2 {
        let angle = position as f64 * base.powf(-((2 * i) as f64) / dh as f64);
        let (sin, cos) = angle.sin_cos();
        let (a, b) = (head[2 * i], head[2 * i + 1]);
        head[2 * i] = a * cos - b * sin;
        head[2 * i + 1] = a * sin + b * cos;
    }
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// The logits after the last token of `ids`, in f64.
fn reference_last_logits(gguf: &GgufFile, ids: &[u32]) -> Vec<f64> {
    let meta = |key: &str| gguf.metadata[key].as_f64().unwrap();
    let layers = meta("llama.block_count") as usize;
    let heads = meta("llama.attention.head_count") as usize;
    let kv_heads = meta("llama.attention.head_count_kv") as usize;
    let eps = meta("llama.attention.layer_norm_rms_epsilon");
    let base = meta("llama.rope.freq_base");
    let embed = Matrix::read(gguf, "token_embd.weight");
    let d = embed.cols;
    let dh = d / heads;
    let group = heads / kv_heads;

    // The residual stream of every position: [T][D].
    let mut xs: Vec<Vec<f64>> = ids
        .iter()
        .map(|&id| embed.row(id as usize).to_vec())
        .collect();
    for l in 0..layers {
        let w = |part: &str| Matrix::read(gguf, &format!("blk.{l}.{part}.weight"));
        let (attn_norm, wq, wk, wv, wo) = (
            w("attn_norm"),
            w("attn_q"),
            w("attn_k"),
            w("attn_v"),
            w("attn_output"),
        );
        let (ffn_norm, gate, up, down) = (w("ffn_norm"), w("ffn_gate"), w("ffn_up"), w("ffn_down"));
        let mut qs = Vec::new();
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        for (pos, x) in xs.iter().enumerate() {
            let h = rms_norm(x, &attn_norm, eps);
            let (mut q, mut k) = (wq.apply(&h), wk.apply(&h));
            q.chunks_mut(dh)
                .for_each(|head| rope_adjacent_pairs(head, pos, base));
            k.chunks_mut(dh)
                .for_each(|head| rope_adjacent_pairs(head, pos, base));
            qs.push(q);
            ks.push(k);
            vs.push(wv.apply(&h));
        }
        for (t, x) in xs.iter_mut().enumerate() {
            let mut attended = vec![0.0; d];
            for head in 0..heads {
                let kv = head / group;
                let q = &qs[t][head * dh..(head + 1) * dh];
                let scores: Vec<f64> = (0..=t)
                    .map(|s| {
                        let k = &ks[s][kv * dh..(kv + 1) * dh];
                        q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() / (dh as f64).sqrt()
                    })
                    .collect();
                let top = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
                let total: f64 = weights.iter().sum();
                for (s, weight) in weights.iter().enumerate() {
                    let v = &vs[s][kv * dh..(kv + 1) * dh];
                    for (o, value) in attended[head * dh..(head + 1) * dh].iter_mut().zip(v) {
                        *o += weight / total * value;
                    }
                }
            }
            let out = wo.apply(&attended);
            x.iter_mut().zip(&out).for_each(|(a, b)| *a += b);
            let h = rms_norm(x, &ffn_norm, eps);
            let hidden: Vec<f64> = gate
                .apply(&h)
                .iter()
                .zip(up.apply(&h))
                .map(|(g, u)| silu(*g) * u)
                .collect();
            let out = down.apply(&hidden);
            x.iter_mut().zip(&out).for_each(|(a, b)| *a += b);
        }
    }
    let last = rms_norm(
        xs.last().unwrap(),
        &Matrix::read(gguf, "output_norm.weight"),
        eps,
    );
    let head = if gguf.tensors.contains_key("output.weight") {
        Matrix::read(gguf, "output.weight")
    } else {
        embed
    };
    head.apply(&last)
}

#[test]
fn smollm2_logits_match_an_independent_f64_reference() {
    let gguf = GgufFile::open(&smollm2_path()).unwrap();
    let tokenizer = TextTokenizer::from_gguf(&gguf).unwrap();
    let ids = tokenizer
        .encode("<|im_start|>user\nThe capital of France is")
        .unwrap();
    assert_eq!(ids.len(), 8, "{ids:?}");
    let want = reference_last_logits(&gguf, &ids);

    let model = load_gguf_llama(&gguf, &DeviceKind::Cpu.open().unwrap()).unwrap();
    let v = model.config.vocab_size;
    let logits = to_f32_vec(model.forward(&TokenBatch::single(&ids).unwrap()));
    let got = &logits[(ids.len() - 1) * v..];

    let scale = want.iter().map(|x| x.abs()).fold(0.0, f64::max);
    let worst = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (f64::from(*a) - b).abs())
        .fold(0.0, f64::max);
    let argmax = |xs: &[f64]| {
        (0..xs.len())
            .max_by(|&a, &b| xs[a].total_cmp(&xs[b]))
            .unwrap()
    };
    let got64: Vec<f64> = got.iter().map(|&x| f64::from(x)).collect();
    assert_eq!(
        argmax(&got64),
        argmax(&want),
        "the greedy next token differs"
    );
    // f32 through 30 blocks against f64: measured 3.1e-5 against a largest logit of 25.3
    // (1.2e-6 of it); the tolerance is 1e-5 of it.
    assert!(
        worst <= 1e-5 * scale,
        "max |logit error| {worst:.3e} against a largest logit of {scale:.2}"
    );
    eprintln!(
        "SmolLM2 logits vs f64 reference: max |error| {worst:.3e} (largest |logit| {scale:.2})"
    );
}
