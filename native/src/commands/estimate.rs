//! `napkin estimate`: the napkin math of training memory from a configuration alone — the
//! bytes-per-parameter rules, accelerate's `estimate-memory` table, DeepSpeed's ZeRO
//! model-state estimates, and for a Llama the predictor's report of napkin's own engine
//! (`predict::report`, the same value the page renders), as text or JSON.

use std::path::Path;

use anyhow::{Context, Result, bail};
use napkin_core::config::{LlamaConfig, ObjectiveKind, OptimizerKind};
use napkin_core::io::gguf::{GgufFile, gguf_config};
use napkin_core::predict::accelerate::{ModelSizes, accelerate_rows, bert_sizes, llama_sizes};
use napkin_core::predict::bert::BertConfig;
use napkin_core::predict::inventory::{CHUNKED_LOSS, Kind};
use napkin_core::predict::precision::precision_table;
use napkin_core::predict::report::{Report, ReportOptions, report};
use napkin_core::predict::rules::{
    OptimizerRule, Precision, gradient_bytes_per_param, optimizer_bytes_per_param,
    weight_bytes_per_param,
};
use napkin_core::predict::sharding::{Offload, Strategy};
use napkin_core::predict::units::{accelerate_units, gib};
use napkin_core::predict::zero::{Cluster, Zero3Offload, ZeroEstimate, zero2, zero3};
use serde_json::json;

use clap::ValueEnum;
use napkin_core::train::ComputeDtype;

use crate::cli::{Engine, EstimateArgs, Offload as HostOffload};

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
    if args.pytorch.engine == Engine::Pytorch {
        let config = subject.llama.as_ref().context(
            "--engine pytorch replays a Llama: give --model or --preset (not --params or a BERT config)",
        )?;
        return super::estimate_pytorch::run(args, &subject.name, config);
    }
    let (precision, optimizer) = (precision_of(args)?, optimizer_rule_of(args)?);
    let rules = [
        ("weights", weight_bytes_per_param(precision)),
        ("gradients", gradient_bytes_per_param(precision)),
        ("optimizer", optimizer_bytes_per_param(optimizer, precision)),
    ];

    let zero = match args.shard {
        None => None,
        Some(stage) => {
            let cluster = Cluster {
                gpus_per_node: args.gpus.max(1),
                nodes: args.nodes.max(1),
            };
            let offload = args.offload.unwrap_or(HostOffload::None);
            let offload_optimizer = offload != HostOffload::None;
            let offload_params = offload == HostOffload::Params;
            let estimate = match stage {
                Strategy::Zero2 => zero2(subject.params, cluster, offload_optimizer),
                Strategy::Zero3 => {
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

    let optimizer_kind = args.optimizer;
    let inventory = match &subject.llama {
        Some(config) => Some(engine_report(args, config, optimizer_kind)?),
        None => None,
    };

    if args.json {
        let out = json!({
            "inventory": inventory.as_ref().map(serde_json::to_value).transpose()?,
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
    if let Some(r) = &inventory {
        print_report(r);
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
            offload_name(args.offload.unwrap_or(HostOffload::None)),
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
    Ok(match args.dtype {
        ComputeDtype::F32 => Precision::Fp32,
        ComputeDtype::Bf16 | ComputeDtype::F16 => Precision::Mixed,
    })
}

fn optimizer_rule_of(args: &EstimateArgs) -> Result<OptimizerRule> {
    Ok(match args.optimizer {
        OptimizerKind::AdamW => OptimizerRule::AdamW,
        OptimizerKind::AdamW8bit => OptimizerRule::AdamW8bit,
        OptimizerKind::Sgd => OptimizerRule::SgdMomentum,
    })
}

/// `--offload`'s value as it is spelled.
fn offload_name(offload: HostOffload) -> String {
    offload
        .to_possible_value()
        .map(|v| v.get_name().to_string())
        .unwrap_or_default()
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

/// The predictor's report of napkin's engine for a Llama (with the seed formulas beside it).
fn engine_report(
    args: &EstimateArgs,
    config: &LlamaConfig,
    optimizer: OptimizerKind,
) -> Result<Report> {
    let half = matches!(precision_of(args)?, Precision::Mixed);
    let scenario = super::with_autocast(args.scenario.scenario(config.clone(), optimizer)?, half);
    let options = ReportOptions {
        gpus: args.gpus,
        nodes: args.nodes,
        strategy: args.shard,
        offload: args.offload.map(|o| Offload {
            parameters: o == HostOffload::Params,
            optimizer: o != HostOffload::None,
        }),
    };
    Ok(report(&scenario, &options))
}

/// The name serde gives an enum variant (`backward`, `compute`).
fn serde_name<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// The engine's report as text.
fn print_report(r: &Report) {
    let s = &r.scenario;
    let rows = match s.objective {
        ObjectiveKind::Sft => format!("{} × {} tokens", s.micro_batch, s.seq_len),
        objective => format!(
            "{objective}: {} pairs × {} tokens (chosen and rejected side by side){}",
            s.micro_batch,
            s.seq_len,
            if objective.has_reference() {
                ", a graph-free reference forward first"
            } else {
                ""
            }
        ),
    };
    println!(
        "\nnapkin's engine, {rows}, LoRA r={}{}:",
        s.lora_r,
        if s.nf4 { ", NF4 base" } else { "" }
    );
    let split = &r.activations;
    let ckpt = split.recomputed_block.is_some();
    println!(
        "  {:<24} {:>12}   {:>12}",
        "kind", "inventory", "seed formula"
    );
    let seed = &r.seed_formulas;
    // The seed's activation rule sits beside what it describes: all layers' activations, or
    // with recomputation all layers' inputs (the checkpoint inputs).
    let (seed_saved, seed_inputs) = if ckpt {
        (None, Some(seed.activations))
    } else {
        (Some(seed.activations), None)
    };
    let saved_kept = split.kept_through_step - split.checkpoint_inputs;
    let by_kind = |kind: Kind| r.inventory_bytes_by_kind.get(&kind).copied();
    let rows: Vec<(String, Option<u64>, Option<f64>)> = vec![
        ("weights".into(), by_kind(Kind::Weights), Some(seed.weights)),
        ("quant_codes".into(), by_kind(Kind::QuantCodes), None),
        ("quant_scales".into(), by_kind(Kind::QuantScales), None),
        ("adapters".into(), by_kind(Kind::Adapters), None),
        (
            "gradients".into(),
            by_kind(Kind::Gradients),
            Some(seed.gradients),
        ),
        (
            "optimizer_state".into(),
            by_kind(Kind::OptimizerState),
            Some(seed.optimizer),
        ),
        (
            if ckpt {
                "saved_activations, kept".into()
            } else {
                "saved_activations".into()
            },
            by_kind(Kind::SavedActivations).map(|_| saved_kept),
            seed_saved,
        ),
        (
            "checkpoint_inputs".into(),
            (split.checkpoint_inputs > 0).then_some(split.checkpoint_inputs),
            seed_inputs,
        ),
        (
            "recomputed, one block".into(),
            split.recomputed_block.map(|b| b.bytes),
            ckpt.then_some(seed.one_layer_activations),
        ),
        ("logits".into(), by_kind(Kind::Logits), None),
        // One at a time: the largest, not their sum.
        ("workspace (largest)".into(), by_kind(Kind::Workspace), None),
    ];
    for (name, inventory, seed_bytes) in rows {
        if inventory.is_none() && seed_bytes.is_none() {
            continue;
        }
        let show = |x: Option<f64>| x.map_or("—".to_string(), accelerate_units);
        println!(
            "  {:<24} {:>12}   {:>12}",
            name,
            show(inventory.map(|b| b as f64)),
            show(seed_bytes)
        );
    }
    if let Some(block) = split.recomputed_block {
        println!(
            "  checkpointing keeps each block's input through the step; its other activations exist only\n  \
             while its backward recomputes them, one block at a time (the largest: layers.{}). Summed over\n  \
             the blocks they are {} recomputed per micro-batch, not memory held at once.",
            block.layer,
            accelerate_units(split.recomputed_per_micro_batch as f64),
        );
    }
    if let Some(chunks) = r.entries.iter().find(|e| e.name == CHUNKED_LOSS) {
        println!(
            "  --chunked-loss: no whole logits are kept; the head and the loss run one chunk of\n  \
             rows at a time, {} at the most (a chunk's logits and gradients, the final norm's output).",
            accelerate_units(chunks.bytes as f64),
        );
    }
    let recomputed_column = if ckpt { "  recomputed" } else { "" };
    println!(
        "\n  per layer (MiB)   weights  NF4 codes+scales  adapters  gradients  optimizer  activations{recomputed_column}"
    );
    for row in &r.per_layer {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        let recomputed = if ckpt {
            format!(" {:>12.2}", mib(row.recomputed))
        } else {
            String::new()
        };
        println!(
            "  {:<16} {:>8.2} {:>17.2} {:>9.2} {:>10.2} {:>10.2} {:>12.2}{recomputed}",
            row.layer,
            mib(row.weights),
            mib(row.quant),
            mib(row.adapters),
            mib(row.gradients),
            mib(row.optimizer_state),
            mib(row.activations)
        );
    }
    let peak = &r.step_peak;
    println!(
        "\n  step peak: {} at `{}` ({} phase); largest tensors alive then:",
        accelerate_units(peak.bytes as f64),
        peak.label,
        serde_name(&peak.phase),
    );
    for (name, bytes) in peak.largest.iter().take(5) {
        println!("    {:<48} {:>12}", name, accelerate_units(*bytes as f64));
    }
    let work = &r.time.work;
    println!(
        "\n  time: {:.3} TFLOP per step (forward {:.3}, backward {:.3}, recompute {:.3}; LoRA saves {:.3}), {:.2} GB moved",
        r.time.flops / 1e12,
        work.forward_flops / 1e12,
        work.backward_flops / 1e12,
        work.recompute_flops / 1e12,
        work.lora_saved_flops / 1e12,
        work.bytes_moved / 1e9,
    );
    println!(
        "  host link per step: {} (the batch up, the loss back; weights resident), in the step time below",
        accelerate_units(work.link_bytes),
    );
    println!(
        "  {:<32} {:>9} {:>9} {:>8} {:>12} {:>6}",
        "device (roofline lower bound)", "step ms", "tokens/s", "bound", "FLOP/byte", "fits"
    );
    for d in &r.time.devices {
        let t = &d.roofline;
        println!(
            "  {:<32} {:>9.1} {:>9.0} {:>8} {:>5.0} / {:<4.0} {:>6}",
            t.device,
            1e3 * t.step_seconds,
            t.tokens_per_second,
            serde_name(&t.bound),
            t.arithmetic_intensity,
            t.ridge_point,
            if d.fits { "yes" } else { "no" },
        );
    }
    if let Some(offload) = &r.offload {
        println!(
            "\n  offload on one GPU: {} on the device at the peak (without offload {}), {} in host memory;\n  per optimizer step {} to the host and {} to the device:",
            accelerate_units(offload.device_peak_bytes as f64),
            accelerate_units(offload.device_peak_bytes_without_offload as f64),
            accelerate_units(offload.host_bytes as f64),
            accelerate_units(offload.to_host_bytes_per_step as f64),
            accelerate_units(offload.to_device_bytes_per_step as f64),
        );
        for link in &offload.links {
            println!(
                "    {:<32} {:>9.1} ms per step",
                link.name,
                1e3 * link.seconds_per_step
            );
        }
    }
    if let Some(m) = &r.sharding {
        println!(
            "\n  {} on {} GPU(s) (shard group {}): {} per GPU at the peak ({} gathered), {} host memory per node",
            serde_name(&m.strategy),
            m.gpus,
            m.shard_group,
            accelerate_units(m.gpu_peak as f64),
            accelerate_units(m.gathered as f64),
            accelerate_units(m.cpu_per_node as f64),
        );
    }
    if let Some(c) = &r.communication {
        println!(
            "  communication per optimizer step ({} GPU(s), ring collectives; payload = the whole tensor):",
            c.gpus
        );
        for call in &c.calls {
            println!(
                "    {:<34} {:<15} {:>10} × {:<3} over {} rank(s): {} sent per rank",
                call.what,
                call.op.name(),
                accelerate_units(call.payload as f64),
                call.calls,
                call.ranks,
                accelerate_units(call.sent_per_rank() as f64),
            );
        }
        println!(
            "    sent per rank in all: {}{}",
            accelerate_units(c.sent_per_rank as f64),
            if c.sent_across_nodes_per_rank > 0 {
                format!(
                    " ({} of it across nodes)",
                    accelerate_units(c.sent_across_nodes_per_rank as f64)
                )
            } else {
                String::new()
            }
        );
        if c.sent_per_rank > 0 {
            for link in &c.links {
                println!(
                    "    {:<32} {:>9.2} ms per step, nothing overlapped",
                    link.name,
                    1e3 * link.seconds_per_step
                );
            }
        }
    }
}
