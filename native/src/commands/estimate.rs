//! `napkin estimate`: the napkin math of training memory from a configuration alone — the
//! bytes-per-parameter rules, accelerate's `estimate-memory` table, and DeepSpeed's ZeRO
//! model-state estimates. (The exact per-layer inventory of napkin's own engine joins here.)

use std::path::Path;

use anyhow::{Context, Result, bail};
use napkin_core::config::{LlamaConfig, OptimizerKind};
use napkin_core::io::gguf::{GgufFile, gguf_config};
use napkin_core::predict::accelerate::{ModelSizes, accelerate_rows, bert_sizes, llama_sizes};
use napkin_core::predict::bert::BertConfig;
use napkin_core::predict::inventory::{Entry, Scenario, inventory, per_layer, totals_by_kind};
use napkin_core::predict::offload::{host_links, host_transfer};
use napkin_core::predict::precision::precision_table;
use napkin_core::predict::rules::{
    OptimizerRule, Precision, gradient_bytes_per_param, optimizer_bytes_per_param,
    weight_bytes_per_param,
};
use napkin_core::predict::seed::scenario_seed_estimate;
use napkin_core::predict::sharding::{Offload, Strategy, sharded_memory};
use napkin_core::predict::time::{device_presets, roofline, step_work};
use napkin_core::predict::timeline::step_timeline;
use napkin_core::predict::units::{accelerate_units, gib};
use napkin_core::predict::zero::{Cluster, Zero3Offload, ZeroEstimate, zero2, zero3};
use serde_json::json;

use crate::cli::EstimateArgs;

/// What the estimate is about.
struct Subject {
    name: String,
    params: u64,
    largest_layer: Option<u64>,
    accelerate: Option<ModelSizes>,
    llama: Option<LlamaConfig>,
}

pub fn run(args: &EstimateArgs) -> Result<()> {
    let subject = subject(args)?;
    match args.pytorch.engine.as_str() {
        "napkin" => {}
        "pytorch" => {
            let config = subject.llama.as_ref().context(
                "--engine pytorch replays a Llama: give --model or --preset (not --params or a BERT config)",
            )?;
            return super::estimate_pytorch::run(args, &subject.name, config);
        }
        other => bail!("--engine `{other}`: expected napkin or pytorch"),
    }
    let (precision, optimizer) = (precision_of(args)?, optimizer_rule_of(args)?);
    let rules = [
        ("weights", weight_bytes_per_param(precision)),
        ("gradients", gradient_bytes_per_param(precision)),
        ("optimizer", optimizer_bytes_per_param(optimizer, precision)),
    ];

    let zero = match args.shard.as_deref() {
        None => None,
        Some(stage) => {
            let cluster = Cluster {
                gpus_per_node: args.gpus.max(1),
                nodes: args.nodes.max(1),
            };
            let offload = args.offload.as_deref().unwrap_or("");
            let offload_optimizer = offload.contains("optimizer");
            let offload_params = offload.contains("param");
            let estimate = match stage {
                "zero2" => zero2(subject.params, cluster, offload_optimizer),
                "zero3" => {
                    let largest = subject.largest_layer.context(
                        "--shard zero3 needs the largest layer: use --model/--preset, or --largest-layer",
                    )?;
                    let offload = match (offload_params, offload_optimizer) {
                        (true, _) => Zero3Offload::OptimizerAndParams,
                        (false, true) => Zero3Offload::Optimizer,
                        (false, false) => Zero3Offload::None,
                    };
                    zero3(subject.params, largest, cluster, offload, true)
                }
                other => {
                    if Strategy::parse(other).is_none() {
                        bail!(
                            "--shard `{other}`: expected ddp, none, zero1, zero2, grad-op, zero3, full or hybrid"
                        );
                    }
                    if subject.llama.is_none() {
                        bail!("--shard {other} needs a model configuration (--model or --preset)");
                    }
                    return run_with(args, subject, rules, None);
                }
            };
            Some((stage.to_string(), estimate))
        }
    };
    run_with(args, subject, rules, zero)
}

/// Prints (or writes as JSON) everything the flags asked for.
fn run_with(
    args: &EstimateArgs,
    subject: Subject,
    rules: [(&str, f64); 3],
    zero: Option<(String, ZeroEstimate)>,
) -> Result<()> {
    let p = subject.params as f64;
    let total_per_param: f64 = rules.iter().map(|r| r.1).sum();
    let (precision, optimizer) = (precision_of(args)?, optimizer_rule_of(args)?);

    let optimizer_kind: OptimizerKind = args.optimizer.parse()?;
    let inventory = match &subject.llama {
        Some(config) => Some(inventory_section(args, config, optimizer_kind)?),
        None => None,
    };

    if args.json {
        let out = json!({
            "inventory": inventory,
            "model": subject.name,
            "parameters": subject.params,
            "largest_layer_parameters": subject.largest_layer,
            "full_fine_tuning_rules": {
                "bytes_per_parameter": rules.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
                "total_bytes": p * total_per_param,
            },
            "accelerate": subject.accelerate.filter(|_| args.accelerate).map(accelerate_rows),
            "zero": zero.as_ref().map(|(stage, e)| json!({"stage": stage, "gpu_bytes": e.gpu_bytes, "cpu_bytes_per_node": e.cpu_bytes})),
            "precision_table": precision_table(subject.params, args.gpus),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }

    println!("{}: {} parameters", subject.name, subject.params);
    println!(
        "full fine-tuning, the napkin rules ({:?}, {:?}):",
        precision, optimizer
    );
    for (kind, bytes) in rules {
        println!(
            "  {kind:<10} {bytes:>4} bytes/param  {:>12}",
            accelerate_units(p * bytes)
        );
    }
    println!(
        "  {:<10} {total_per_param:>4} bytes/param  {:>12}   (+ activations, not in the rules)",
        "total",
        accelerate_units(p * total_per_param)
    );
    print_precision_table(subject.params, args.gpus);
    if let Some(inv) = &inventory {
        println!(
            "\nnapkin's engine, {} × {} tokens, LoRA r={}{}:",
            args.scenario.micro_batch,
            args.scenario.seq_len,
            args.scenario.lora_r,
            if args.scenario.nf4 { ", NF4 base" } else { "" }
        );
        println!(
            "  {:<18} {:>12}   {:>12}",
            "kind", "inventory", "seed formula"
        );
        let seed = &inv["seed_formulas"];
        let by_kind = &inv["inventory_bytes_by_kind"];
        let b = |v: &serde_json::Value| v.as_f64().unwrap_or(0.0);
        for (kind, seed_key) in [
            ("weights", Some("weights")),
            ("quant_codes", None),
            ("quant_scales", None),
            ("adapters", None),
            ("gradients", Some("gradients")),
            ("optimizer_state", Some("optimizer")),
            ("saved_activations", Some("activations")),
            ("checkpoint_inputs", None),
            ("logits", None),
            ("workspace", None),
        ] {
            let inv_bytes = by_kind.get(kind).map(b);
            let seed_bytes = seed_key.map(|k| b(&seed[k]));
            if inv_bytes.is_none() && seed_bytes.is_none() {
                continue;
            }
            let show = |x: Option<f64>| x.map_or("—".to_string(), accelerate_units);
            println!(
                "  {kind:<18} {:>12}   {:>12}",
                show(inv_bytes),
                show(seed_bytes)
            );
        }
        println!(
            "\n  per layer (MiB)   weights  NF4 codes+scales  adapters  gradients  optimizer  activations"
        );
        if let Some(layers) = inv["per_layer"].as_array() {
            for row in layers {
                let mib = |k: &str| b(&row[k]) / (1024.0 * 1024.0);
                println!(
                    "  {:<16} {:>8.2} {:>17.2} {:>9.2} {:>10.2} {:>10.2} {:>12.2}",
                    row["layer"].as_str().unwrap_or("?"),
                    mib("weights"),
                    mib("quant"),
                    mib("adapters"),
                    mib("gradients"),
                    mib("optimizer_state"),
                    mib("activations")
                );
            }
        }
        let peak = &inv["step_peak"];
        println!(
            "\n  step peak: {} at `{}` ({} phase); largest tensors alive then:",
            accelerate_units(b(&peak["bytes"])),
            peak["label"].as_str().unwrap_or("?"),
            peak["phase"].as_str().unwrap_or("?"),
        );
        if let Some(largest) = peak["largest"].as_array() {
            for pair in largest.iter().take(5) {
                println!(
                    "    {:<48} {:>12}",
                    pair[0].as_str().unwrap_or("?"),
                    accelerate_units(b(&pair[1]))
                );
            }
        }
        let work = &inv["time"]["work"];
        println!(
            "\n  time: {:.3} TFLOP per step (forward {:.3}, backward {:.3}, recompute {:.3}; LoRA saves {:.3}), {:.2} GB moved",
            b(&inv["time"]["flops"]) / 1e12,
            b(&work["forward_flops"]) / 1e12,
            b(&work["backward_flops"]) / 1e12,
            b(&work["recompute_flops"]) / 1e12,
            b(&work["lora_saved_flops"]) / 1e12,
            b(&work["bytes_moved"]) / 1e9,
        );
        println!(
            "  host link per step: {} (the batch up, the loss back; weights resident), in the step time below",
            accelerate_units(b(&work["link_bytes"])),
        );
        println!(
            "  {:<32} {:>9} {:>9} {:>8} {:>12} {:>6}",
            "device (roofline lower bound)", "step ms", "tokens/s", "bound", "FLOP/byte", "fits"
        );
        if let Some(devices) = inv["time"]["devices"].as_array() {
            for d in devices {
                let r = &d["roofline"];
                println!(
                    "  {:<32} {:>9.1} {:>9.0} {:>8} {:>5.0} / {:<4.0} {:>6}",
                    r["device"].as_str().unwrap_or("?"),
                    1e3 * b(&r["step_seconds"]),
                    b(&r["tokens_per_second"]),
                    r["bound"].as_str().unwrap_or("?"),
                    b(&r["arithmetic_intensity"]),
                    b(&r["ridge_point"]),
                    if d["fits"].as_bool().unwrap_or(false) {
                        "yes"
                    } else {
                        "no"
                    },
                );
            }
        }
        let offload = &inv["offload"];
        if !offload.is_null() {
            println!(
                "\n  offload on one GPU: {} on the device at the peak (without offload {}), {} in host memory;\n  per optimizer step {} to the host and {} to the device:",
                accelerate_units(b(&offload["device_peak_bytes"])),
                accelerate_units(b(&offload["device_peak_bytes_without_offload"])),
                accelerate_units(b(&offload["host_bytes"])),
                accelerate_units(b(&offload["to_host_bytes_per_step"])),
                accelerate_units(b(&offload["to_device_bytes_per_step"])),
            );
            for link in offload["links"].as_array().into_iter().flatten() {
                println!(
                    "    {:<32} {:>9.1} ms per step",
                    link["name"].as_str().unwrap_or("?"),
                    1e3 * b(&link["seconds_per_step"])
                );
            }
        }
        let sharding = &inv["sharding"];
        if !sharding.is_null() {
            println!(
                "\n  {} on {} GPU(s) (shard group {}): {} per GPU at the peak ({} gathered), {} host memory per node",
                sharding["strategy"].as_str().unwrap_or("?"),
                sharding["gpus"],
                sharding["shard_group"],
                accelerate_units(b(&sharding["gpu_peak"])),
                accelerate_units(b(&sharding["gathered"])),
                accelerate_units(b(&sharding["cpu_per_node"])),
            );
        }
    }
    if args.accelerate {
        let sizes = subject
            .accelerate
            .context("--accelerate needs a model configuration (--model or --preset)")?;
        println!("\naccelerate estimate-memory:");
        println!("| dtype   | Largest Layer | Total Size | Training using Adam |");
        println!("|---------|---------------|------------|---------------------|");
        for row in accelerate_rows(sizes) {
            println!(
                "| {:<7} | {:<13} | {:<10} | {:<19} |",
                row.dtype, row.largest_layer, row.total_size, row.training_using_adam
            );
        }
    }
    if let Some((stage, e)) = zero {
        println!(
            "\nDeepSpeed {stage} model states, {} GPU(s) × {} node(s), offload: {}: {:.2} GB per GPU, {:.2} GB CPU per node",
            args.gpus,
            args.nodes,
            args.offload.as_deref().unwrap_or("none"),
            gib(e.gpu_bytes as f64),
            gib(e.cpu_bytes as f64)
        );
    }
    Ok(())
}

/// Full fine-tuning model state under each mixed-precision recipe, per GPU.
fn print_precision_table(params: u64, gpus: u64) {
    println!(
        "\nmodel state per GPU by precision recipe (AdamW, full fine-tuning{}; bytes/param: weights + copy + grads + master + moments):",
        if gpus > 1 {
            format!(", MS-AMP O3 sharded over {gpus} GPUs")
        } else {
            String::new()
        }
    );
    for row in precision_table(params, gpus) {
        let b = row.per_parameter;
        println!(
            "  {:<22} {} + {} + {} + {} + {}+{} = {:>4}  {:>12}  activations {} B/value{}",
            row.name,
            b.weights,
            b.weight_copy,
            b.gradients,
            b.master,
            b.first_moment,
            b.second_moment,
            b.total(),
            accelerate_units(row.model_state_bytes),
            b.activation,
            if row.predicted_only {
                "  (predicted only)"
            } else {
                ""
            }
        );
    }
}

fn precision_of(args: &EstimateArgs) -> Result<Precision> {
    Ok(match args.dtype.as_str() {
        "f32" | "fp32" | "float32" => Precision::Fp32,
        "bf16" | "f16" | "fp16" | "bfloat16" | "float16" => Precision::Mixed,
        other => bail!("--dtype `{other}`: expected f32, bf16 or f16"),
    })
}

fn optimizer_rule_of(args: &EstimateArgs) -> Result<OptimizerRule> {
    Ok(
        match args
            .optimizer
            .to_ascii_lowercase()
            .replace(['-', '_'], "")
            .as_str()
        {
            "adamw" | "adam" => OptimizerRule::AdamW,
            "adamw8bit" => OptimizerRule::AdamW8bit,
            "sgd" => OptimizerRule::SgdMomentum,
            other => bail!("--optimizer `{other}`: expected adamw, adamw8bit or sgd"),
        },
    )
}

fn subject(args: &EstimateArgs) -> Result<Subject> {
    if let Some(params) = args.params {
        return Ok(Subject {
            name: "--params".to_string(),
            params,
            largest_layer: args.largest_layer,
            accelerate: None,
            llama: None,
        });
    }
    if let Some(name) = &args.preset {
        return Ok(llama_subject(name.clone(), &LlamaConfig::preset(name)?));
    }
    let Some(path) = &args.model else {
        bail!("give --model PATH, --preset NAME or --params N");
    };
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        let config = gguf_config(&GgufFile::open(path)?)?;
        return Ok(llama_subject(path.display().to_string(), &config));
    }
    let file = if path.is_dir() {
        path.join("config.json")
    } else {
        path.clone()
    };
    config_subject(&file)
}

fn config_subject(file: &Path) -> Result<Subject> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{}: not valid JSON", file.display()))?;
    let source = file.display().to_string();
    match json.get("model_type").and_then(|t| t.as_str()) {
        Some("bert") => {
            let bert = BertConfig::from_hf_json(&json, &source)?;
            Ok(Subject {
                name: source,
                params: bert.num_parameters(),
                largest_layer: Some(bert.largest_layer_parameters()),
                accelerate: Some(bert_sizes(&bert)),
                llama: None,
            })
        }
        _ => Ok(llama_subject(
            source.clone(),
            &LlamaConfig::from_hf_json(&json, &source)?,
        )),
    }
}

fn llama_subject(name: String, config: &LlamaConfig) -> Subject {
    Subject {
        name,
        params: config.num_parameters(),
        largest_layer: Some(config.embedding_parameters().max(config.block_parameters())),
        accelerate: Some(llama_sizes(config)),
        llama: Some(config.clone()),
    }
}

/// One GPU with `offload` (`optimizer`, `params` or both): device and host bytes, and the
/// link traffic of each optimizer step with its time on each host link.
fn offload_section(
    scenario: &Scenario,
    entries: &[Entry],
    offload: Offload,
    peak: u64,
) -> serde_json::Value {
    let one_gpu = sharded_memory(scenario, Strategy::NoShard, 1, 1, offload);
    let transfer = host_transfer(scenario, entries, offload);
    let links: Vec<serde_json::Value> = host_links()
        .iter()
        .map(|l| json!({"id": l.id, "name": l.name, "seconds_per_step": transfer.seconds(l)}))
        .collect();
    json!({
        "device_peak_bytes": one_gpu.gpu_peak,
        "device_peak_bytes_without_offload": peak,
        "host_bytes": transfer.host_bytes,
        "to_host_bytes_per_step": transfer.to_host,
        "to_device_bytes_per_step": transfer.to_device,
        "links": links,
    })
}

/// The exact inventory of napkin's engine for a Llama, beside the seed formulas.
fn inventory_section(
    args: &EstimateArgs,
    config: &LlamaConfig,
    optimizer: OptimizerKind,
) -> Result<serde_json::Value> {
    let half = matches!(precision_of(args)?, Precision::Mixed);
    let scenario = super::with_autocast(args.scenario.scenario(config.clone(), optimizer)?, half);
    let entries = inventory(&scenario);
    let totals = totals_by_kind(&entries);
    let timeline = step_timeline(&scenario);
    let per_layer = per_layer(&entries, config.num_hidden_layers);
    let seed = scenario_seed_estimate(&scenario, Precision::Fp32);
    let work = step_work(&scenario);
    let tokens = (args.scenario.micro_batch
        * args.scenario.seq_len
        * args.scenario.accumulation.max(1)) as f64;
    let devices: Vec<serde_json::Value> = device_presets()
        .iter()
        .map(|d| {
            let r = roofline(&work, tokens, d, half);
            json!({"id": d.id, "memory_bytes": d.memory, "fits": (timeline.peak.bytes as f64) <= d.memory, "roofline": r})
        })
        .collect();
    let sharding = args
        .shard
        .as_deref()
        .and_then(Strategy::parse)
        .map(|strategy| {
            sharded_memory(
                &scenario,
                strategy,
                args.gpus,
                args.nodes,
                Offload::from_flag(args.offload.as_deref().unwrap_or("")),
            )
        });
    let offload = args.offload.as_deref().map(|o| {
        offload_section(
            &scenario,
            &entries,
            Offload::from_flag(o),
            timeline.peak.bytes,
        )
    });
    Ok(json!({
        "time": {"work": work, "flops": work.flops(), "devices": devices},
        "sharding": sharding,
        "offload": offload,
        "scenario": {
            "lora_r": args.scenario.lora_r, "nf4": args.scenario.nf4, "double_quant": args.scenario.double_quant,
            "micro_batch": args.scenario.micro_batch, "seq_len": args.scenario.seq_len,
            "checkpointing": args.scenario.checkpointing, "trainable_parameters": scenario.trainable_parameters(),
        },
        "inventory_bytes_by_kind": totals,
        "per_layer": per_layer,
        "step_peak": timeline.peak,
        "timeline": timeline.events,
        "seed_formulas": seed,
        "entries": entries,
    }))
}
