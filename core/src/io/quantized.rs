//! napkin's quantized checkpoint: a folder that loads back into a QLoRA-ready [`Llama`] without
//! ever materialising the float block weights.
//!
//! ```text
//! config.json          the HF config, unchanged
//! napkin_quant.json    {"format": "napkin-nf4", "version": 1, "block_size": 64, "double_quant": bool}
//! model.safetensors    float tensors under their HF names (embedding, norms, LM head), and for
//!                      each block linear `<hf name>` (e.g. model.layers.0.mlp.up_proj.weight):
//!                        <hf name>.nf4_packed    U8  [ceil(out·in / 2)]  two codes a byte, high nibble first
//!                        <hf name>.nf4_absmax    F32 [blocks]            (plain scales), or
//!                        <hf name>.nf4_qabsmax   U8  [blocks]            (double quantization)
//!                        <hf name>.nf4_absmax2   F32 [ceil(blocks/256)]
//!                        <hf name>.nf4_offset    F32 [1]
//! ```
//! The logical shape `[out, in]` comes from the config. Every file is written atomically.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use burn::tensor::{Device, Tensor, TensorData};
use safetensors::Dtype;
use safetensors::tensor::TensorView;
use serde_json::{Value, json};

use super::atomic::write_atomic;
use super::hf::build_llama;
use super::safetensors::SafetensorsCheckpoint;
use crate::config::{DOUBLE_QUANT_BLOCK, LlamaConfig, Nf4Config};
use crate::error::{Error, Result};
use crate::model::Llama;
use crate::model::linear::{BaseWeight, Linear};
use crate::quant::nf4::{Nf4Scales, Nf4Tensor};

/// The marker file of a quantized checkpoint.
pub const QUANT_FILE: &str = "napkin_quant.json";

/// Whether `dir` holds a napkin quantized checkpoint.
pub fn is_quantized_checkpoint(dir: &Path) -> bool {
    dir.join(QUANT_FILE).is_file()
}

/// Writes `model` (whose block linears are NF4) as a quantized checkpoint in `dir`.
pub fn save_quantized(model: &Llama, nf4: &Nf4Config, dir: &Path) -> Result<()> {
    let mut tensors: BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)> = BTreeMap::new();
    let f32_bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let mut quantized_names = std::collections::HashSet::new();
    for named in model.block_linears() {
        let name = format!("{}.weight", named.path);
        let BaseWeight::Nf4(w) = &named.linear.base else {
            return Err(Error::Input(format!(
                "{name} is not NF4-quantized; quantize the model first"
            )));
        };
        let q = &w.quantized;
        tensors.insert(
            format!("{name}.nf4_packed"),
            (Dtype::U8, vec![q.packed.len()], q.packed.clone()),
        );
        match &q.scales {
            Nf4Scales::Plain { absmax } => {
                tensors.insert(
                    format!("{name}.nf4_absmax"),
                    (Dtype::F32, vec![absmax.len()], f32_bytes(absmax)),
                );
            }
            Nf4Scales::Double {
                offset,
                qabsmax,
                absmax2,
            } => {
                tensors.insert(
                    format!("{name}.nf4_qabsmax"),
                    (Dtype::U8, vec![qabsmax.len()], qabsmax.clone()),
                );
                tensors.insert(
                    format!("{name}.nf4_absmax2"),
                    (Dtype::F32, vec![absmax2.len()], f32_bytes(absmax2)),
                );
                tensors.insert(
                    format!("{name}.nf4_offset"),
                    (Dtype::F32, vec![1], f32_bytes(&[*offset])),
                );
            }
        }
        quantized_names.insert(name);
    }
    for (name, param) in model.hf_parameters() {
        if quantized_names.contains(&name) {
            continue;
        }
        tensors.insert(name, (Dtype::F32, param.dims(), f32_bytes(&param.to_vec())));
    }
    let views = tensors
        .iter()
        .map(|(n, (dtype, shape, bytes))| {
            TensorView::new(*dtype, shape.clone(), bytes)
                .map(|v| (n.clone(), v))
                .map_err(|e| Error::Input(format!("tensor `{n}`: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let bytes = safetensors::serialize(views, None)
        .map_err(|e| Error::Input(format!("serializing: {e}")))?;
    write_atomic(&dir.join("model.safetensors"), &bytes)?;
    let config = serde_json::to_string_pretty(&model.config.to_hf_json()).unwrap_or_default();
    write_atomic(&dir.join("config.json"), config.as_bytes())?;
    let marker = json!({"format": "napkin-nf4", "version": 1, "block_size": nf4.block_size, "double_quant": nf4.double_quant});
    write_atomic(&dir.join(QUANT_FILE), marker.to_string().as_bytes())
}

/// Reads the NF4 settings of a quantized checkpoint.
pub fn read_quant_config(dir: &Path) -> Result<Nf4Config> {
    let path = dir.join(QUANT_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let json: Value = serde_json::from_str(&text).map_err(|error| Error::Json {
        path: path.clone(),
        error,
    })?;
    let source = path.display().to_string();
    if json["format"] != "napkin-nf4" || json["version"] != 1 {
        return Err(Error::config(
            &source,
            "expected {\"format\": \"napkin-nf4\", \"version\": 1}",
        ));
    }
    let config = Nf4Config {
        block_size: json["block_size"]
            .as_u64()
            .ok_or_else(|| Error::config(&source, "missing integer `block_size`"))?
            as usize,
        double_quant: json["double_quant"]
            .as_bool()
            .ok_or_else(|| Error::config(&source, "missing boolean `double_quant`"))?,
    };
    config.validate()?;
    Ok(config)
}

/// Loads a quantized checkpoint: float parts as tensors, block linears as NF4 codes.
pub fn load_quantized(dir: &Path, device: &Device) -> Result<(Llama, Nf4Config)> {
    let config = LlamaConfig::from_hf_file(&dir.join("config.json"))?;
    let nf4 = read_quant_config(dir)?;
    let file = dir.join("model.safetensors");
    let ckpt = SafetensorsCheckpoint::open(&file)?;
    let u8s = |name: &str, len: usize| -> Result<Vec<u8>> {
        match ckpt.read_raw(name)? {
            Some((Dtype::U8, shape, bytes)) if shape == [len] => Ok(bytes),
            Some((dtype, shape, _)) => Err(Error::ShapeMismatch {
                path: file.clone(),
                name: format!("{name} ({dtype:?})"),
                found: shape,
                expected: vec![len],
            }),
            None => Err(Error::MissingTensor {
                path: file.clone(),
                name: name.into(),
                expected: vec![len],
            }),
        }
    };
    let linear = |name: &str, out: usize, inp: usize| -> Result<Linear> {
        let n = out * inp;
        let blocks = n.div_ceil(nf4.block_size);
        let packed = u8s(&format!("{name}.nf4_packed"), n.div_ceil(2))?;
        let scales = if nf4.double_quant {
            Nf4Scales::Double {
                qabsmax: u8s(&format!("{name}.nf4_qabsmax"), blocks)?,
                absmax2: ckpt.read_f32(
                    &format!("{name}.nf4_absmax2"),
                    &[blocks.div_ceil(DOUBLE_QUANT_BLOCK)],
                )?,
                offset: ckpt.read_f32(&format!("{name}.nf4_offset"), &[1])?[0],
            }
        } else {
            Nf4Scales::Plain {
                absmax: ckpt.read_f32(&format!("{name}.nf4_absmax"), &[blocks])?,
            }
        };
        let q = Nf4Tensor {
            shape: vec![out, inp],
            block_size: nf4.block_size,
            packed,
            scales,
        };
        Ok(Linear::nf4(Arc::new(q), device))
    };
    let matrix = |name: &str, rows: usize, cols: usize| -> Result<Tensor<2>> {
        Ok(Tensor::from_data(
            TensorData::new(ckpt.read_f32(name, &[rows, cols])?, [rows, cols]),
            device,
        ))
    };
    let vector = |name: &str, dim: usize| -> Result<Tensor<1>> {
        Ok(Tensor::from_data(
            TensorData::new(ckpt.read_f32(name, &[dim])?, [dim]),
            device,
        ))
    };
    let model = build_llama(&config, &matrix, &vector, &linear)?;
    let per_linear = if nf4.double_quant { 4 } else { 2 };
    let linears = 7 * config.num_hidden_layers;
    let expected = config.hf_parameter_shapes().len() - linears + per_linear * linears;
    let found = ckpt.names().count();
    if found != expected {
        return Err(Error::UnexpectedTensors {
            path: file,
            names: format!("{found} tensors, expected {expected} for this config"),
        });
    }
    Ok((model, nf4))
}

/// Bytes of a model by component, as held in memory: float parameters, NF4 codes, NF4 scales.
pub fn model_bytes(model: &Llama) -> crate::predict::weights::WeightBytes {
    let mut bytes = crate::predict::weights::WeightBytes::default();
    let mut quantized_params = 0u64;
    for named in model.block_linears() {
        if let BaseWeight::Nf4(w) = &named.linear.base {
            let b = w.quantized.bytes();
            bytes.codes += b.codes;
            bytes.scales += b.scales;
            quantized_params += w.quantized.len() as u64;
        }
    }
    bytes.float = 4 * (model.config.num_parameters() - quantized_params);
    bytes
}
