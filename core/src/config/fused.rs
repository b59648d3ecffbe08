//! Phi-3's fused projections: its checkpoints store a block's q, k and v as one `qkv_proj`
//! (`[(H + 2·Hkv)·Dh, D]`, q's rows first, then k's, then v's) and its gate and up as one
//! `gate_up_proj` (`[2·F, D]`, gate's rows first), as transformers' `Phi3Attention` and
//! `Phi3MLP` slice them. napkin's model keeps the seven linears apart: the loaders split these
//! tensors by rows and the writers join them again, so the files read and written are
//! Phi-3's. The names here are the model's Hugging Face names (`model.layers.0.self_attn.
//! q_proj.weight`) and the stored ones (`model.layers.0.self_attn.qkv_proj.weight`).

use super::llama::LlamaConfig;

/// The rows of a stored fused tensor that hold one of the model's weights.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRows {
    /// The stored tensor's name (`model.layers.0.self_attn.qkv_proj.weight`).
    pub tensor: String,
    /// The first row of the part.
    pub start: usize,
    /// The part's rows.
    pub rows: usize,
    /// The stored tensor's rows.
    pub total: usize,
}

/// Phi-3's fused modules of a block: (stored module path, the modules it holds in row order).
pub const FUSED_PROJECTIONS: [(&str, &[&str]); 2] = [
    (
        "self_attn.qkv_proj",
        &["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
    ),
    ("mlp.gate_up_proj", &["mlp.gate_proj", "mlp.up_proj"]),
];

impl LlamaConfig {
    /// The stored module holding `module` (`self_attn.qkv_proj` for `self_attn.k_proj` in a
    /// Phi-3), or None when it is stored on its own.
    pub fn fused_module_of(&self, module: &str) -> Option<&'static str> {
        if !self.fused_projections {
            return None;
        }
        FUSED_PROJECTIONS
            .iter()
            .find(|(_, parts)| parts.contains(&module))
            .map(|(fused, _)| *fused)
    }

    /// The modules a stored fused module holds, in row order, with their rows; None for a
    /// module that is not fused in this config.
    pub fn fused_parts(&self, fused: &str) -> Option<Vec<(&'static str, usize)>> {
        if !self.fused_projections {
            return None;
        }
        let (_, parts) = FUSED_PROJECTIONS.iter().find(|(name, _)| *name == fused)?;
        let rows = |part: &str| {
            self.block_linears()
                .iter()
                .find(|(name, _, _)| *name == part)
                .map_or(0, |&(_, out, _)| out)
        };
        Some(parts.iter().map(|&part| (part, rows(part))).collect())
    }

    /// Where the HF weight `name` lies in the checkpoint when that is rows of a fused tensor
    /// (`model.layers.3.mlp.up_proj.weight` → rows F..2F of `model.layers.3.mlp.
    /// gate_up_proj.weight`); None when it is stored under its own name.
    pub fn stored_rows(&self, name: &str) -> Option<StoredRows> {
        let rest = name.strip_prefix("model.layers.")?;
        let (layer, rest) = rest.split_once('.')?;
        let module = rest.strip_suffix(".weight")?;
        let fused = self.fused_module_of(module)?;
        let parts = self.fused_parts(fused)?;
        let index = parts.iter().position(|(part, _)| *part == module)?;
        Some(StoredRows {
            tensor: format!("model.layers.{layer}.{fused}.weight"),
            start: parts[..index].iter().map(|(_, rows)| rows).sum(),
            rows: parts[index].1,
            total: parts.iter().map(|(_, rows)| rows).sum(),
        })
    }

    /// The HF weights a stored tensor is made of, in row order: the fused parts of a fused one,
    /// else the tensor alone.
    pub fn stored_parts(&self, stored: &str) -> Vec<String> {
        let fused = stored
            .strip_prefix("model.layers.")
            .and_then(|rest| rest.split_once('.'))
            .and_then(|(layer, rest)| {
                let parts = self.fused_parts(rest.strip_suffix(".weight")?)?;
                Some(
                    parts
                        .into_iter()
                        .map(|(part, _)| format!("model.layers.{layer}.{part}.weight"))
                        .collect(),
                )
            });
        fused.unwrap_or_else(|| vec![stored.to_string()])
    }

    /// Every tensor as the checkpoint stores it, in the order of
    /// [`LlamaConfig::hf_parameter_shapes`]: a fused tensor in place of its first part, its
    /// other parts left out. The same as `hf_parameter_shapes` for an unfused model.
    pub fn stored_parameter_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let mut out = Vec::new();
        for (name, shape) in self.hf_parameter_shapes() {
            match self.stored_rows(&name) {
                None => out.push((name, shape)),
                Some(rows) if rows.start == 0 => {
                    out.push((rows.tensor, vec![rows.total, shape[1]]))
                }
                Some(_) => {}
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phi3() -> LlamaConfig {
        LlamaConfig {
            fused_projections: true,
            ..LlamaConfig::tiny_gqa()
        }
    }

    /// Phi-3's layout: q, k, v rows in that order in `qkv_proj`, gate before up; every weight
    /// of the model is in exactly one stored tensor, and the stored tensors hold as many
    /// values as the model's.
    #[test]
    fn a_fused_checkpoint_stores_every_weight_once_in_phi3s_order() {
        let c = phi3();
        let (q, kv, f) = (c.q_dim(), c.kv_dim(), c.intermediate_size);
        let k = c
            .stored_rows("model.layers.1.self_attn.k_proj.weight")
            .unwrap();
        assert_eq!(
            k,
            StoredRows {
                tensor: "model.layers.1.self_attn.qkv_proj.weight".into(),
                start: q,
                rows: kv,
                total: q + 2 * kv,
            }
        );
        let up = c.stored_rows("model.layers.0.mlp.up_proj.weight").unwrap();
        assert_eq!((up.start, up.rows, up.total), (f, f, 2 * f));
        assert_eq!(
            c.stored_rows("model.layers.0.self_attn.o_proj.weight"),
            None
        );
        assert_eq!(c.stored_rows("model.layers.0.mlp.down_proj.weight"), None);

        let stored = c.stored_parameter_shapes();
        let values = |shapes: &[(String, Vec<usize>)]| -> usize {
            shapes
                .iter()
                .map(|(_, s)| s.iter().product::<usize>())
                .sum()
        };
        assert_eq!(values(&stored), values(&c.hf_parameter_shapes()));
        let names: Vec<&str> = stored.iter().map(|(n, _)| n.as_str()).collect();
        assert!(names.contains(&"model.layers.0.self_attn.qkv_proj.weight"));
        assert!(names.contains(&"model.layers.0.mlp.gate_up_proj.weight"));
        assert!(
            !names
                .iter()
                .any(|n| n.contains("q_proj") || n.contains("gate_proj"))
        );
        let covered: usize = stored.iter().map(|(n, _)| c.stored_parts(n).len()).sum();
        assert_eq!(covered, c.hf_parameter_shapes().len());
    }

    #[test]
    fn an_unfused_checkpoint_stores_the_models_names() {
        let c = LlamaConfig::tiny_gqa();
        assert_eq!(c.stored_parameter_shapes(), c.hf_parameter_shapes());
        assert_eq!(
            c.stored_rows("model.layers.0.self_attn.q_proj.weight"),
            None
        );
    }
}
