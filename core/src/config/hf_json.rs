//! `LlamaConfig` from and to a Hugging Face `config.json` (transformers 4.x and 5.x layouts).

use std::path::Path;

use serde_json::{Map, Value};

use super::llama::{LlamaConfig, RopeScaling};
use crate::error::{Error, Result};

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

        let model_type = obj.get("model_type").and_then(Value::as_str);
        if let Some(model_type) = model_type
            && !matches!(
                model_type,
                "llama" | "mistral" | "smollm2" | "qwen2" | "qwen3" | "phi3"
            )
        {
            // Other architectures differ in ways this Llama does not model (norms, fused
            // projections, activations...).
            return Err(err(format!(
                "model_type `{model_type}` is not supported; napkin implements the Llama \
                 family: `llama`, `mistral`, `qwen2`, `qwen3`, `phi3`"
            )));
        }
        // Qwen2 is a Llama with a bias on q, k and v (always: its config has no flag for it).
        let qwen2 = model_type == Some("qwen2");
        // Qwen3 is a Llama with an RMSNorm on each query and key head (again without a flag).
        let qwen3 = model_type == Some("qwen3");
        // Phi-3 is a Llama whose checkpoint fuses q, k, v and gate, up (`config/fused.rs`),
        // with dropout on the residual branches and the embedding when these are set.
        let phi3 = model_type == Some("phi3");
        for key in ["resid_pdrop", "embd_pdrop", "attention_dropout"] {
            if let Some(p) = obj.get(key).and_then(Value::as_f64)
                && p != 0.0
            {
                return Err(err(format!(
                    "`{key}: {p}` is not supported: napkin's model has no dropout of its own \
                     (LoRA's is `--lora-dropout`)"
                )));
            }
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
                    "`{flag}: true` is not supported: of the biases, napkin implements Qwen2's \
                     on q, k and v only (model_type `qwen2`)"
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
        // Phi-4-mini's RoPE turns part of each head only.
        for (place, value) in [
            ("partial_rotary_factor", obj.get("partial_rotary_factor")),
            (
                "rope_parameters.partial_rotary_factor",
                rope_params.and_then(|p| p.get("partial_rotary_factor")),
            ),
        ] {
            if let Some(factor) = value.and_then(Value::as_f64)
                && factor != 1.0
            {
                return Err(err(format!(
                    "`{place}: {factor}` is not supported: napkin's RoPE turns the whole head"
                )));
            }
        }
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

        // Mistral's window (null in Mistral-7B v0.2 and later). Qwen2 writes one beside
        // `use_sliding_window: false`, which turns it off; when on, it windows the layers from
        // `max_window_layers` on. transformers 5 states each layer's kind in `layer_types`,
        // which wins. napkin windows every layer or none.
        let window_on = obj.get("use_sliding_window").and_then(Value::as_bool) != Some(false);
        let layers = fields.usize("num_hidden_layers")?;
        let windowed_layers = match obj.get("layer_types") {
            None | Some(Value::Null) => None,
            Some(Value::Array(kinds)) => {
                let mut windowed = 0;
                for kind in kinds {
                    match kind.as_str() {
                        Some("full_attention") => {}
                        Some("sliding_attention") => windowed += 1,
                        _ => {
                            return Err(err(format!(
                                "`layer_types` holds {kind}: napkin implements \
                                 `full_attention` and `sliding_attention`"
                            )));
                        }
                    }
                }
                Some(windowed)
            }
            Some(other) => {
                return Err(err(format!("`layer_types` must be a list, found {other}")));
            }
        };
        let sliding_window = match obj.get("sliding_window") {
            None | Some(Value::Null) => None,
            Some(_) if !window_on => None,
            Some(_) => {
                let windowed = match windowed_layers {
                    Some(n) => n,
                    None if qwen2 || qwen3 => {
                        layers.saturating_sub(fields.usize_or("max_window_layers", 28)?)
                    }
                    None => layers,
                };
                match windowed {
                    0 => None,
                    n if n == layers => Some(fields.usize("sliding_window")?),
                    n => {
                        return Err(err(format!(
                            "a sliding window on {n} of the {layers} layers \
                             (`layer_types` / `max_window_layers`): napkin windows every layer \
                             or none"
                        )));
                    }
                }
            }
        };
        let config = LlamaConfig {
            vocab_size: fields.usize("vocab_size")?,
            hidden_size,
            intermediate_size: fields.usize("intermediate_size")?,
            num_hidden_layers: layers,
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
            sliding_window,
            qkv_bias: qwen2,
            qk_norm: qwen3,
            fused_projections: phi3,
        };
        config.validate(source_name)?;
        Ok(config)
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
        let (architecture, model_type) = self.hf_family();
        let mut config = serde_json::json!({
            "architectures": [architecture],
            "model_type": model_type,
            "sliding_window": self.sliding_window,
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
        });
        if self.fused_projections {
            // Without LongRoPE (which napkin refuses) the original context is the context;
            // Phi3Config's default pad token (32000) lies outside a smaller vocabulary.
            config["original_max_position_embeddings"] = self.max_position_embeddings.into();
            config["pad_token_id"] = Value::Null;
        }
        if self.qkv_bias || self.qk_norm {
            config["use_sliding_window"] = self.sliding_window.is_some().into();
            config["max_window_layers"] = 0.into();
        }
        config
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

    /// Mistral v0.1's window is read (and written back as a Mistral), and a null one or one that
    /// `use_sliding_window: false` turns off is none.
    #[test]
    fn a_sliding_window_is_kept() {
        let mut mistral = base();
        mistral["model_type"] = "mistral".into();
        mistral["sliding_window"] = 8.into();
        let c = parse(mistral.clone()).unwrap();
        assert_eq!(c.sliding_window, Some(8));
        let written = c.to_hf_json();
        assert_eq!(written["model_type"], "mistral");
        assert_eq!(parse(written).unwrap(), c);
        mistral["sliding_window"] = Value::Null;
        assert_eq!(parse(mistral.clone()).unwrap().sliding_window, None);
        mistral["sliding_window"] = 8.into();
        mistral["use_sliding_window"] = false.into();
        assert_eq!(parse(mistral).unwrap().sliding_window, None);
        let llama = parse(base()).unwrap();
        assert_eq!(llama.sliding_window, None);
        assert_eq!(llama.to_hf_json()["model_type"], "llama");
    }

    /// Qwen2 is read as a Llama with q, k and v biases and written back as a Qwen2; its window
    /// counts only when `use_sliding_window` is on, on every layer or on none.
    #[test]
    fn qwen2_has_qkv_biases_and_its_window_rules() {
        let mut qwen = base();
        qwen["model_type"] = "qwen2".into();
        qwen["sliding_window"] = 8.into();
        qwen["use_sliding_window"] = false.into();
        qwen["max_window_layers"] = 1.into();
        let c = parse(qwen.clone()).unwrap();
        assert!(c.qkv_bias && c.sliding_window.is_none());
        assert!(c.linear_has_bias("self_attn.v_proj") && !c.linear_has_bias("self_attn.o_proj"));
        let written = c.to_hf_json();
        assert_eq!(written["architectures"][0], "Qwen2ForCausalLM");
        assert_eq!(parse(written).unwrap(), c);
        qwen["use_sliding_window"] = true.into();
        let message = parse(qwen.clone()).unwrap_err().to_string();
        assert!(message.contains("on 1 of the 2 layers"), "{message}");
        let mut typed = qwen.clone();
        typed["layer_types"] = serde_json::json!(["sliding_attention", "sliding_attention"]);
        assert_eq!(parse(typed.clone()).unwrap().sliding_window, Some(8));
        typed["layer_types"] = serde_json::json!(["full_attention", "chunked_attention"]);
        let message = parse(typed).unwrap_err().to_string();
        assert!(message.contains("chunked_attention"), "{message}");
        qwen["max_window_layers"] = 0.into();
        let windowed = parse(qwen.clone()).unwrap();
        assert_eq!(windowed.sliding_window, Some(8));
        assert_eq!(parse(windowed.to_hf_json()).unwrap(), windowed);
        qwen["max_window_layers"] = 2.into();
        assert_eq!(parse(qwen).unwrap().sliding_window, None);
        let mut llama = base();
        llama["attention_bias"] = true.into();
        let message = parse(llama).unwrap_err().to_string();
        assert!(message.contains("`attention_bias: true`"), "{message}");
        let mut gemma = base();
        gemma["model_type"] = "gemma".into();
        let message = parse(gemma).unwrap_err().to_string();
        assert!(message.contains("model_type `gemma`"), "{message}");
    }

    /// Qwen3 is read as a Llama with q/k norms (no biases) and written back as a Qwen3, under
    /// Qwen2's window rules; its `attention_bias: true` (on o too) is refused.
    #[test]
    fn qwen3_has_head_norms_and_qwen2s_window_rules() {
        let mut qwen = base();
        qwen["model_type"] = "qwen3".into();
        qwen["head_dim"] = 8.into();
        qwen["sliding_window"] = 8.into();
        qwen["use_sliding_window"] = true.into();
        qwen["max_window_layers"] = 2.into();
        let c = parse(qwen.clone()).unwrap();
        assert!(c.qk_norm && !c.qkv_bias && c.sliding_window.is_none());
        assert_eq!(c.head_dim, 8);
        let written = c.to_hf_json();
        assert_eq!(written["architectures"][0], "Qwen3ForCausalLM");
        assert_eq!(parse(written).unwrap(), c);
        qwen["max_window_layers"] = 1.into();
        let message = parse(qwen.clone()).unwrap_err().to_string();
        assert!(message.contains("on 1 of the 2 layers"), "{message}");
        qwen["max_window_layers"] = 2.into();
        qwen["attention_bias"] = true.into();
        let message = parse(qwen).unwrap_err().to_string();
        assert!(message.contains("`attention_bias: true`"), "{message}");
    }

    /// Phi-3 is read as a Llama with fused projections, windowed on every layer, and written
    /// back as a Phi-3; LongRoPE (Phi-3-mini-128k, Phi-3.5), a partial rotary factor
    /// (Phi-4-mini) and the model's own dropout are refused by name.
    #[test]
    fn phi3_is_a_fused_llama_and_its_extras_are_refused() {
        let mut phi = base();
        phi["model_type"] = "phi3".into();
        phi["sliding_window"] = 2047.into();
        phi["resid_pdrop"] = 0.0.into();
        phi["rope_parameters"] = serde_json::json!({"rope_theta": 1e4, "rope_type": "default",
            "partial_rotary_factor": 1.0});
        let c = parse(phi.clone()).unwrap();
        assert!(c.fused_projections && !c.qkv_bias && !c.qk_norm);
        assert_eq!(c.sliding_window, Some(2047));
        let written = c.to_hf_json();
        assert_eq!(written["architectures"][0], "Phi3ForCausalLM");
        assert_eq!(written["model_type"], "phi3");
        assert_eq!(parse(written).unwrap(), c);
        let refused = |key: &str, value: Value, says: &str| {
            let mut v = phi.clone();
            v[key] = value;
            let message = parse(v).unwrap_err().to_string();
            assert!(message.contains(says), "{key}: {message}");
        };
        refused(
            "rope_parameters",
            serde_json::json!({"rope_theta": 1e4, "rope_type": "longrope",
                "short_factor": [1.0], "long_factor": [1.0]}),
            "`longrope` is not supported",
        );
        refused(
            "partial_rotary_factor",
            0.75.into(),
            "`partial_rotary_factor: 0.75` is not supported",
        );
        refused(
            "resid_pdrop",
            0.1.into(),
            "`resid_pdrop: 0.1` is not supported",
        );
        refused("embd_pdrop", 0.1.into(), "`embd_pdrop: 0.1`");
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
    fn hf_json_round_trips() {
        let mut v = base();
        v["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 32.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        v["eos_token_id"] = serde_json::json!([1, 2]);
        let config = parse(v).unwrap();
        assert_eq!(parse(config.to_hf_json()).unwrap(), config);
    }
}
