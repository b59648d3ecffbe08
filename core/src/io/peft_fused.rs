//! LoRA on Phi-3's fused projections in peft's format. peft adapts the fused module: one A
//! (`[R, in]`) for `qkv_proj` (or `gate_up_proj`) and one B (`[(H + 2·Hkv)·Dh, R]`), scaled by
//! α_f/R. napkin's model keeps q, k and v apart, each with its own adapter (`config/fused.rs`).
//!
//! - Reading: each part gets the fused A whole and the rows of B that produce its outputs, so
//!   the model's products are peft's. (Trained on, the parts' copies of A then move apart:
//!   napkin trains three adapters where peft trains one shared A, and LoRA dropout draws one
//!   mask per part where peft draws one for the fused input.)
//! - Writing: the parts' adapters stacked as one of rank Σ r_p: A their rows one after
//!   another, B block-diagonal (the rows of an unadapted part zero), each block scaled by its
//!   part's scaling over the stacked one. The stacked rank and α go into `rank_pattern` and
//!   `alpha_pattern` under the fused module's name, so peft's product is napkin's, exactly.

/// One part of a fused module: its output rows and, when adapted, its adapter.
pub struct FusedPart {
    /// Output rows of the part.
    pub rows: usize,
    /// A (`[r, in]`, row-major), B (`[rows, r]`) and the scaling, when the part is adapted.
    pub adapter: Option<(Vec<f32>, Vec<f32>, f64)>,
}

/// The stacked adapter of `parts` (in row order) for inputs of `inp` features, under the
/// fused module's `scaling`: (A `[R, inp]`, B `[Σ rows, R]`, R).
pub fn stack(parts: &[FusedPart], inp: usize, scaling: f64) -> (Vec<f32>, Vec<f32>, usize) {
    let rank_of = |p: &FusedPart| p.adapter.as_ref().map_or(0, |(a, _, _)| a.len() / inp);
    let rank: usize = parts.iter().map(rank_of).sum();
    let total: usize = parts.iter().map(|p| p.rows).sum();
    let mut a = Vec::with_capacity(rank * inp);
    let mut b = vec![0.0f32; total * rank];
    let (mut row, mut col) = (0, 0);
    for part in parts {
        if let Some((pa, pb, s)) = &part.adapter {
            let r = pa.len() / inp;
            a.extend_from_slice(pa);
            let ratio = (s / scaling) as f32;
            for i in 0..part.rows {
                for j in 0..r {
                    b[(row + i) * rank + col + j] = pb[i * r + j] * ratio;
                }
            }
            col += r;
        }
        row += part.rows;
    }
    (a, b, rank)
}

/// peft's α for a module of rank `rank` whose product is scaled by `scaling`: s·R, or s·√R
/// with rsLoRA.
pub fn alpha_for(scaling: f64, rank: usize, rslora: bool) -> f64 {
    match rslora {
        true => scaling * (rank as f64).sqrt(),
        false => scaling * rank as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// x·Aᵀ·Bᵀ·s of the stack equals each part's own product in its rows (zero for an
    /// unadapted part), with parts of different ranks and scalings.
    #[test]
    fn the_stacked_product_is_each_parts_product() {
        let inp = 3;
        let part = |rows: usize, r: usize, s: f64, seed: f32| FusedPart {
            rows,
            adapter: Some((
                (0..r * inp).map(|i| seed + i as f32 * 0.5).collect(),
                (0..rows * r).map(|i| seed - i as f32 * 0.25).collect(),
                s,
            )),
        };
        let parts = [
            part(2, 2, 2.0, 1.0),
            FusedPart {
                rows: 1,
                adapter: None,
            },
            part(2, 1, 4.0, -1.0),
        ];
        let scaling = 0.5;
        let (a, b, rank) = stack(&parts, inp, scaling);
        assert_eq!((a.len(), b.len(), rank), (3 * inp, 5 * 3, 3));
        let x = [0.3f32, -1.2, 2.0];
        let product = |a: &[f32], b: &[f32], r: usize, rows: usize, s: f64| -> Vec<f32> {
            let ax: Vec<f32> = (0..r)
                .map(|j| (0..inp).map(|k| a[j * inp + k] * x[k]).sum())
                .collect();
            (0..rows)
                .map(|i| (0..r).map(|j| b[i * r + j] * ax[j]).sum::<f32>() * s as f32)
                .collect()
        };
        let stacked = product(&a, &b, rank, 5, scaling);
        let mut expected = Vec::new();
        for p in &parts {
            match &p.adapter {
                Some((pa, pb, s)) => expected.extend(product(pa, pb, pa.len() / inp, p.rows, *s)),
                None => expected.extend(vec![0.0; p.rows]),
            }
        }
        for (got, want) in stacked.iter().zip(&expected) {
            assert!(
                (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                "{got} {want}"
            );
        }
        assert_eq!(alpha_for(2.0, 9, false), 18.0);
        assert_eq!(alpha_for(2.0, 9, true), 6.0);
    }
}
