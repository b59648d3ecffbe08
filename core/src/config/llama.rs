//! `LlamaConfig`: the hyper-parameters of a Llama, read from a Hugging Face `config.json`.
//!
//! Pure data and arithmetic (no burn types), so the predictor, the exercises and the browser
//! app can use it without a tensor backend. Shape letters are those of ARCHITECTURE.md.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// How RoPE frequencies are scaled for long context.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rope_type", rename_all = "snake_case")]
pub enum RopeScaling {
    /// Plain RoPE: `inv_freq[j] = theta^(-2j/d)`.
    Default,
    /// Llama 3.x: low frequencies divided by `factor`, high ones kept, a smooth ramp between.
    Llama3 {
        /// Divisor of the low frequencies (8 for Llama 3.1, 32 for Llama 3.2).
        factor: f64,
        /// Wavelengths longer than `original_max_position_embeddings / low_freq_factor` are scaled.
        low_freq_factor: f64,
        /// Wavelengths shorter than `original_max_position_embeddings / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// The context length the model was pre-trained with.
        original_max_position_embeddings: f64,
    },
}

/// The hyper-parameters of a `LlamaForCausalLM`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlamaConfig {
    /// V: number of token ids.
    pub vocab_size: usize,
    /// D: width of the residual stream.
    pub hidden_size: usize,
    /// F: width of the SwiGLU MLP.
    pub intermediate_size: usize,
    /// L: number of decoder blocks.
    pub num_hidden_layers: usize,
    /// H: number of query heads.
    pub num_attention_heads: usize,
    /// Hkv: number of key/value heads (H for multi-head attention, fewer for grouped-query).
    pub num_key_value_heads: usize,
    /// Dh: width of one head (usually D / H).
    pub head_dim: usize,
    /// Epsilon inside RMSNorm's square root.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// RoPE frequency scaling.
    pub rope_scaling: RopeScaling,
    /// Longest sequence the positional tables are meant for.
    pub max_position_embeddings: usize,
    /// Whether the LM head reuses the token embedding matrix.
    pub tie_word_embeddings: bool,
    /// Beginning-of-sequence token id, if the checkpoint names one.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence token id(s), if the checkpoint names them.
    pub eos_token_ids: Vec<u32>,
}

impl LlamaConfig {
    /// Reads and validates a Hugging Face `config.json`.
    pub fn from_hf_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let value: Value = serde_json::from_str(&text).map_err(|error| Error::Json {
            path: path.to_path_buf(),
            error,
        })?;
        Self::from_hf_json(&value, &path.display().to_string())
    }

    /// Builds a config from the JSON object of a Hugging Face `config.json`.
    ///
    /// Accepts both the transformers 4.x layout (`rope_theta`, `rope_scaling` at top level) and
    /// the 5.x layout (`rope_parameters: {rope_theta, rope_type, ...}`); `head_dim` may be
    /// explicit or derived as `hidden_size / num_attention_heads`.
    pub fn from_hf_json(value: &Value, source_name: &str) -> Result<Self> {
        let err = |message: String| Error::config(source_name, message);
        let obj = value
            .as_object()
            .ok_or_else(|| err("expected a JSON object at top level".into()))?;
        let fields = Fields { obj, err: &err };

        if let Some(model_type) = obj.get("model_type").and_then(Value::as_str)
            && !matches!(model_type, "llama" | "mistral" | "smollm2")
        {
            // Other architectures differ in ways this Llama does not model (biases, norms...).
            return Err(err(format!(
                "model_type `{model_type}` is not supported; napkin implements LlamaForCausalLM (model_type `llama`)"
            )));
        }
        if let Some(act) = obj.get("hidden_act").and_then(Value::as_str)
            && act != "silu"
        {
            return Err(err(format!(
                "hidden_act `{act}` is not supported, expected `silu`"
            )));
        }
        for flag in ["attention_bias", "mlp_bias"] {
            if obj.get(flag).and_then(Value::as_bool) == Some(true) {
                return Err(err(format!(
                    "`{flag}: true` is not supported: napkin's Llama has no biases"
                )));
            }
        }

        let hidden_size = fields.usize("hidden_size")?;
        let num_attention_heads = fields.usize("num_attention_heads")?;
        let num_key_value_heads = match obj.get("num_key_value_heads") {
            None | Some(Value::Null) => num_attention_heads,
            Some(_) => fields.usize("num_key_value_heads")?,
        };
        let head_dim = match obj.get("head_dim") {
            None | Some(Value::Null) => {
                if num_attention_heads == 0 || hidden_size % num_attention_heads != 0 {
                    return Err(err(format!(
                        "no `head_dim` given and hidden_size {hidden_size} is not divisible by num_attention_heads {num_attention_heads}"
                    )));
                }
                hidden_size / num_attention_heads
            }
            Some(_) => fields.usize("head_dim")?,
        };

        // RoPE: `rope_parameters` (transformers 5) wins over the top-level keys (4.x).
        let rope_params = obj.get("rope_parameters").and_then(Value::as_object);
        let rope_theta = match rope_params.and_then(|p| p.get("rope_theta")) {
            Some(v) => v
                .as_f64()
                .ok_or_else(|| err("`rope_parameters.rope_theta` must be a number".into()))?,
            None => match obj.get("rope_theta") {
                Some(v) => v
                    .as_f64()
                    .ok_or_else(|| err("`rope_theta` must be a number".into()))?,
                None => 10_000.0, // HF's default for Llama
            },
        };
        let scaling_obj = match rope_params {
            Some(p) => Some(p),
            None => obj.get("rope_scaling").and_then(Value::as_object),
        };
        let rope_scaling = match scaling_obj {
            None => RopeScaling::Default,
            Some(s) => parse_rope_scaling(s, &err)?,
        };

        let eos_token_ids = match obj.get("eos_token_id") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(ids)) => ids
                .iter()
                .map(|v| {
                    token_id(v)
                        .ok_or_else(|| err("`eos_token_id` entries must be token ids".into()))
                })
                .collect::<Result<_>>()?,
            Some(v) => {
                vec![token_id(v).ok_or_else(|| err("`eos_token_id` must be a token id".into()))?]
            }
        };
        let bos_token_id = match obj.get("bos_token_id") {
            None | Some(Value::Null) => None,
            Some(v) => {
                Some(token_id(v).ok_or_else(|| err("`bos_token_id` must be a token id".into()))?)
            }
        };

        let config = LlamaConfig {
            vocab_size: fields.usize("vocab_size")?,
            hidden_size,
            intermediate_size: fields.usize("intermediate_size")?,
            num_hidden_layers: fields.usize("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: fields.f64_or("rms_norm_eps", 1e-6)?,
            rope_theta,
            rope_scaling,
            max_position_embeddings: fields.usize_or("max_position_embeddings", 2048)?,
            tie_word_embeddings: fields.bool_or("tie_word_embeddings", false)?,
            bos_token_id,
            eos_token_ids,
        };
        config.validate(source_name)?;
        Ok(config)
    }

    /// Checks that the numbers describe a model that can be built.
    pub fn validate(&self, source_name: &str) -> Result<()> {
        let err = |message: String| Err(Error::config(source_name, message));
        for (name, value) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
        ] {
            if value == 0 {
                return err(format!("`{name}` must be at least 1, found 0"));
            }
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return err(format!(
                "num_attention_heads {} must be a multiple of num_key_value_heads {} (grouped-query attention)",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return err(format!("head_dim {} must be even for RoPE", self.head_dim));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 1.0) {
            return err(format!(
                "rope_theta {} must be a finite number above 1",
                self.rope_theta
            ));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return err(format!(
                "rms_norm_eps {} must be a small positive number",
                self.rms_norm_eps
            ));
        }
        // Bound sizes so that a hostile file cannot make us allocate absurd tensors.
        const LIMIT: usize = 1 << 20;
        for (name, value) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_attention_heads", self.num_attention_heads),
            ("head_dim", self.head_dim),
        ] {
            if value > LIMIT {
                return err(format!(
                    "`{name}` = {value} is larger than napkin supports ({LIMIT})"
                ));
            }
        }
        if self.num_hidden_layers > 4096 {
            return err(format!(
                "num_hidden_layers {} is larger than napkin supports (4096)",
                self.num_hidden_layers
            ));
        }
        Ok(())
    }

    /// Writes the config in the Hugging Face (transformers 4.x + 5.x compatible) layout.
    pub fn to_hf_json(&self) -> Value {
        let mut rope = Map::new();
        rope.insert("rope_theta".into(), self.rope_theta.into());
        match self.rope_scaling {
            RopeScaling::Default => {
                rope.insert("rope_type".into(), "default".into());
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                rope.insert("rope_type".into(), "llama3".into());
                rope.insert("factor".into(), factor.into());
                rope.insert("low_freq_factor".into(), low_freq_factor.into());
                rope.insert("high_freq_factor".into(), high_freq_factor.into());
                rope.insert(
                    "original_max_position_embeddings".into(),
                    original_max_position_embeddings.into(),
                );
            }
        }
        let eos: Value = match self.eos_token_ids.as_slice() {
            [] => Value::Null,
            [one] => (*one).into(),
            many => many.iter().map(|&id| Value::from(id)).collect(),
        };
        serde_json::json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_act": "silu",
            "attention_bias": false,
            "mlp_bias": false,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": if self.rope_scaling == RopeScaling::Default { Value::Null } else { Value::Object(rope.clone()) },
            "rope_parameters": Value::Object(rope),
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
        })
    }

    // ---- sizes -----------------------------------------------------------------------------

    /// H·Dh: width of the concatenated query heads.
    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    /// Hkv·Dh: width of the concatenated key (or value) heads.
    pub fn kv_dim(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }

    /// The seven linear layers of one decoder block: (HF module path, out features, in features).
    pub fn block_linears(&self) -> [(&'static str, usize, usize); 7] {
        let (d, f) = (self.hidden_size, self.intermediate_size);
        [
            ("self_attn.q_proj", self.q_dim(), d),
            ("self_attn.k_proj", self.kv_dim(), d),
            ("self_attn.v_proj", self.kv_dim(), d),
            ("self_attn.o_proj", d, self.q_dim()),
            ("mlp.gate_proj", f, d),
            ("mlp.up_proj", f, d),
            ("mlp.down_proj", d, f),
        ]
    }

    /// Parameters of one decoder block: the seven linears and two RMSNorm weights.
    pub fn block_parameters(&self) -> u64 {
        let linears: u64 = self
            .block_linears()
            .iter()
            .map(|&(_, out, inp)| (out * inp) as u64)
            .sum();
        linears + 2 * self.hidden_size as u64
    }

    /// Parameters of the token embedding (V·D).
    pub fn embedding_parameters(&self) -> u64 {
        (self.vocab_size * self.hidden_size) as u64
    }

    /// Parameters of the LM head that are not shared with the embedding (0 when tied).
    pub fn lm_head_parameters(&self) -> u64 {
        if self.tie_word_embeddings {
            0
        } else {
            self.embedding_parameters()
        }
    }

    /// Every parameter tensor of the HF checkpoint layout, in module order, with its shape.
    /// The LM head is listed only when untied.
    pub fn hf_parameter_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let (v, d) = (self.vocab_size, self.hidden_size);
        let mut out = vec![("model.embed_tokens.weight".to_string(), vec![v, d])];
        for i in 0..self.num_hidden_layers {
            let prefix = format!("model.layers.{i}");
            out.push((format!("{prefix}.input_layernorm.weight"), vec![d]));
            for (name, rows, cols) in self.block_linears() {
                out.push((format!("{prefix}.{name}.weight"), vec![rows, cols]));
            }
            out.push((format!("{prefix}.post_attention_layernorm.weight"), vec![d]));
        }
        out.push(("model.norm.weight".to_string(), vec![d]));
        if !self.tie_word_embeddings {
            out.push(("lm_head.weight".to_string(), vec![v, d]));
        }
        out
    }

    /// Total number of distinct parameters, as `sum(p.numel() for p in model.parameters())`.
    pub fn num_parameters(&self) -> u64 {
        self.embedding_parameters()
            + self.num_hidden_layers as u64 * self.block_parameters()
            + self.hidden_size as u64 // final norm
            + self.lm_head_parameters()
    }
}

fn token_id(v: &Value) -> Option<u32> {
    v.as_u64().and_then(|id| u32::try_from(id).ok())
}

fn parse_rope_scaling(
    s: &Map<String, Value>,
    err: &dyn Fn(String) -> Error,
) -> Result<RopeScaling> {
    // transformers 4.x wrote `type`, later versions `rope_type`.
    let kind = s
        .get("rope_type")
        .or_else(|| s.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let number = |key: &str| -> Result<f64> {
        s.get(key)
            .and_then(Value::as_f64)
            .ok_or_else(|| err(format!("rope scaling `{kind}` needs a number `{key}`")))
    };
    match kind {
        "default" => Ok(RopeScaling::Default),
        "llama3" => Ok(RopeScaling::Llama3 {
            factor: number("factor")?,
            low_freq_factor: number("low_freq_factor")?,
            high_freq_factor: number("high_freq_factor")?,
            original_max_position_embeddings: number("original_max_position_embeddings")?,
        }),
        other => Err(err(format!(
            "rope scaling type `{other}` is not supported (supported: default, llama3)"
        ))),
    }
}

/// Typed access to the keys of a config object, with errors that name the key.
struct Fields<'a> {
    obj: &'a Map<String, Value>,
    err: &'a dyn Fn(String) -> Error,
}

impl Fields<'_> {
    fn usize(&self, key: &str) -> Result<usize> {
        match self.obj.get(key) {
            None | Some(Value::Null) => Err((self.err)(format!("missing required key `{key}`"))),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| {
                    (self.err)(format!("`{key}` must be a non-negative integer, found {v}"))
                }),
        }
    }

    fn usize_or(&self, key: &str, default: usize) -> Result<usize> {
        match self.obj.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(_) => self.usize(key),
        }
    }

    fn f64_or(&self, key: &str, default: f64) -> Result<f64> {
        match self.obj.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v
                .as_f64()
                .ok_or_else(|| (self.err)(format!("`{key}` must be a number, found {v}"))),
        }
    }

    fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.obj.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| (self.err)(format!("`{key}` must be true or false, found {v}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<LlamaConfig> {
        LlamaConfig::from_hf_json(&v, "test")
    }

    fn base() -> Value {
        serde_json::json!({
            "vocab_size": 32, "hidden_size": 16, "intermediate_size": 24,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2
        })
    }

    #[test]
    fn rope_theta_is_read_from_either_place() {
        let mut top = base();
        top["rope_theta"] = 5e5.into();
        assert_eq!(parse(top).unwrap().rope_theta, 5e5);
        let mut nested = base();
        nested["rope_parameters"] = serde_json::json!({"rope_theta": 1e5, "rope_type": "default"});
        assert_eq!(parse(nested).unwrap().rope_theta, 1e5);
    }

    #[test]
    fn head_dim_is_derived_when_absent() {
        assert_eq!(parse(base()).unwrap().head_dim, 4);
    }

    #[test]
    fn zero_heads_is_an_error_that_names_the_key() {
        let mut v = base();
        v["num_attention_heads"] = 0.into();
        let msg = parse(v).unwrap_err().to_string();
        assert!(msg.contains("num_attention_heads"), "{msg}");
    }

    #[test]
    fn heads_not_dividing_hidden_is_an_error() {
        let mut v = base();
        v["num_attention_heads"] = 3.into();
        v["num_key_value_heads"] = 3.into();
        let msg = parse(v).unwrap_err().to_string();
        assert!(msg.contains("not divisible"), "{msg}");
    }

    #[test]
    fn kv_heads_must_divide_heads() {
        let mut v = base();
        v["num_key_value_heads"] = 3.into();
        assert!(
            parse(v)
                .unwrap_err()
                .to_string()
                .contains("multiple of num_key_value_heads")
        );
    }

    #[test]
    fn llama3_scaling_is_parsed_from_rope_scaling() {
        let mut v = base();
        v["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        assert!(
            matches!(parse(v).unwrap().rope_scaling, RopeScaling::Llama3 { factor, .. } if factor == 8.0)
        );
    }

    #[test]
    fn unsupported_rope_scaling_is_refused() {
        let mut v = base();
        v["rope_scaling"] = serde_json::json!({"type": "yarn", "factor": 4.0});
        assert!(parse(v).unwrap_err().to_string().contains("yarn"));
    }

    #[test]
    fn hf_parameter_shapes_sum_to_the_parameter_count() {
        for tied in [true, false] {
            let mut config = parse(base()).unwrap();
            config.tie_word_embeddings = tied;
            let total: u64 = config
                .hf_parameter_shapes()
                .iter()
                .map(|(_, s)| s.iter().product::<usize>() as u64)
                .sum();
            assert_eq!(total, config.num_parameters());
        }
    }

    #[test]
    fn hf_json_round_trips() {
        let mut v = base();
        v["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 32.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        v["eos_token_id"] = serde_json::json!([1, 2]);
        let config = parse(v).unwrap();
        assert_eq!(parse(config.to_hf_json()).unwrap(), config);
    }
}
