//! Merged model folders written tensor by tensor: every tensor equals the in-memory merge
//! (`merge_lora`) rounded to the chosen dtype, bit for bit; sharded folders have the index
//! transformers reads and load back as one model; a later write of another layout leaves no
//! stale shard behind.

use std::path::PathBuf;

use napkin_core::config::Nf4Config;
use napkin_core::device::DeviceKind;
use napkin_core::io::SafetensorsCheckpoint;
use napkin_core::io::hf_writer::{WeightDtype, WeightLayout, write_hf_weights};
use napkin_core::io::{load_hf_llama, load_model};
use napkin_core::kernels::values::to_f32_vec;
use napkin_core::model::Llama;
use napkin_tests::{Reference, input_batch, max_errors, model_dirs};

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("napkin-merged-{tag}-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    dir
}

/// A fixture model on an NF4 base (double quantization) with the peft fixture's adapter
/// (B ≠ 0, α ≠ r), so the merge changes every targeted weight.
fn qlora_model(dir: &std::path::Path) -> Llama {
    let device = DeviceKind::Cpu.open().unwrap();
    let nf4 = Nf4Config {
        block_size: 64,
        double_quant: true,
    };
    let base = load_hf_llama(dir, &device)
        .unwrap()
        .quantize_nf4(&nf4)
        .unwrap();
    base.load_lora(&dir.join("lora")).unwrap().0
}

fn rounded(values: &[f32], dtype: WeightDtype) -> Vec<f32> {
    values
        .iter()
        .map(|&v| match dtype {
            WeightDtype::F32 => v,
            WeightDtype::F16 => half::f16::from_f32(v).to_f32(),
            WeightDtype::Bf16 => half::bf16::from_f32(v).to_f32(),
        })
        .collect()
}

#[test]
fn merged_weights_equal_the_in_memory_merge_in_each_dtype() {
    for dir in model_dirs() {
        let model = qlora_model(&dir);
        let (merged, _) = model.clone().merge_lora();
        for dtype in [WeightDtype::F32, WeightDtype::F16, WeightDtype::Bf16] {
            let out = scratch(&format!("dtype-{dtype}"));
            let layout = WeightLayout {
                dtype,
                max_shard_bytes: u64::MAX,
                merge_lora: true,
            };
            write_hf_weights(&model, &out, layout).unwrap();
            let config: serde_json::Value =
                serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
            assert_eq!(config["dtype"].as_str(), Some(dtype.torch_name()));
            let written = SafetensorsCheckpoint::open(&out).unwrap();
            for (name, param) in merged.hf_parameters() {
                let got = written.read_f32(&name, &param.dims()).unwrap();
                let want = rounded(&param.to_vec(), dtype);
                let differ = got
                    .iter()
                    .zip(&want)
                    .filter(|(a, b)| a.to_bits() != b.to_bits())
                    .count();
                assert_eq!(
                    differ,
                    0,
                    "{} {dtype} {name}: {differ} values differ",
                    dir.display()
                );
            }
            std::fs::remove_dir_all(&out).ok();
        }
    }
}

#[test]
fn sharded_folders_have_an_index_and_load_as_one_model() {
    for dir in model_dirs() {
        let reference = Reference::open(&dir);
        let (batch, _) = input_batch(&reference);
        let model = qlora_model(&dir);
        let (merged, _) = model.clone().merge_lora();
        let out = scratch("shards");
        // f32 bytes of each tensor, in the order they are written.
        let sizes: Vec<(String, u64)> = merged
            .hf_parameters()
            .iter()
            .map(|(name, p)| (name.clone(), 4 * p.dims().iter().product::<usize>() as u64))
            .collect();
        // Half the largest tensor: that one is over the limit on purpose, and must get a shard of
        // its own (as transformers' writer does); the smaller ones share shards up to the limit.
        let largest = sizes.iter().map(|(_, b)| *b).max().unwrap();
        let limit = largest / 2;
        let layout = WeightLayout {
            dtype: WeightDtype::F32,
            max_shard_bytes: limit,
            merge_lora: true,
        };
        let written = write_hf_weights(&model, &out, layout).unwrap();
        let shards: Vec<_> = written
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
            .collect();
        // The largest tensor alone, and the rest in one shard or more (one when a tied
        // model's other tensors together fit the limit).
        assert!(shards.len() >= 2, "{written:?}");
        let index: serde_json::Value = serde_json::from_slice(
            &std::fs::read(out.join("model.safetensors.index.json")).unwrap(),
        )
        .unwrap();
        let map = index["weight_map"].as_object().unwrap();
        assert_eq!(map.len(), merged.hf_parameters().len());
        // Each shard's tensors, in writing order: shards are filled one after another.
        let mut filled: Vec<(String, Vec<u64>)> = Vec::new();
        for (name, bytes) in &sizes {
            let file = map[name].as_str().unwrap().to_owned();
            match filled.last_mut() {
                Some((last, held)) if *last == file => held.push(*bytes),
                _ => {
                    assert!(
                        filled.iter().all(|(f, _)| *f != file),
                        "{file} holds tensors that are not consecutive"
                    );
                    filled.push((file, vec![*bytes]));
                }
            }
        }
        assert_eq!(filled.len(), shards.len());
        for (i, (file, held)) in filled.iter().enumerate() {
            let data: u64 = held.iter().sum();
            if held.iter().any(|&b| b > limit) {
                assert_eq!(
                    held.len(),
                    1,
                    "{file}: a tensor over the limit shares its shard"
                );
            } else {
                assert!(
                    data <= limit,
                    "{file}: {data} bytes of tensors (limit {limit})"
                );
            }
            // A shard is closed only when the next tensor would take it past the limit.
            if let Some((_, next)) = filled.get(i + 1) {
                assert!(
                    data + next[0] > limit,
                    "{file} was closed at {data} bytes though the next {} fit",
                    next[0]
                );
            }
            // The file holds the data and a header: its length, the format's metadata and one
            // JSON entry per tensor (name, dtype, shape, offsets: well under 256 bytes each).
            let len = std::fs::metadata(out.join(file)).unwrap().len();
            let header = 128 + 256 * held.len() as u64;
            assert!(
                (data..data + header).contains(&len),
                "{file}: {len} bytes for {data} of data in {} tensors",
                held.len()
            );
        }
        assert!(
            filled.iter().any(|(_, held)| held.len() > 1),
            "no shard holds several tensors"
        );
        assert!(
            filled.iter().any(|(_, held)| held[0] > limit),
            "no tensor over the limit"
        );
        let data_bytes: u64 = merged
            .hf_parameters()
            .iter()
            .map(|(_, p)| 4 * p.dims().iter().product::<usize>() as u64)
            .sum();
        assert_eq!(index["metadata"]["total_size"].as_u64(), Some(data_bytes));
        assert!(!out.join("model.safetensors").exists());

        // Read back as one model: the same logits as the merged model in memory, bit for bit.
        let device = DeviceKind::Cpu.open().unwrap();
        let loaded = load_model(&out, &device).unwrap();
        let (want, got) = (
            to_f32_vec(merged.forward(&batch)),
            to_f32_vec(loaded.forward(&batch)),
        );
        assert_eq!(max_errors(&got, &want).0, 0.0);

        // Written again whole: the shards and the index are gone, one file is left.
        let layout = WeightLayout {
            max_shard_bytes: u64::MAX,
            ..layout
        };
        write_hf_weights(&model, &out, layout).unwrap();
        let mut names: Vec<String> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["config.json", "model.safetensors"]);
        std::fs::remove_dir_all(&out).ok();
    }
}
