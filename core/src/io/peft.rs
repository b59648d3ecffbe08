//! peft's LoRA adapter format, in and out: `adapter_config.json` + `adapter_model.safetensors`
//! with keys `base_model.model.<module path>.lora_A.weight` (`[r, in]`) and `.lora_B.weight`
//! (`[out, r]`), and with DoRA (`use_dora`) `.lora_magnitude_vector` (`[out]`), so adapters
//! move between napkin and the Python ecosystem unchanged.

use std::collections::BTreeMap;
use std::path::Path;

use burn::tensor::Tensor;
use safetensors::Dtype;
use safetensors::tensor::TensorView;
use serde_json::{Value, json};

use super::atomic::write_atomic;
use super::peft_fused::{FusedPart, alpha_for, stack};
use super::safetensors::SafetensorsCheckpoint;
use crate::config::{FUSED_PROJECTIONS, LoraConfig, LoraTarget, TargetNames};
use crate::error::{Error, Result};
use crate::kernels::values::to_f32_vec;
use crate::model::Llama;
use crate::model::apply_tricks::matrix;
use crate::model::lora::LoraAdapter;
use crate::model::quantized_llama::{AdapterValues, QuantizedLlama};

/// The prefix peft puts before the HF module path.
pub const PEFT_PREFIX: &str = "base_model.model.";

/// The suffix of a DoRA magnitude's key (peft writes it without `.weight`).
pub const MAGNITUDE: &str = ".lora_magnitude_vector";

/// One linear's adapter as read: A `[r, in]`, B `[out, r]`, rank, scaling, and DoRA's
/// magnitude `[out]`.
struct ReadAdapter {
    a: Vec<f32>,
    b: Vec<f32>,
    rank: usize,
    scaling: f64,
    magnitude: Option<Vec<f32>>,
}

/// Refuses an adapter file holding tensors beyond the `used` ones that were read.
fn refuse_unused_tensors(
    checkpoint: &SafetensorsCheckpoint,
    used: usize,
    file: &Path,
) -> Result<()> {
    let total = checkpoint.names().count();
    if total == used {
        return Ok(());
    }
    let extra: Vec<&str> = checkpoint
        .names()
        .filter(|n| {
            !n.contains(".lora_A.")
                && !n.contains(".lora_B.")
                && !n.contains(".lora_embedding_")
                && !n.ends_with(MAGNITUDE)
        })
        .take(5)
        .collect();
    Err(Error::UnexpectedTensors {
        path: file.to_path_buf(),
        names: format!("{total} tensors for {used} expected ({})", extra.join(", ")),
    })
}

/// Puts the peft adapter in `dir` on a [`QuantizedLlama`] (A and B kept in f32 beside the
/// quantized products); returns its configuration.
pub fn load_lora_quantized(model: &mut QuantizedLlama, dir: &Path) -> Result<LoraConfig> {
    let (json, source) = read_adapter_json(dir)?;
    let config = parse_adapter_config(&json, &source)?;
    let file = dir.join("adapter_model.safetensors");
    let checkpoint = SafetensorsCheckpoint::open(&file)?;
    let model_config = model.config.clone();
    let shapes = model_config.hf_parameter_shapes();
    let mut used = std::collections::BTreeSet::new();
    for layer in 0..model_config.num_hidden_layers {
        for target in LoraTarget::ALL {
            if !config.targets(target) {
                continue;
            }
            let path = format!("model.layers.{layer}.{}", target.block_path());
            let weight = format!("{path}.weight");
            let [out, inp] = match shapes.iter().find(|(n, _)| *n == weight) {
                Some((_, shape)) if shape.len() == 2 => [shape[0], shape[1]],
                _ => return Err(Error::Internal(format!("no shape for `{weight}`"))),
            };
            let read = read_adapter(
                &checkpoint,
                &json,
                &config,
                &model_config,
                &path,
                [out, inp],
                &mut used,
            )?;
            model.attach_lora(
                layer,
                target,
                &AdapterValues {
                    a: &read.a,
                    b: &read.b,
                    rank: read.rank,
                    scale: read.scaling as f32,
                    magnitude: read.magnitude.as_deref(),
                },
            )?;
        }
    }
    if config.embedding || config.head {
        crate::model::apply_tricks::model_takes_outer_adapters(&model_config, &config)?;
        let (v, d, r) = (model_config.vocab_size, model_config.hidden_size, config.r);
        let mut read = |name: String, shape: &[usize]| -> Result<Vec<f32>> {
            let values = checkpoint.read_f32(&name, shape)?;
            used.insert(name);
            Ok(values)
        };
        for (head, module) in [(false, "model.embed_tokens"), (true, "lm_head")] {
            let wanted = if head { config.head } else { config.embedding };
            let base = format!("{PEFT_PREFIX}{module}.base_layer.weight");
            if wanted && checkpoint.contains(&base) {
                model.replace_outer_weight(head, read(base, &[v, d])?)?;
            }
        }
        if config.embedding {
            let module = "model.embed_tokens";
            let a = read(format!("{PEFT_PREFIX}{module}.lora_embedding_A"), &[r, v])?;
            let b = read(format!("{PEFT_PREFIX}{module}.lora_embedding_B"), &[d, r])?;
            model.attach_embedding_lora(&a, &b, r, config.scaling() as f32)?;
        }
        if config.head {
            let a = read(format!("{PEFT_PREFIX}lm_head.lora_A.weight"), &[r, d])?;
            let b = read(format!("{PEFT_PREFIX}lm_head.lora_B.weight"), &[v, r])?;
            let magnitude = match config.use_dora {
                true => Some(read(format!("{PEFT_PREFIX}lm_head{MAGNITUDE}"), &[v])?),
                false => None,
            };
            model.attach_head_lora(&AdapterValues {
                a: &a,
                b: &b,
                rank: r,
                scale: config.scaling() as f32,
                magnitude: magnitude.as_deref(),
            })?;
        }
    }
    refuse_unused_tensors(&checkpoint, used.len(), &file)?;
    Ok(config)
}

/// The adapter of the linear at `path` (`[out, inp]`), its keys added to `used`. A part of
/// Phi-3's fused module reads the fused adapter: A whole, the part's rows of B
/// (`peft_fused.rs`); DoRA is refused there.
fn read_adapter(
    checkpoint: &SafetensorsCheckpoint,
    json: &Value,
    config: &LoraConfig,
    model: &crate::config::LlamaConfig,
    path: &str,
    [out, inp]: [usize; 2],
    used: &mut std::collections::BTreeSet<String>,
) -> Result<ReadAdapter> {
    let part = model.stored_rows(&format!("{path}.weight"));
    if part.is_some() && config.use_dora {
        return Err(Error::Input(format!(
            "`{path}`: DoRA on Phi-3's fused projections is not supported"
        )));
    }
    let (module, rows, total, rank, scaling) = match &part {
        Some(part) => {
            let module = part.tensor.trim_end_matches(".weight").to_string();
            let name = module.rsplit('.').next().unwrap_or_default();
            let (rank, alpha) = fused_rank_alpha(json, name, config);
            let scaling = LoraConfig {
                r: rank,
                alpha,
                ..config.clone()
            }
            .scaling();
            let rows = part.start..part.start + part.rows;
            (module, rows, part.total, rank, scaling)
        }
        None => (path.to_string(), 0..out, out, config.r, config.scaling()),
    };
    let key = |m: &str| format!("{PEFT_PREFIX}{module}.{m}.weight");
    let a = checkpoint.read_f32(&key("lora_A"), &[rank, inp])?;
    let b = checkpoint.read_f32(&key("lora_B"), &[total, rank])?;
    used.insert(key("lora_A"));
    used.insert(key("lora_B"));
    let magnitude = match config.use_dora {
        true => {
            let name = format!("{PEFT_PREFIX}{module}{MAGNITUDE}");
            let m = checkpoint.read_f32(&name, &[out])?;
            used.insert(name);
            Some(m)
        }
        false => None,
    };
    Ok(ReadAdapter {
        a,
        b: b[rows.start * rank..rows.end * rank].to_vec(),
        rank,
        scaling,
        magnitude,
    })
}

/// Reads `adapter_config.json`.
pub fn read_adapter_config(dir: &Path) -> Result<LoraConfig> {
    let (json, source) = read_adapter_json(dir)?;
    parse_adapter_config(&json, &source)
}

fn read_adapter_json(dir: &Path) -> Result<(Value, String)> {
    let path = dir.join("adapter_config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let json: Value = serde_json::from_str(&text).map_err(|error| Error::Json {
        path: path.clone(),
        error,
    })?;
    Ok((json, path.display().to_string()))
}

/// Whether `name` is one of Phi-3's fused modules (`qkv_proj`, `gate_up_proj`), the only
/// ones a `rank_pattern` or `alpha_pattern` may name.
fn is_fused_module(name: &str) -> bool {
    FUSED_PROJECTIONS
        .iter()
        .any(|(path, _)| path.rsplit('.').next() == Some(name))
}

/// A fused module's rank and α: its `rank_pattern` and `alpha_pattern` entries, else the
/// adapter's own.
fn fused_rank_alpha(json: &Value, module: &str, config: &LoraConfig) -> (usize, f64) {
    let entry = |key: &str| json.get(key).and_then(|m| m.get(module));
    let rank = entry("rank_pattern")
        .and_then(Value::as_u64)
        .map_or(config.r, |r| r as usize);
    let alpha = entry("alpha_pattern")
        .and_then(Value::as_f64)
        .unwrap_or(config.alpha);
    (rank, alpha)
}

/// Parses the JSON of an `adapter_config.json`, refusing what napkin does not implement.
pub fn parse_adapter_config(json: &Value, source: &str) -> Result<LoraConfig> {
    let err = |m: String| Error::config(source, m);
    if let Some(kind) = json.get("peft_type").and_then(Value::as_str)
        && kind != "LORA"
    {
        return Err(err(format!(
            "peft_type `{kind}` is not supported, expected LORA"
        )));
    }
    if let Some(bias) = json.get("bias").and_then(Value::as_str)
        && bias != "none"
    {
        return Err(err(format!(
            "bias `{bias}` is not supported, expected \"none\""
        )));
    }
    for key in ["rank_pattern", "alpha_pattern"] {
        if let Some(other) = json
            .get(key)
            .and_then(Value::as_object)
            .and_then(|m| m.keys().find(|k| !is_fused_module(k)))
        {
            return Err(err(format!(
                "per-module `{key}` is not supported (found `{other}`; napkin writes one for \
                 Phi-3's fused qkv_proj and gate_up_proj only)"
            )));
        }
    }
    let r = json
        .get("r")
        .and_then(Value::as_u64)
        .ok_or_else(|| err("missing integer `r`".into()))? as usize;
    let alpha = json
        .get("lora_alpha")
        .and_then(Value::as_f64)
        .ok_or_else(|| err("missing number `lora_alpha`".into()))?;
    let dropout = json
        .get("lora_dropout")
        .and_then(Value::as_f64)
        .unwrap_or(0.0);
    // Phi-3's fused modules name all their parts (`LoraTarget::parse_list`).
    let targets = match json.get("target_modules") {
        Some(Value::String(s)) => TargetNames::parse(s)?,
        Some(Value::Array(items)) => {
            let names: Vec<&str> = items.iter().filter_map(Value::as_str).collect();
            if names.len() != items.len() {
                return Err(err("`target_modules` must be a list of names".into()));
            }
            TargetNames::parse(&names.join(","))?
        }
        _ => return Err(err("missing `target_modules`".into())),
    };
    let config = LoraConfig {
        r,
        alpha,
        dropout,
        targets: targets.blocks,
        embedding: targets.embedding,
        head: targets.head,
        use_rslora: json
            .get("use_rslora")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        use_dora: json
            .get("use_dora")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    };
    config.validate().map_err(|e| err(e.to_string()))?;
    Ok(config)
}

/// The `adapter_config.json` peft writes for this config (keys peft reads; the rest default),
/// naming the base model when it is known (`AutoPeftModel` loads the base from it).
pub fn adapter_config_json(config: &LoraConfig, base: Option<&str>) -> Value {
    let targets = config.target_names().peft_names();
    json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": config.r,
        "lora_alpha": config.alpha,
        "lora_dropout": config.dropout,
        "target_modules": targets,
        "bias": "none",
        "use_rslora": config.use_rslora,
        "use_dora": config.use_dora,
        "fan_in_fan_out": false,
        "init_lora_weights": true,
        "inference_mode": true,
        "modules_to_save": null,
        "rank_pattern": {},
        "alpha_pattern": {},
        "base_model_name_or_path": base,
        "revision": null,
    })
}

impl Llama {
    /// Freezes the base and attaches the adapters stored in a peft folder. Every targeted module
    /// must have both matrices with the right shapes, and nothing else may be in the file.
    pub fn load_lora(self, dir: &Path) -> Result<(Self, LoraConfig)> {
        let (json, source) = read_adapter_json(dir)?;
        let config = parse_adapter_config(&json, &source)?;
        let file = dir.join("adapter_model.safetensors");
        let checkpoint = SafetensorsCheckpoint::open(&file)?;
        let mut model = self.freeze_base();
        let device = model.device();
        let shapes = model.config.clone();
        let mut used = std::collections::BTreeSet::new();
        for named in model.block_linears_mut() {
            if !config.targets(named.target) {
                continue;
            }
            let [out, inp] = named.linear.dims();
            let read = read_adapter(
                &checkpoint,
                &json,
                &config,
                &shapes,
                &named.path,
                [out, inp],
                &mut used,
            )?;
            let adapter = LoraAdapter::from_weights(
                matrix(read.a, read.rank, inp, &device),
                matrix(read.b, out, read.rank, &device),
                read.scaling,
                config.dropout,
            );
            named.linear.lora = Some(match read.magnitude {
                Some(m) => {
                    let weight = named.linear.dense_weight(&device).detach();
                    adapter.with_dora(
                        Tensor::from_data(burn::tensor::TensorData::new(m, [out]), &device),
                        weight.cast(burn::tensor::FloatDType::F32),
                    )
                }
                None => adapter,
            });
        }
        model.load_outer_adapters(&checkpoint, &config, &mut used)?;
        refuse_unused_tensors(&checkpoint, used.len(), &file)?;
        Ok((model, config))
    }

    /// The adapters of the embedding and the head (peft's `embed_tokens`, `lm_head`), with the
    /// base weights peft writes beside them (`….base_layer.weight`, its
    /// `save_embedding_layers="auto"`), which replace the model's as peft's loading does.
    fn load_outer_adapters(
        &mut self,
        checkpoint: &SafetensorsCheckpoint,
        config: &LoraConfig,
        used: &mut std::collections::BTreeSet<String>,
    ) -> Result<()> {
        crate::model::apply_tricks::model_takes_outer_adapters(&self.config, config)?;
        let device = self.device();
        let (v, d, r) = (self.config.vocab_size, self.config.hidden_size, config.r);
        let mut read = |name: String, shape: &[usize]| -> Result<Vec<f32>> {
            let values = checkpoint.read_f32(&name, shape)?;
            used.insert(name);
            Ok(values)
        };
        let base_of = |module: &str| format!("{PEFT_PREFIX}{module}.base_layer.weight");
        if config.embedding {
            let module = "model.embed_tokens";
            if checkpoint.contains(&base_of(module)) {
                let table = read(base_of(module), &[v, d])?;
                self.embed_tokens = burn::module::Param::from_tensor(matrix(table, v, d, &device))
                    .set_require_grad(false);
            }
            let a = read(format!("{PEFT_PREFIX}{module}.lora_embedding_A"), &[r, v])?;
            let b = read(format!("{PEFT_PREFIX}{module}.lora_embedding_B"), &[d, r])?;
            self.embed_lora = Some(crate::model::embedding_lora::EmbeddingLora::from_weights(
                matrix(a, r, v, &device),
                matrix(b, d, r, &device),
                config.scaling(),
            ));
        }
        if config.head {
            let module = "lm_head";
            let Some(head) = self.lm_head.as_mut() else {
                return Err(Error::Internal("an untied model without its head".into()));
            };
            if checkpoint.contains(&base_of(module)) {
                let weight = read(base_of(module), &[v, d])?;
                head.base = crate::model::linear::BaseWeight::Dense(
                    burn::module::Param::from_tensor(matrix(weight, v, d, &device))
                        .set_require_grad(false),
                );
            }
            let a = read(format!("{PEFT_PREFIX}{module}.lora_A.weight"), &[r, d])?;
            let b = read(format!("{PEFT_PREFIX}{module}.lora_B.weight"), &[v, r])?;
            let adapter = LoraAdapter::from_weights(
                matrix(a, r, d, &device),
                matrix(b, v, r, &device),
                config.scaling(),
                config.dropout,
            );
            head.lora = Some(if config.use_dora {
                let m = read(format!("{PEFT_PREFIX}{module}{MAGNITUDE}"), &[v])?;
                let weight = head.dense_weight(&device).detach();
                adapter.with_dora(
                    Tensor::from_data(burn::tensor::TensorData::new(m, [v]), &device),
                    weight.cast(burn::tensor::FloatDType::F32),
                )
            } else {
                adapter
            });
        }
        Ok(())
    }

    /// Writes the model's adapters in peft format (`adapter_config.json` and
    /// `adapter_model.safetensors`), each atomically.
    pub fn save_lora(&self, config: &LoraConfig, dir: &Path) -> Result<()> {
        for (name, bytes) in self.lora_files(config)? {
            write_atomic(&dir.join(name), &bytes)?;
        }
        Ok(())
    }

    /// The peft files of the model's adapters, by file name, in memory.
    pub fn lora_files(&self, config: &LoraConfig) -> Result<Vec<(String, Vec<u8>)>> {
        self.lora_files_on(config, None)
    }

    /// [`Llama::lora_files`] with the base model's name or path recorded in
    /// `adapter_config.json`.
    pub fn lora_files_on(
        &self,
        config: &LoraConfig,
        base: Option<&str>,
    ) -> Result<Vec<(String, Vec<u8>)>> {
        let mut tensors: BTreeMap<String, (Vec<usize>, Vec<u8>)> = BTreeMap::new();
        let mut insert_key = |key: String, value: Tensor<1>, dims: Vec<usize>| {
            let bytes = to_f32_vec(value)
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            tensors.insert(key, (dims, bytes));
        };
        // One linear's adapter: A and B under `….weight`, DoRA's magnitude without it.
        let mut insert_linear = |path: &str, adapter: &LoraAdapter| {
            for (name, param) in [("lora_A", &adapter.lora_a), ("lora_B", &adapter.lora_b)] {
                let value = param.val();
                let dims = value.dims().to_vec();
                insert_key(
                    format!("{PEFT_PREFIX}{path}.{name}.weight"),
                    value.reshape([-1]),
                    dims,
                );
            }
            if let Some(magnitude) = &adapter.magnitude {
                let value = magnitude.val();
                let dims = value.dims().to_vec();
                insert_key(format!("{PEFT_PREFIX}{path}{MAGNITUDE}"), value, dims);
            }
        };
        for (path, _, adapter) in self.lora_adapters() {
            if self.config.stored_rows(&format!("{path}.weight")).is_some() {
                continue; // written stacked below
            }
            insert_linear(&path, adapter);
        }
        if let Some((path, adapter)) = self.head_adapter() {
            insert_linear(path, adapter);
        }
        if let Some(lora) = &self.embed_lora {
            for (name, param) in [
                ("lora_embedding_A", &lora.lora_a),
                ("lora_embedding_B", &lora.lora_b),
            ] {
                let value = param.val();
                let dims = value.dims().to_vec();
                insert_key(
                    format!("{PEFT_PREFIX}model.embed_tokens.{name}"),
                    value.reshape([-1]),
                    dims,
                );
            }
        }
        let mut insert = |name: String, dims: Vec<usize>, values: &[f32]| {
            let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            tensors.insert(format!("{PEFT_PREFIX}{name}.weight"), (dims, bytes));
        };
        // Phi-3's fused modules: their parts' adapters stacked, with the stacked rank and α.
        let mut patterns: BTreeMap<String, (usize, f64)> = BTreeMap::new();
        let linears = self.block_linears();
        for layer in 0..self.config.num_hidden_layers {
            for (fused, _) in FUSED_PROJECTIONS {
                let Some(parts) = self.config.fused_parts(fused) else {
                    continue;
                };
                let path = format!("model.layers.{layer}.{fused}");
                let adapter_of = |module: &str| {
                    let wanted = format!("model.layers.{layer}.{module}");
                    linears
                        .iter()
                        .find(|n| n.path == wanted)
                        .and_then(|n| n.linear.lora.as_ref())
                };
                let inp = self.config.hidden_size;
                let stacked: Vec<FusedPart> = parts
                    .iter()
                    .map(|&(module, rows)| FusedPart {
                        rows,
                        adapter: adapter_of(module).map(|a| {
                            (
                                to_f32_vec(a.lora_a.val()),
                                to_f32_vec(a.lora_b.val()),
                                a.scaling,
                            )
                        }),
                    })
                    .collect();
                if stacked.iter().all(|p| p.adapter.is_none()) {
                    continue;
                }
                let scaling = config.scaling();
                let (a, b, rank) = stack(&stacked, inp, scaling);
                let total = parts.iter().map(|(_, rows)| rows).sum();
                insert(format!("{path}.lora_A"), vec![rank, inp], &a);
                insert(format!("{path}.lora_B"), vec![total, rank], &b);
                let name = fused.rsplit('.').next().unwrap_or_default().to_string();
                let alpha = alpha_for(scaling, rank, config.use_rslora);
                if let Some(&(seen, _)) = patterns.get(&name)
                    && seen != rank
                {
                    return Err(Error::Input(format!(
                        "`{path}`'s adapters stack to rank {rank}, layer 0's to {seen}: peft's \
                         rank_pattern holds one rank per module name"
                    )));
                }
                patterns.insert(name, (rank, alpha));
            }
        }
        if tensors.is_empty() {
            return Err(Error::Input(
                "the model has no LoRA adapters to save".into(),
            ));
        }
        let mut json_value = adapter_config_json(config, base);
        if self.config.fused_projections {
            // peft's Phi-3 has no q_proj or gate_proj: its target names are the fused modules.
            let mut targets: Vec<&str> = config
                .targets
                .iter()
                .map(|t| match self.config.fused_module_of(t.block_path()) {
                    Some(fused) => fused.rsplit('.').next().unwrap_or_default(),
                    None => t.module_name(),
                })
                .collect();
            targets.dedup();
            json_value["target_modules"] = json!(targets);
            for (name, (rank, alpha)) in &patterns {
                json_value["rank_pattern"][name] = json!(rank);
                json_value["alpha_pattern"][name] = json!(alpha);
            }
        }
        let json = serde_json::to_string_pretty(&json_value).unwrap_or_default();
        Ok(vec![
            ("adapter_model.safetensors".into(), serialize_f32(&tensors)?),
            ("adapter_config.json".into(), json.into_bytes()),
        ])
    }
}

/// Serializes little-endian f32 tensors to safetensors bytes.
pub fn serialize_f32(tensors: &BTreeMap<String, (Vec<usize>, Vec<u8>)>) -> Result<Vec<u8>> {
    let views = tensors
        .iter()
        .map(|(name, (shape, bytes))| {
            TensorView::new(Dtype::F32, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| Error::Internal(format!("tensor `{name}`: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    safetensors::serialize(views, None)
        .map_err(|e| Error::Internal(format!("serializing safetensors: {e}")))
}
