//! `napkin bench gpu`: the training steps a GPU practitioner runs, on the first GPU found (CUDA,
//! then wgpu): TinyLlama-1.1B-shaped QLoRA (r 16 on every linear, NF4 + double quantization,
//! gradient checkpointing, B = 1, T = 512 and 2048; random weights from the preset, nothing
//! downloaded) and SmolLM2-135M LoRA, whole and with the chunked loss. For each: the step peak predicted beside the device pool's,
//! tokens/s, the fraction of the GPU's f32 peak (a preset named with `--gpu-preset`) and of this
//! device's measured GEMM rate, and the bytes the step moved over the host link (counted at each
//! transfer). `--smoke` runs one small case instead (a software GPU such as lavapipe).
//!
//! First, one weight's dequantization three ways (`gpu_dequant.rs`), generation's few-row
//! products from the codes against dequantizing (`gpu_rows.rs`), the host's cost of a launch
//! (`gpu_launch.rs`) and a step's forward and backward captured as a device graph
//! (`gpu_capture.rs`). Products compute in f32, or
//! with `--dtype bf16|f16` under autocast (NF4 dequantized straight to the 16-bit dtype on the
//! device; bf16 where the device has it, else f16). The peak is read at marks between
//! operations, a lower bound of the true one. `--only TEXT` keeps the cases whose name holds
//! TEXT; `--json FILE` writes every figure.

use anyhow::{Context, Result, bail};
use napkin_core::config::{LlamaConfig, LoraConfig, Nf4Config};
use napkin_core::device::{DeviceKind, guard_device_memory};
use napkin_core::measure::{MachineProbe, MeasurementReport, measure_with, random_model};
use napkin_core::model::autocast::half_dtype;
use napkin_core::predict::inventory::Scenario;
use napkin_core::predict::time::{device_presets, step_work};
use napkin_core::predict::units::accelerate_units;
use serde::Serialize;

use crate::cli::BenchArgs;

/// One benchmark case.
struct Case {
    name: &'static str,
    scenario: Scenario,
}

fn qlora(config: LlamaConfig, seq_len: usize) -> Scenario {
    Scenario {
        lora: Some(LoraConfig::default()), // r 16, α 32, every linear
        nf4: Some(Nf4Config {
            block_size: 64,
            double_quant: true,
        }),
        checkpointing: true,
        ..Scenario::new(config, 1, seq_len)
    }
}

fn cases(smoke: bool) -> Vec<Case> {
    if smoke {
        return vec![Case {
            name: "tiny-smol QLoRA r16 NF4+DQ ckpt T=64 (smoke)",
            scenario: qlora(LlamaConfig::tiny_smol(), 64),
        }];
    }
    vec![
        Case {
            name: "TinyLlama-1.1B QLoRA r16 NF4+DQ ckpt T=512",
            scenario: qlora(LlamaConfig::tiny_llama_1_1b(), 512),
        },
        Case {
            name: "TinyLlama-1.1B QLoRA r16 NF4+DQ ckpt T=2048",
            scenario: qlora(LlamaConfig::tiny_llama_1_1b(), 2048),
        },
        Case {
            name: "SmolLM2-135M LoRA r16 T=512",
            scenario: Scenario {
                lora: Some(LoraConfig::default()),
                ..Scenario::new(LlamaConfig::smollm2_135m(), 1, 512)
            },
        },
        // The same step with the chunked loss: its `[T, V]` logits, 96 MB at T = 512, never
        // whole (the largest tensor of this model's step), and its time beside the whole one's.
        Case {
            name: "SmolLM2-135M LoRA r16 T=512 chunked loss",
            scenario: Scenario {
                lora: Some(LoraConfig::default()),
                chunked_loss: true,
                ..Scenario::new(LlamaConfig::smollm2_135m(), 1, 512)
            },
        },
    ]
}

/// The device to bench on: `--device` when it names a GPU, else CUDA, then wgpu.
fn gpu(args: &BenchArgs) -> Result<DeviceKind> {
    let asked = args.device;
    if !asked.is_cpu() {
        return Ok(asked);
    }
    let mut why = Vec::new();
    for kind in [DeviceKind::Cuda, DeviceKind::Wgpu] {
        match kind.open() {
            Ok(_) => return Ok(kind),
            Err(e) => why.push(e.to_string()),
        }
    }
    bail!("no GPU backend could be opened: {}", why.join("; "))
}

/// One case's figures as `--json` writes them.
#[derive(Serialize)]
struct CaseFigures<'a> {
    name: &'a str,
    compute: String,
    tokens_per_step: usize,
    median_step_seconds: f64,
    tokens_per_second: f64,
    step_flops: f64,
    achieved_flops: f64,
    device_gemm_flops: f64,
    report: MeasurementReport,
    /// The same steps replayed from a device graph recorded once (`napkin train`'s way): the
    /// median step's seconds, and how many steps were replayed (None: not run).
    captured_median_step_seconds: Option<f64>,
    replayed_steps: Option<usize>,
}

pub fn run(args: &BenchArgs) -> Result<()> {
    let kind = gpu(args)?;
    let device = kind.open()?;
    let half = super::super::half_precision_on(args.dtype, kind)?;
    let compute = if half {
        format!("{:?}", half_dtype(&device)).to_lowercase()
    } else {
        "f32".to_string()
    };
    let train = device.clone().autodiff();
    let preset = match &args.gpu_preset {
        Some(id) => Some(
            device_presets()
                .into_iter()
                .find(|p| &p.id == id)
                .with_context(|| format!("--gpu-preset {id}: not a device preset"))?,
        ),
        None => None,
    };
    println!(
        "GPU training steps on {} ({} steps per case, the first one not timed); products in {compute}",
        kind.backend_name(),
        args.runs.max(2)
    );
    // The dequantization alone, the three ways (a TinyLlama MLP weight; SmolLM2's for --smoke).
    let shape = if args.smoke {
        [1536, 576]
    } else {
        [5632, 2048]
    };
    let same_dequantized = super::gpu_dequant::run(&device, args.runs.max(2), shape)?;
    let rows = super::gpu_rows::run(&device, args.runs.max(3), args.smoke)?;
    let launch = super::gpu_launch::run(&device, args.runs.max(3))?;
    // The step captured as a device graph: the smoke case, or SmolLM2's (the most launches for
    // its work).
    let captured = cases(args.smoke)
        .into_iter()
        .find(|c| args.smoke || c.name.starts_with("SmolLM2"))
        .map(|c| {
            let s = super::super::with_autocast(c.scenario.clone(), half);
            guard_device_memory(&kind.to_string(), c.name, || {
                super::gpu_capture::run(&device, c.name, &s, args.runs.max(2))
            })
            .with_context(|| format!("{}: the captured step", c.name))
        })
        .transpose()?;
    let mut figures = Vec::new();
    for case in cases(args.smoke) {
        if let Some(only) = &args.only
            && !case.name.contains(only.as_str())
        {
            continue;
        }
        let s = &super::super::with_autocast(case.scenario.clone(), half);
        let measured = |capture: bool| {
            guard_device_memory(&kind.to_string(), case.name, || {
                measure_with(
                    s,
                    &device,
                    args.runs.max(2),
                    MachineProbe::NATIVE,
                    None,
                    capture,
                    || {
                        train.seed(7);
                        random_model(s, &train)
                    },
                )
            })
            .with_context(|| format!("{}: the measured steps", case.name))
        };
        let report: MeasurementReport = measured(false)?;
        // The same steps as `napkin train` runs them: the first op by op, the later ones
        // replayed from a device graph recorded once.
        let replayed = if args.no_capture {
            None
        } else {
            Some(measured(true)?)
        };
        let seconds = report.time.measured_median_seconds;
        let tokens = (s.micro_batch * s.seq_len * s.accumulation.max(1)) as f64;
        let flops = step_work(s).flops();
        let peak = &report.step_peak;
        println!("\n{}", case.name);
        println!(
            "  step peak above the resident bytes: predicted {}, device pool {} ({:.3}×; read at marks)",
            accelerate_units(peak.predicted as f64),
            accelerate_units(peak.measured as f64),
            peak.ratio
        );
        if let Some(parameters) = report.kinds.first() {
            println!(
                "  resident parameters: predicted {}, device pool {} ({:.3}×)",
                accelerate_units(parameters.predicted as f64),
                accelerate_units(parameters.measured as f64),
                parameters.ratio
            );
        }
        println!(
            "  step {seconds:.3} s median: {:.0} tokens/s, {:.1} GFLOP/s ({:.0} % of this device's measured f32 GEMM rate{})",
            tokens / seconds,
            flops / seconds / 1e9,
            100.0 * flops / seconds / report.this_machine.f32_flops,
            match &preset {
                Some(p) => format!(
                    ", {:.1} % of the {} {} peak",
                    100.0 * flops / seconds / if half { p.half_flops } else { p.f32_flops },
                    p.name,
                    if half { "16-bit" } else { "f32" },
                ),
                None => String::new(),
            }
        );
        if let Some(l) = &report.link_per_step {
            println!("  host link per step: {}", super::super::link_summary(l));
        }
        match &replayed {
            Some(r) if r.replayed_steps > 0 => {
                let replay = r.time.measured_median_seconds;
                println!(
                    "  replayed from a device graph ({} of {} steps): {replay:.3} s median, {:.0} \
                     tokens/s ({:.2}× the op-by-op step)",
                    r.replayed_steps,
                    args.runs.max(2),
                    tokens / replay,
                    seconds / replay
                );
                if let Some(held) = &r.held_by_graph {
                    println!(
                        "  held while replaying (gradients, kept inputs, AdamW's scalars): \
                         predicted {}, device pool {} ({:.3}×)",
                        accelerate_units(held.predicted as f64),
                        accelerate_units(held.measured as f64),
                        held.ratio
                    );
                }
            }
            Some(_) => println!(
                "  replayed from a device graph: not used (this case or device runs op by op)"
            ),
            None => {}
        }
        let mut report = report;
        report.trace.clear();
        figures.push(CaseFigures {
            name: case.name,
            compute: compute.clone(),
            tokens_per_step: tokens as usize,
            median_step_seconds: seconds,
            tokens_per_second: tokens / seconds,
            step_flops: flops,
            achieved_flops: flops / seconds,
            device_gemm_flops: report.this_machine.f32_flops,
            report,
            captured_median_step_seconds: replayed
                .as_ref()
                .filter(|r| r.replayed_steps > 0)
                .map(|r| r.time.measured_median_seconds),
            replayed_steps: replayed.as_ref().map(|r| r.replayed_steps),
        });
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&serde_json::json!({
            "backend": kind.backend_name(),
            "compute": compute,
            "host_micros_per_op": launch.plain_micros,
            "host_micros_per_autodiff_op": launch.autodiff_micros,
            "host_micros_per_replayed_op": launch.replayed_micros,
            "captured_step": captured,
            "generation_products": rows,
            "cases": figures,
        }))?;
        napkin_core::io::atomic::write_atomic(path, text.as_bytes())
            .with_context(|| format!("--json {}", path.display()))?;
    }
    // The figures are printed (and written) first; a check that failed then fails the run.
    let failed: Vec<&str> = [
        (!same_dequantized).then_some("the NF4 kernel's values differ from burn's integer ops'"),
        (!rows.same_tokens())
            .then_some("decoding from the codes gave other tokens than dequantizing"),
        (!launch.replay_matches)
            .then_some("the replayed chain's output differs from the eager one's"),
        captured
            .as_ref()
            .filter(|c| c.replayed_median_seconds.is_some() && !c.same_gradients)
            .map(|_| "the captured step's gradients differ from the op-by-op step's"),
    ]
    .into_iter()
    .flatten()
    .collect();
    if !failed.is_empty() {
        anyhow::bail!("the GPU benchmark's checks failed: {}", failed.join("; "));
    }
    Ok(())
}
