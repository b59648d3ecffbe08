//! Loading HF checkpoints: single and sharded safetensors, f16/bf16 on disk, and the typed
//! errors a broken folder must produce.

use std::path::{Path, PathBuf};

use napkin_core::Error;
use napkin_core::config::LlamaConfig;
use napkin_core::device::DeviceKind;
use napkin_core::io::load_hf_llama;
use napkin_core::io::safetensors::SafetensorsCheckpoint;
use napkin_core::kernels::values::to_f32_vec;
use napkin_core::model::TokenBatch;
use napkin_tests::{ONE_MODEL, fixture_root, max_errors, model_dir};
use safetensors::Dtype;

/// A scratch folder removed at the end of the test.
pub(crate) struct Scratch(pub(crate) PathBuf);

impl Scratch {
    pub(crate) fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("napkin-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// All tensors of a fixture model, as (name, shape, f32 values).
fn read_all(dir: &Path) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let ckpt = SafetensorsCheckpoint::open(dir).unwrap();
    ckpt.names()
        .map(|n| {
            let info = ckpt.info(n).unwrap().unwrap();
            (
                n.to_string(),
                info.shape.clone(),
                ckpt.read_f32(n, &info.shape).unwrap(),
            )
        })
        .collect()
}

pub(crate) fn write_file(path: &Path, tensors: &[(String, Vec<usize>, Vec<f32>)], dtype: Dtype) {
    let encoded: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, s, v)| {
            let bytes = match dtype {
                Dtype::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                Dtype::BF16 => v.iter().flat_map(|&x| half_bf16(x).to_le_bytes()).collect(),
                Dtype::F16 => v.iter().flat_map(|&x| half_f16(x).to_le_bytes()).collect(),
                _ => unreachable!(),
            };
            (n.clone(), s.clone(), bytes)
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = encoded
        .iter()
        .map(|(n, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(dtype, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

fn half_bf16(x: f32) -> u16 {
    // Round to nearest even, as torch does.
    let bits = x.to_bits();
    ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

fn half_f16(x: f32) -> u16 {
    napkin_core::io::safetensors::f32_to_f16_bits(x)
}

fn logits_of(dir: &Path) -> Vec<f32> {
    let model = load_hf_llama(dir, &DeviceKind::Cpu.open().unwrap()).unwrap();
    let batch = TokenBatch::single(&[1, 2, 3, 4, 5]).unwrap();
    to_f32_vec(model.forward(&batch))
}

#[test]
fn sharded_checkpoint_loads_identically_to_the_single_file() {
    let dir = &model_dir(ONE_MODEL);
    let scratch = Scratch::new("sharded");
    std::fs::copy(dir.join("config.json"), scratch.0.join("config.json")).unwrap();
    let tensors = read_all(dir);
    let (first, second) = tensors.split_at(tensors.len() / 2);
    write_file(
        &scratch.0.join("model-00001-of-00002.safetensors"),
        first,
        Dtype::F32,
    );
    write_file(
        &scratch.0.join("model-00002-of-00002.safetensors"),
        second,
        Dtype::F32,
    );
    let mut map = serde_json::Map::new();
    for (i, part) in [first, second].iter().enumerate() {
        for (n, _, _) in part.iter() {
            map.insert(
                n.clone(),
                format!("model-0000{}-of-00002.safetensors", i + 1).into(),
            );
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(
        scratch.0.join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();

    assert_eq!(logits_of(&scratch.0), logits_of(dir));
}

#[test]
fn bf16_and_f16_checkpoints_load_within_their_precision() {
    let dir = &model_dir(ONE_MODEL);
    let want = logits_of(dir);
    for (dtype, tol) in [(Dtype::BF16, 5e-2), (Dtype::F16, 5e-3)] {
        let scratch = Scratch::new(&format!("{dtype:?}"));
        std::fs::copy(dir.join("config.json"), scratch.0.join("config.json")).unwrap();
        write_file(&scratch.0.join("model.safetensors"), &read_all(dir), dtype);
        let (abs, _) = max_errors(&logits_of(&scratch.0), &want);
        assert!(abs < tol, "{dtype:?}: logits differ by {abs}");
    }
}

#[test]
fn missing_extra_and_misshaped_tensors_are_typed_errors() {
    let dir = &model_dir(ONE_MODEL);
    let config = LlamaConfig::from_hf_file(&dir.join("config.json")).unwrap();
    let tensors = read_all(dir);
    let victim = "model.layers.0.self_attn.k_proj.weight";

    // Missing.
    let scratch = Scratch::new("missing");
    std::fs::copy(dir.join("config.json"), scratch.0.join("config.json")).unwrap();
    let without: Vec<_> = tensors
        .iter()
        .filter(|(n, _, _)| n != victim)
        .cloned()
        .collect();
    write_file(&scratch.0.join("model.safetensors"), &without, Dtype::F32);
    match load_hf_llama(&scratch.0, &DeviceKind::Cpu.open().unwrap()) {
        Err(Error::MissingTensor { name, expected, .. }) => {
            assert_eq!(name, victim);
            assert_eq!(expected, vec![config.kv_dim(), config.hidden_size]);
        }
        other => panic!("expected MissingTensor, got {other:?}"),
    }

    // Mis-shaped.
    let mut misshaped = tensors.clone();
    for (n, s, v) in misshaped.iter_mut() {
        if n == victim {
            s[0] -= 1;
            v.truncate(s[0] * s[1]);
        }
    }
    write_file(&scratch.0.join("model.safetensors"), &misshaped, Dtype::F32);
    match load_hf_llama(&scratch.0, &DeviceKind::Cpu.open().unwrap()) {
        Err(Error::ShapeMismatch {
            name,
            found,
            expected,
            ..
        }) => {
            assert_eq!(name, victim);
            assert_eq!(found[0] + 1, expected[0]);
        }
        other => panic!("expected ShapeMismatch, got {other:?}"),
    }

    // Extra.
    let mut extra = tensors.clone();
    extra.push((
        "model.layers.0.self_attn.q_proj.bias".into(),
        vec![2],
        vec![0.0, 0.0],
    ));
    write_file(&scratch.0.join("model.safetensors"), &extra, Dtype::F32);
    match load_hf_llama(&scratch.0, &DeviceKind::Cpu.open().unwrap()) {
        Err(Error::UnexpectedTensors { names, .. }) => {
            assert!(names.contains("q_proj.bias"), "{names}")
        }
        other => panic!("expected UnexpectedTensors, got {other:?}"),
    }
}

#[test]
fn truncated_safetensors_file_is_a_typed_error() {
    let dir = &model_dir(ONE_MODEL);
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let scratch = Scratch::new("truncated");
    std::fs::copy(dir.join("config.json"), scratch.0.join("config.json")).unwrap();
    for cut in [0, 7, 8, 100, bytes.len() / 2, bytes.len() - 1] {
        std::fs::write(scratch.0.join("model.safetensors"), &bytes[..cut]).unwrap();
        match load_hf_llama(&scratch.0, &DeviceKind::Cpu.open().unwrap()) {
            Err(Error::Checkpoint { message, .. }) => {
                assert!(message.contains("header"), "{message}")
            }
            other => panic!("cut at {cut}: expected Checkpoint error, got {other:?}"),
        }
    }
    // And a fixture root exists for the record.
    assert!(fixture_root().is_dir());
}
