//! The Llama family's relatives (Qwen2: biases on q, k and v; Qwen3: an RMSNorm on each query
//! and key head; Phi-3: q, k, v and gate, up stored fused, and a sliding window shorter than
//! the 256 positions) against the Python stack, one corpus folder each (`tests/corpus/<family>`, by
//! `tests/corpus/make_family_case.py`): transformers' logits over 256 positions from the HF
//! folder and from the GGUF llama.cpp's own converter writes (float model and quantized engine);
//! napkin's GGUF export equal to that file, tensor by tensor and key by key; three QLoRA steps
//! (NF4 with double quantization, peft's adapter, AdamW) whose losses follow bitsandbytes +
//! peft (the few 8-bit absmax codes where bitsandbytes' CPU lookup takes a neighbour of the
//! nearest code set to the nearest, napkin's choice, by the script). The folders are discovered: a new family in the same layout runs here as it is. The
//! fixture models `nk-qwen2` and `nk-qwen3` run the whole suite besides.

use std::path::{Path, PathBuf};

use napkin_core::config::{AttentionKind, Nf4Config};
use napkin_core::data::MicroBatch;
use napkin_core::device::DeviceKind;
use napkin_core::io::gguf::export::{GgufQuant, export_gguf};
use napkin_core::io::gguf::llama::gguf_arch;
use napkin_core::io::gguf::{GgufFile, load_gguf_llama, load_gguf_quantized};
use napkin_core::io::load_hf_llama;
use napkin_core::kernels::values::to_f32_vec;
use napkin_core::model::quantized_llama::QuantizedKvCache;
use napkin_core::model::{Llama, TokenBatch};
use napkin_core::train::{AdamW, AdamWConfig, StepOptions, forward_backward};
use napkin_tests::{Reference, relative_gap};

/// The families the corpus promises; a folder missing fails the tests rather than shrinking
/// them.
const PROMISED: [&str; 3] = ["phi3", "qwen2", "qwen3"];

/// Every corpus folder in the family layout (`hf/`, `lora/`, `model.f32.gguf`,
/// `reference.safetensors`), by name.
fn families() -> Vec<(String, PathBuf)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let mut found: Vec<(String, PathBuf)> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            [
                "hf/config.json",
                "lora",
                "model.f32.gguf",
                "reference.safetensors",
            ]
            .iter()
            .all(|part| p.join(part).exists())
        })
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), p))
        .collect();
    found.sort();
    for family in PROMISED {
        assert!(
            found.iter().any(|(name, _)| name == family),
            "tests/corpus/{family} (hf/, lora/, model.f32.gguf, reference.safetensors) is missing"
        );
    }
    found
}

fn ids(reference: &Reference, name: &str) -> Vec<Vec<u32>> {
    let (shape, ids) = reference.i64(name);
    ids.chunks(shape[1])
        .map(|row| row.iter().map(|&i| i as u32).collect())
        .collect()
}

/// The model without what makes it its family (Qwen2's biases, Qwen3's head norms, Phi-3's
/// window; its fused storage is the loader's), and how many tensors and switches that took
/// away.
fn as_plain_llama(model: &Llama) -> (Llama, usize) {
    let mut plain = model.clone();
    let mut removed = usize::from(plain.config.sliding_window.take().is_some());
    for layer in &mut plain.layers {
        let a = &mut layer.self_attn;
        for linear in [&mut a.q_proj, &mut a.k_proj, &mut a.v_proj] {
            removed += usize::from(linear.bias.take().is_some());
        }
        removed += usize::from(a.q_norm.take().is_some()) + usize::from(a.k_norm.take().is_some());
    }
    (plain, removed)
}

#[test]
fn each_family_gives_transformers_logits_from_its_folder_and_from_llama_cpps_gguf() {
    for (family, dir) in families() {
        let reference = Reference::open_file(&dir.join("reference.safetensors"));
        let rows = ids(&reference, "input_ids");
        let (_, want) = reference.f32("logits");
        let batch = TokenBatch::from_rows(&rows).unwrap();
        let device = DeviceKind::Cpu.open().unwrap();
        let mut model = load_hf_llama(&dir.join("hf"), &device).unwrap();
        assert_eq!(model.config.hf_family().1, family);
        // A family's window, if it has one, is shorter than the positions compared.
        assert!(
            model
                .config
                .sliding_window
                .is_none_or(|w| w < rows[0].len()),
            "{family}"
        );
        let eager = relative_gap(&to_f32_vec(model.forward(&batch)), &want);
        model.attention = AttentionKind::Efficient;
        let efficient = relative_gap(&to_f32_vec(model.forward(&batch)), &want);
        let (plain, removed) = as_plain_llama(&model);
        assert!(removed > 0, "{family}: nothing sets it apart from a Llama");
        let without = relative_gap(&to_f32_vec(plain.forward(&batch)), &want);

        let gguf = GgufFile::open(&dir.join("model.f32.gguf")).unwrap();
        let from_gguf = load_gguf_llama(&gguf, &device).unwrap();
        let switches = |c: &napkin_core::config::LlamaConfig| {
            (
                c.head_dim,
                c.qkv_bias,
                c.qk_norm,
                c.fused_projections,
                c.sliding_window,
            )
        };
        assert_eq!(
            switches(&from_gguf.config),
            switches(&model.config),
            "{family}"
        );
        let gguf_gap = relative_gap(&to_f32_vec(from_gguf.forward(&batch)), &want);
        let engine = load_gguf_quantized(&gguf).unwrap();
        let mut cache = QuantizedKvCache::default();
        let engine_logits = engine.every_token_logits(&rows[0], &mut cache).unwrap();
        let engine_gap = relative_gap(&engine_logits, &want);
        eprintln!(
            "{family}, 256 positions, logits off transformers' (of their scale): folder eager \
             {eager:.1e}, efficient {efficient:.1e}; llama.cpp's GGUF {gguf_gap:.1e}, on the \
             quantized engine {engine_gap:.1e}; as a plain Llama ({removed} tensors and \
             switches fewer) {without:.1e}"
        );
        // The GGUF is f32, which the quantized engine keeps as f32 rows.
        for (what, found) in [
            ("eager", eager),
            ("efficient", efficient),
            ("gguf", gguf_gap),
            ("quantized engine", engine_gap),
        ] {
            assert!(found <= 1e-5, "{family}, {what}: {found:e}");
        }
        assert!(
            without > 1e-2,
            "{family}: its own tensors change the logits: {without:e}"
        );
    }
}

/// napkin writes each family as llama.cpp's converter does: the same tensors (names, shapes and
/// f32 values, Q and K rows unpermuted, biases and head norms), the same `<arch>.*` keys and
/// values.
#[test]
fn napkins_gguf_of_each_family_is_the_converters() {
    for (family, dir) in families() {
        let device = DeviceKind::Cpu.open().unwrap();
        let model = load_hf_llama(&dir.join("hf"), &device).unwrap();
        let arch = gguf_arch(&model.config);
        assert_eq!(arch, family);
        let theirs = GgufFile::open(&dir.join("model.f32.gguf")).unwrap();
        let path =
            std::env::temp_dir().join(format!("napkin-{family}-{}.gguf", std::process::id()));
        export_gguf(&model, Vec::new(), &path, GgufQuant::F32, false, &family).unwrap();
        let ours = GgufFile::open(&path).unwrap();
        assert_eq!(
            ours.tensors.keys().collect::<Vec<_>>(),
            theirs.tensors.keys().collect::<Vec<_>>(),
            "{family}"
        );
        for (name, info) in &theirs.tensors {
            assert_eq!(ours.tensors[name].shape(), info.shape(), "{family}: {name}");
            assert_eq!(
                ours.read_f32(name).unwrap(),
                theirs.read_f32(name).unwrap(),
                "{family}: {name}"
            );
        }
        let mut compared = 0;
        for (key, value) in &theirs.metadata {
            if key.starts_with(&format!("{arch}.")) || key == "general.architecture" {
                let mine = ours.metadata.get(key);
                assert_eq!(
                    mine.map(|v| format!("{v:?}")),
                    Some(format!("{value:?}")),
                    "{family}: {key}"
                );
                compared += 1;
            }
        }
        assert!(compared >= 10, "{family}: {compared} keys");
        std::fs::remove_file(&path).ok();
    }
}

#[test]
fn three_qlora_steps_of_each_family_follow_bitsandbytes_and_peft() {
    for (family, dir) in families() {
        let reference = Reference::open_file(&dir.join("reference.safetensors"));
        let (_, want) = reference.f32("qlora.losses");
        let (_, set) = reference.i64("qlora.absmax_codes_set_to_nearest");
        let rows = ids(&reference, "qlora.input_ids");
        let batch = TokenBatch::from_rows(&rows).unwrap();
        let labels: Vec<i64> = rows.iter().flatten().map(|&i| i64::from(i)).collect();
        let micro = MicroBatch { batch, labels };
        let device = DeviceKind::Cpu.open().unwrap().autodiff();
        let nf4 = Nf4Config {
            block_size: 64,
            double_quant: true,
        };
        let (mut model, _) = load_hf_llama(&dir.join("hf"), &device)
            .unwrap()
            .quantize_nf4(&nf4)
            .unwrap()
            .load_lora(&dir.join("lora"))
            .unwrap();
        let mut adamw = AdamW::new(AdamWConfig {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        });
        let loss_and_grads = |model: &Llama| {
            forward_backward(model, std::slice::from_ref(&micro), &StepOptions::default())
                .unwrap()
                .read()
        };
        let mut losses = Vec::new();
        for _ in 0..3 {
            let step = loss_and_grads(&model);
            losses.push(step.loss);
            model = adamw.step(model, &step.grads, 1e-2);
        }
        losses.push(loss_and_grads(&model).loss);
        let worst = losses
            .iter()
            .zip(&want)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        eprintln!(
            "{family}: QLoRA losses {losses:?}, bitsandbytes + peft {want:?} ({} absmax codes \
             of its lookup's set to the nearest, as napkin's): worst {worst:.1e}",
            set[0]
        );
        assert!(worst <= 1e-5, "{family}: {worst:e}");
    }
}

/// A peft adapter on Phi-3's fused `qkv_proj` and `gate_up_proj` gives peft's logits, on the
/// float model and on the quantized engine; napkin writes it back under the fused names
/// (stacked: rank 3·4 for q, k, v and 2·4 for gate, up, in `rank_pattern`), and that file
/// gives the same logits again.
#[test]
fn a_peft_adapter_on_fused_projections_gives_peft_logits_and_is_written_fused() {
    let mut checked = 0;
    for (family, dir) in families() {
        let device = DeviceKind::Cpu.open().unwrap();
        let base = load_hf_llama(&dir.join("hf"), &device).unwrap();
        if !base.config.fused_projections {
            continue;
        }
        let reference = Reference::open_file(&dir.join("reference.safetensors"));
        let rows = ids(&reference, "input_ids");
        let (_, want) = reference.f32("fused_lora.logits");
        let batch = TokenBatch::from_rows(&rows).unwrap();
        let (model, config) = base.clone().load_lora(&dir.join("fused_lora")).unwrap();
        let float_gap = relative_gap(&to_f32_vec(model.forward(&batch)), &want);

        let gguf = GgufFile::open(&dir.join("model.f32.gguf")).unwrap();
        let mut engine = load_gguf_quantized(&gguf).unwrap();
        napkin_core::io::peft::load_lora_quantized(&mut engine, &dir.join("fused_lora")).unwrap();
        let mut cache = QuantizedKvCache::default();
        let engine_logits = engine.every_token_logits(&rows[0], &mut cache).unwrap();
        let engine_gap = relative_gap(&engine_logits, &want);

        let out = std::env::temp_dir().join(format!("napkin-fused-lora-{}", std::process::id()));
        model.save_lora(&config, &out).unwrap();
        let written: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(out.join("adapter_config.json")).unwrap(),
        )
        .unwrap();
        let mut targets: Vec<&str> = written["target_modules"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        targets.sort();
        assert_eq!(targets, ["gate_up_proj", "qkv_proj"], "{family}");
        assert_eq!(
            written["rank_pattern"]["qkv_proj"],
            3 * config.r,
            "{family}"
        );
        assert_eq!(
            written["rank_pattern"]["gate_up_proj"],
            2 * config.r,
            "{family}"
        );
        let (again, _) = base.load_lora(&out).unwrap();
        let again_gap = relative_gap(&to_f32_vec(again.forward(&batch)), &want);
        std::fs::remove_dir_all(&out).ok();
        eprintln!(
            "{family}: peft's adapter on the fused projections, logits off peft's: float model \
             {float_gap:.1e}, quantized engine {engine_gap:.1e}; napkin's stacked rewrite \
             {again_gap:.1e}"
        );
        for (what, gap) in [
            ("float", float_gap),
            ("engine", engine_gap),
            ("rewritten", again_gap),
        ] {
            assert!(gap <= 1e-5, "{family}, {what}: {gap:e}");
        }
        checked += 1;
    }
    assert!(
        checked > 0,
        "no family with fused projections (tests/corpus/phi3)"
    );
}

/// Phi-3-128k's and Phi-3.5's LongRoPE, as llama.cpp's converter writes it (per-frequency
/// `rope_factors_long` / `rope_factors_short` tensors, no scaling type), is refused by name from
/// a GGUF, on the float model and on the quantized engine.
#[test]
fn a_phi3_gguf_with_longrope_is_refused_by_name() {
    use napkin_core::io::gguf::GgufValue;
    use napkin_tests::{GgufTestValue, write_gguf};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/phi3");
    let source = GgufFile::open(&dir.join("model.f32.gguf")).unwrap();
    // The scalar keys (the placeholder vocabulary's lists aside, hence the vocab size).
    let mut metadata: Vec<(&str, GgufTestValue)> = source
        .metadata
        .iter()
        .filter_map(|(key, value)| match value {
            GgufValue::Uint(v) => Some((key.as_str(), GgufTestValue::U32(*v as u32))),
            GgufValue::Float(v) => Some((key.as_str(), GgufTestValue::F32(*v as f32))),
            GgufValue::String(s) => Some((key.as_str(), GgufTestValue::Str(s.clone()))),
            _ => None,
        })
        .collect();
    metadata.push(("phi3.vocab_size", GgufTestValue::U32(256)));
    let half = source.tensors["blk.0.attn_qkv.weight"].shape()[1] / 4 / 2;
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = source
        .tensors
        .keys()
        .map(|name| {
            let (shape, values) = source.read_f32(name).unwrap();
            (name.clone(), shape, values)
        })
        .collect();
    let device = DeviceKind::Cpu.open().unwrap();
    for factors in ["rope_factors_long.weight", "rope_factors_short.weight"] {
        let mut with = tensors.clone();
        with.push((factors.to_string(), vec![half], vec![1.5; half]));
        let path =
            std::env::temp_dir().join(format!("napkin-longrope-{}.gguf", std::process::id()));
        write_gguf(&path, &metadata, &with);
        let gguf = GgufFile::open(&path).unwrap();
        let want = format!("LongRoPE (`{factors}`) is not supported");
        let float = load_gguf_llama(&gguf, &device).err().map(|e| e.to_string());
        assert!(
            float.as_deref().is_some_and(|e| e.contains(&want)),
            "{float:?}"
        );
        let engine = load_gguf_quantized(&gguf).err().map(|e| e.to_string());
        assert!(
            engine.as_deref().is_some_and(|e| e.contains(&want)),
            "{engine:?}"
        );
        std::fs::remove_file(&path).ok();
    }
    // The same file without the factors loads.
    let path = std::env::temp_dir().join(format!("napkin-plain-phi3-{}.gguf", std::process::id()));
    write_gguf(&path, &metadata, &std::mem::take(&mut tensors));
    assert!(load_gguf_llama(&GgufFile::open(&path).unwrap(), &device).is_ok());
    std::fs::remove_file(&path).ok();
}
