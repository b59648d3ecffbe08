//! `napkin measure`: real training steps of a scenario, every measured number beside the
//! predictor's (per block and per kind), the step time beside the roofline bound, and the
//! timeline as a Chrome trace.

use std::io::IsTerminal;

use anyhow::{Context, Result, bail};
use napkin_core::config::LlamaConfig;
use napkin_core::device::guard_device_memory;
use napkin_core::io::atomic::write_atomic;
use napkin_core::io::load_model_with;
use napkin_core::measure::{
    Comparison, MachineProbe, MeasurementReport, measure_with, random_model,
};
use napkin_core::model::Llama;
use napkin_core::model::autocast::half_dtype;
use napkin_core::predict::offload::{HostTransfer, host_links};
use napkin_core::predict::units::accelerate_units;

use crate::cli::MeasureArgs;

pub fn run(args: &MeasureArgs) -> Result<()> {
    if args.scenario.objective.is_preference() {
        bail!(
            "--objective {}: measure runs supervised steps on synthetic tokens; a preference step's peak is predicted by `napkin estimate --objective {0}` and measured by `napkin train --objective {0}` (and tests/tests/memory/preference.rs)",
            args.scenario.objective
        );
    }
    let kind = args.device;
    let device = kind.open()?;
    let optimizer = args.optimizer;
    let lora = args.scenario.lora()?;
    let nf4 = args.scenario.nf4();
    let (config, path) = match (&args.preset, &args.model) {
        (Some(name), _) => (LlamaConfig::preset(name)?, None),
        (None, Some(path)) => (super::model_config(path)?, Some(path.clone())),
        (None, None) => bail!("give --model PATH or --preset NAME"),
    };
    let half = super::half_precision_on(args.dtype, kind)?;
    let scenario = super::with_autocast(args.scenario.scenario(config.clone(), optimizer)?, half);
    let train_device = device.clone().autodiff();
    let build = || -> napkin_core::error::Result<Llama> {
        train_device.seed(7);
        let Some(path) = &path else {
            return random_model(&scenario, &train_device);
        };
        let mut model = load_model_with(path, &train_device, nf4.as_ref())?;
        model.attention = scenario.attention;
        if let Some(lora) = &lora {
            model = model.with_lora(lora)?;
        }
        if scenario.half_base() {
            model = model.cast_frozen_base(half_dtype(&train_device));
        }
        Ok(model)
    };

    let offload_to = if super::offload_optimizer(args.offload)? {
        if kind.is_cpu() {
            bail!(
                "--offload optimizer on `{}` ({}): the CPU backend computes in host memory, so offload would move nothing; use --device wgpu or cuda, or `napkin estimate --offload optimizer` for the prediction",
                args.device,
                kind.backend_name()
            );
        }
        Some(napkin_core::device::cpu())
    } else {
        None
    };
    let what = format!(
        "measuring {} step(s) on {}",
        args.steps.max(1),
        kind.backend_name()
    );
    let run = || {
        guard_device_memory(&kind.to_string(), "the measured steps", || {
            measure_with(
                &scenario,
                &device,
                args.steps,
                MachineProbe::NATIVE,
                offload_to,
                !args.no_capture,
                build,
            )
        })
    };
    // JSON on stdout stays alone: no progress lines with --json.
    let report = if args.json {
        run()
    } else {
        super::working(&what, !std::io::stderr().is_terminal(), run)
    }?;
    if let Some(trace) = &args.trace {
        write_atomic(trace, &serde_json::to_vec(&report.chrome_trace())?)
            .with_context(|| format!("writing the trace {}", trace.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report, args);
    }
    Ok(())
}

fn print_report(r: &MeasurementReport, args: &MeasureArgs) {
    let row = |c: &Comparison| {
        println!(
            "  {:<54} {:>12} {:>12} {:>7.3}",
            c.name,
            accelerate_units(c.predicted as f64),
            accelerate_units(c.measured as f64),
            c.ratio
        );
    };
    println!("memory measured with the {}", r.method_description);
    println!(
        "\n  {:<54} {:>12} {:>12} {:>7}",
        "kind", "predicted", "measured", "ratio"
    );
    for c in &r.kinds {
        row(c);
    }
    row(&r.step_peak);
    println!("  (predicted peak at `{}`)", r.predicted_peak_at);
    if let Some(o) = &r.offload {
        println!(
            "\n  offloaded optimizer (host memory: {}; link bytes counted at each copy):",
            o.host_method.describe()
        );
        for c in [&o.host, &o.to_host, &o.to_device] {
            row(c);
        }
        let measured = HostTransfer {
            host_bytes: o.host.measured,
            to_host: o.to_host.measured,
            to_device: o.to_device.measured,
        };
        let times: Vec<String> = host_links()
            .iter()
            .map(|l| format!("{} {:.1} ms", l.name, 1e3 * measured.seconds(l)))
            .collect();
        println!(
            "  the measured traffic per step, if nothing overlaps it: {}",
            times.join(" · ")
        );
    }
    println!("\n  activations kept per block (one forward with its graph):");
    for c in &r.layers {
        row(c);
    }
    let t = &r.time;
    println!(
        "\n  step time: measured {:.3} s (median of {}), roofline bound on this machine {:.3} s ({}-bound; {:.0} GFLOP/s GEMM, {:.1} GB/s copy): the engine reaches {:.0} % of the bound",
        t.measured_median_seconds,
        t.measured_seconds.len().saturating_sub(1).max(1),
        t.predicted.step_seconds,
        match t.predicted.bound {
            napkin_core::predict::time::Bound::Compute => "compute",
            napkin_core::predict::time::Bound::Memory => "memory",
        },
        r.this_machine.f32_flops / 1e9,
        r.this_machine.bandwidth / 1e9,
        100.0 * t.efficiency
    );
    if let Some(c) = &r.link_up {
        println!();
        row(c);
    }
    if let Some(l) = &r.link_per_step {
        println!(
            "  host link in the last step but a recording one (counted at each transfer): {}",
            super::link_summary(l)
        );
    }
    if !args.no_capture && !args.device.is_cpu() {
        match (r.replayed_steps, &r.not_captured) {
            (0, Some(why)) => println!("  {why}"),
            (0, None) => println!("  replayed from a device graph: no step (--steps 1)"),
            (n, _) => println!(
                "  replayed from a device graph: {n} step(s) after the first, timed above \
                 (--no-capture: op by op)"
            ),
        }
        if let Some(c) = &r.held_by_graph {
            row(c);
        }
    }
    if let Some(trace) = &args.trace {
        println!(
            "  timeline written to {} (open in https://ui.perfetto.dev)",
            trace.display()
        );
    }
}
