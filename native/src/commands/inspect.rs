//! `napkin inspect`: what a checkpoint holds, without loading it into a backend.

use anyhow::{Context, Result};
use napkin_core::config::LlamaConfig;
use napkin_core::io::SafetensorsCheckpoint;
use napkin_core::io::gguf::{GgufFile, gguf_config};
use napkin_core::io::quantized::{is_quantized_checkpoint, read_quant_config};
use napkin_core::predict::weights::weight_bytes;
use serde_json::json;

use crate::cli::InspectArgs;

pub fn run(args: &InspectArgs) -> Result<()> {
    let dir = &napkin_core::io::resolve_model_path(&args.model.model)?;
    let (config, on_disk) = if dir
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        let gguf = GgufFile::open(dir)?;
        let mut on_disk = std::collections::BTreeMap::new();
        for info in gguf.tensors.values() {
            *on_disk
                .entry(format!("{:?}", info.ggml_type))
                .or_insert(0u64) += info.size;
        }
        (gguf_config(&gguf)?, on_disk)
    } else {
        let checkpoint = SafetensorsCheckpoint::open(dir)?;
        let on_disk = checkpoint
            .bytes_by_dtype()
            .context("reading tensor sizes")?;
        (
            LlamaConfig::from_hf_file(&dir.join("config.json"))?,
            on_disk,
        )
    };

    let total = config.num_parameters();
    let per_block = config.block_parameters();
    let embedding = config.embedding_parameters();
    let lm_head = config.lm_head_parameters();
    let nf4 = if is_quantized_checkpoint(dir) {
        Some(read_quant_config(dir)?)
    } else {
        None
    };
    // Float parts are held in f32 in memory whatever their dtype on disk.
    let in_memory = weight_bytes(&config, 4, nf4.as_ref());

    if args.json {
        let report = json!({
            "model": dir.display().to_string(),
            "config": config.to_hf_json(),
            "parameters": {
                "total": total,
                "embedding": embedding,
                "per_block": per_block,
                "blocks": config.num_hidden_layers,
                "final_norm": config.hidden_size,
                "lm_head": lm_head,
            },
            "nf4": nf4.map(|q| json!({"block_size": q.block_size, "double_quant": q.double_quant})),
            "bytes_on_disk_by_dtype": on_disk,
            "bytes_in_memory": {
                "float": in_memory.float,
                "nf4_codes": in_memory.codes,
                "nf4_scales": in_memory.scales,
                "total": in_memory.total(),
            },
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }

    println!("model          {}", dir.display());
    println!(
        "shape          L={} D={} F={} H={} Hkv={} Dh={} V={}",
        config.num_hidden_layers,
        config.hidden_size,
        config.intermediate_size,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
        config.vocab_size
    );
    let (class, _) = config.hf_family();
    let mut family = class.to_string();
    if config.qkv_bias {
        family.push_str("; q, k, v biases");
    }
    if config.qk_norm {
        family.push_str("; q, k head norms");
    }
    if let Some(window) = config.sliding_window {
        family.push_str(&format!("; sliding window {window}"));
    }
    println!("family         {family}");
    println!(
        "rope           theta={} scaling={:?}; max positions {}",
        config.rope_theta, config.rope_scaling, config.max_position_embeddings
    );
    println!(
        "embeddings     {}",
        if config.tie_word_embeddings {
            "tied"
        } else {
            "untied"
        }
    );
    println!();
    println!("{:<24}{:>16}", "parameters", "count");
    println!("{:<24}{:>16}", "embedding", group(embedding));
    for i in 0..config.num_hidden_layers {
        println!("{:<24}{:>16}", format!("layers.{i}"), group(per_block));
    }
    println!("{:<24}{:>16}", "norm", group(config.hidden_size as u64));
    if lm_head > 0 {
        println!("{:<24}{:>16}", "lm_head", group(lm_head));
    }
    println!("{:<24}{:>16}", "total", group(total));
    println!();
    for (dtype, bytes) in &on_disk {
        println!("on disk {dtype:<8}{:>16} bytes", group(*bytes));
    }
    if let Some(q) = nf4 {
        println!(
            "quantization    NF4, block size {}, double quant {}",
            q.block_size, q.double_quant
        );
    }
    println!(
        "in memory: float {} + NF4 codes {} + NF4 scales {} = {} bytes",
        group(in_memory.float),
        group(in_memory.codes),
        group(in_memory.scales),
        group(in_memory.total())
    );
    Ok(())
}

/// 1234567 → "1,234,567".
pub fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
