//! `napkin bench suite`: every case of `cases.rs` on napkin's CPU backend and, with
//! `--reference PYTHON`, on PyTorch in the same run. Each case is built once per side and
//! warmed up; then napkin's run i and PyTorch's run i alternate, so drift of the machine (clock,
//! other load) lands on both. Reported: median, min and max speed, the speed ratio, the peak
//! resident memory of a run above the process's idle size (same kernel counter on both sides),
//! and the fraction of the machine's attainable GEMM FLOP/s (the first case).

use std::io::IsTerminal;
use std::time::Instant;

use anyhow::{Context, Result};
use napkin_core::io::atomic::write_atomic;
use napkin_core::memory::counting_alloc;
use serde::Serialize;
use serde_json::{Value, json};

use super::cases::{Case, Work, suite};
use super::process_memory::{peak_resident_bytes, resident_bytes, restart_peak};
use super::reference::{Reference, RunKind};
use super::runner::prepare;
use super::{median_interval, spread};
use crate::cli::{BenchArgs, ReferenceEnv};

/// One side's figures for a case.
#[derive(Debug, Clone, Serialize)]
pub struct SideFigures {
    /// Speed in the case's unit: median, min, max over the timed runs.
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// Peak resident bytes of the peak run (after a heap trim) above the process's idle size.
    pub peak_resident_bytes: Option<u64>,
    /// Median FLOP/s as a fraction of the attainable GEMM FLOP/s.
    pub fraction_of_gemm: Option<f64>,
}

/// A case's result.
#[derive(Debug, Clone, Serialize)]
pub struct CaseResult {
    pub name: String,
    pub unit: &'static str,
    pub napkin: SideFigures,
    /// napkin's counted heap peak of a run above its idle heap (the counting allocator).
    pub napkin_heap_peak_bytes: u64,
    pub pytorch: Option<SideFigures>,
    /// Why there is no PyTorch figure, when there is none.
    pub pytorch_error: Option<String>,
    /// napkin speed / PyTorch speed (> 1: napkin is faster): the median of the per-round
    /// ratios.
    pub speed_ratio: Option<f64>,
    /// A distribution-free 95 % interval of that median (6 rounds or more).
    pub speed_ratio_interval: Option<(f64, f64)>,
    /// The shared hyper-parameters (napkin's; the reference's were found equal).
    pub settings: Value,
    /// Resident bytes by kind (`RssAnon`, `RssFile`, `RssShmem`) at the end of each side's peak
    /// run, and PyTorch's before the case was built.
    pub resident_split: Value,
    /// napkin peak / PyTorch peak (< 1: napkin needs less).
    pub memory_ratio: Option<f64>,
    /// What the reference said of how it ran (fused AdamW, `torch.compile` and its compile
    /// time, a kernel it lacks).
    pub reference_notes: Option<String>,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct SuiteReport {
    pub backend: String,
    pub threads: usize,
    pub torch: Option<String>,
    pub runs: usize,
    pub attainable_gemm_gflops: Option<f64>,
    pub cases: Vec<CaseResult>,
}

pub fn run(args: &BenchArgs) -> Result<()> {
    let kind = args.device;
    let device = kind.open()?;
    // burn's CPU backends use rayon's pool (RAYON_NUM_THREADS when set, else every CPU).
    let threads = napkin_core::device::compute_thread_count();
    let runs = args.runs.max(1);
    let cases: Vec<Case> = suite()
        .into_iter()
        .filter(|c| {
            args.only
                .as_ref()
                .is_none_or(|o| c.name.contains(o.as_str()))
        })
        .collect();
    println!(
        "napkin bench suite: {} on {threads} threads{}; {runs} timed runs per case after a warm-up{}",
        kind.backend_name(),
        if args.reference.is_some() {
            ", beside PyTorch (same threads, a fresh process per case)"
        } else {
            " (no --reference: napkin only)"
        },
        if args.reference.is_some() {
            ", interleaved"
        } else {
            ""
        },
    );
    if args.reference.is_some() {
        println!(
            "reference environment: {}",
            match args.reference_env {
                ReferenceEnv::Napkin =>
                    "napkin's (OpenMP threads pinned one per CPU, glibc's allocator thresholds raised, one arena)",
                ReferenceEnv::Plain => "plain (nothing pinned, glibc's defaults)",
            }
        );
    }
    print_header();
    let mut report = SuiteReport {
        backend: kind.backend_name().to_string(),
        threads,
        torch: None,
        runs,
        attainable_gemm_gflops: None,
        cases: Vec::new(),
    };
    for case in &cases {
        let terminal = std::io::stderr().is_terminal();
        if terminal {
            eprint!("  … {}\r", case.name);
        }
        // A fresh reference process per case: PyTorch's speed depended on what its process had
        // run before (the small model's full fine-tuning step: 3062 tok/s in a fresh process,
        // 2263–2364 after the SmolLM2 cases), so one shared process made its figures depend
        // on the order of the cases.
        let mut reference = match &args.reference {
            Some(python) => Some(Reference::start(
                python,
                &args.reference_script,
                threads,
                args.reference_env,
            )?),
            None => None,
        };
        let result = run_case(case, &device, reference.as_mut(), runs, args, &mut report)
            .with_context(|| format!("case `{}`", case.name))?;
        if terminal {
            eprint!("\r\x1b[2K"); // clear the progress line
        }
        print_row(&result);
        report.cases.push(result);
    }
    print_summary(&report);
    if let Some(path) = &args.json {
        write_atomic(path, &serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("figures written to {}", path.display());
    }
    Ok(())
}

fn run_case(
    case: &Case,
    device: &burn::tensor::Device,
    reference: Option<&mut Reference>,
    runs: usize,
    args: &BenchArgs,
    report: &mut SuiteReport,
) -> Result<CaseResult> {
    restart_peak();
    let idle_resident = resident_bytes();
    let idle_heap = counting_alloc::live_bytes() as u64;
    let mut napkin_run = prepare(case, device)?;
    napkin_run()?; // warm-up

    let mut pytorch_error = None;
    let mut reference_notes = None;
    let settings = case.settings(report.threads);
    let mut reference = match reference {
        Some(r) => match r.setup(&{
            let mut request = case.reference_request();
            request["fused_adamw"] = json!(args.reference_fused_adamw);
            request["compile"] = json!(args.reference_compile);
            request
        }) {
            Ok(setup) => {
                report.torch = Some(setup.torch.clone());
                if let Some(notes) = &setup.notes {
                    println!("    PyTorch: {notes}");
                }
                reference_notes = setup.notes.clone();
                let differences = differences("", &settings, &setup.settings);
                if differences.is_empty() {
                    Some((r, setup))
                } else {
                    // Not the same work: no figure from it is compared.
                    pytorch_error = Some(format!(
                        "not compared, the settings differ: {}",
                        differences.join("; ")
                    ));
                    None
                }
            }
            Err(e) => {
                pytorch_error = Some(format!("{e:#}"));
                None
            }
        },
        None => None,
    };

    // One peak run per side: freed heap handed back to the OS first (both sides), so the
    // high-water mark counts every page the step touches. It is not timed: a training loop
    // never trims its heap between steps, and after a trim each step would pay fresh
    // zero-filled pages for buffers it otherwise reuses.
    settle();
    restart_peak();
    napkin_run()?;
    let napkin_peak = match (peak_resident_bytes(), idle_resident) {
        (Some(peak), Some(idle)) => Some(peak.saturating_sub(idle)),
        _ => None,
    };
    let mut resident_split = json!({ "napkin": resident_by_kind() });
    let mut torch_peak: Option<u64> = None;
    if let Some((r, setup)) = reference.as_mut() {
        settle();
        match r.run(RunKind::Peak) {
            Ok(run) => {
                torch_peak = Some(
                    run.peak_resident_bytes
                        .saturating_sub(setup.idle_resident_bytes),
                );
                resident_split["pytorch"] = run.split;
                resident_split["pytorch_idle"] = setup.idle_split.clone();
            }
            Err(e) => {
                pytorch_error = Some(format!("{e:#}"));
                reference = None;
            }
        }
    }

    // Timed runs, alternating, each side in its steady state.
    let mut napkin_seconds = Vec::new();
    let mut heap_peak = 0u64;
    let mut torch_seconds = Vec::new();
    for _ in 0..runs {
        settle();
        counting_alloc::reset_peak();
        let start = Instant::now();
        napkin_run()?;
        napkin_seconds.push(start.elapsed().as_secs_f64());
        heap_peak = heap_peak.max((counting_alloc::peak_bytes() as u64).saturating_sub(idle_heap));
        if let Some((r, _)) = reference.as_mut() {
            settle();
            match r.run(RunKind::Timed) {
                Ok(run) => torch_seconds.push(run.seconds),
                Err(e) => {
                    pytorch_error = Some(format!("{e:#}"));
                    reference = None;
                }
            }
        }
    }
    drop(napkin_run);

    let figures = |seconds: &[f64], peak: Option<u64>, attainable: Option<f64>| {
        let (median_s, min_s, max_s) = spread(seconds)?;
        let amount = case.amount();
        let flops = case.flops();
        Some(SideFigures {
            median: amount / median_s,
            min: amount / max_s,
            max: amount / min_s,
            peak_resident_bytes: peak,
            fraction_of_gemm: attainable
                .filter(|_| flops > 0.0)
                .map(|g| flops / median_s / 1e9 / g),
        })
    };
    // The GEMM case defines "attainable": the better of the two stacks on this machine.
    if let Work::Matmul { .. } = case.work {
        let best = [spread(&napkin_seconds), spread(&torch_seconds)]
            .into_iter()
            .flatten()
            .map(|(median, _, _)| case.amount() / median)
            .fold(0.0f64, f64::max);
        report.attainable_gemm_gflops = Some(best);
    }
    let attainable = report.attainable_gemm_gflops;
    let napkin =
        figures(&napkin_seconds, napkin_peak, attainable).context("no timed napkin run")?;
    let pytorch = figures(&torch_seconds, torch_peak, attainable);
    // Per round: PyTorch's seconds over napkin's (> 1: napkin faster).
    let per_round: Vec<f64> = torch_seconds
        .iter()
        .zip(&napkin_seconds)
        .map(|(t, n)| t / n)
        .collect();
    let (speed_ratio, speed_ratio_interval) = match median_interval(&per_round) {
        Some((m, lo, hi)) => (Some(m), Some((lo, hi))),
        None => (spread(&per_round).map(|(m, ..)| m), None),
    };
    let memory_ratio = match (napkin.peak_resident_bytes, pytorch.as_ref()) {
        (Some(n), Some(p)) => p
            .peak_resident_bytes
            .filter(|&p| p > 0)
            .map(|p| n as f64 / p as f64),
        _ => None,
    };
    Ok(CaseResult {
        name: case.name.clone(),
        unit: case.unit().label(),
        napkin,
        napkin_heap_peak_bytes: heap_peak,
        pytorch,
        pytorch_error,
        speed_ratio,
        speed_ratio_interval,
        settings,
        resident_split,
        memory_ratio,
        reference_notes,
    })
}

/// Where two settings objects differ (`path: napkin X, PyTorch Y`); numbers compare as f64
/// within 1e-9 relative.
fn differences(path: &str, napkin: &Value, torch: &Value) -> Vec<String> {
    let here = |key: &str| {
        if path.is_empty() {
            key.to_string()
        } else {
            format!("{path}.{key}")
        }
    };
    match (napkin, torch) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            keys.into_iter()
                .flat_map(|k| {
                    differences(
                        &here(k),
                        a.get(k).unwrap_or(&Value::Null),
                        b.get(k).unwrap_or(&Value::Null),
                    )
                })
                .collect()
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .flat_map(|(i, (x, y))| differences(&here(&i.to_string()), x, y))
            .collect(),
        (Value::Number(a), Value::Number(b)) => {
            let (a, b) = (
                a.as_f64().unwrap_or(f64::NAN),
                b.as_f64().unwrap_or(f64::NAN),
            );
            if (a - b).abs() <= 1e-9 * a.abs().max(b.abs()) {
                Vec::new()
            } else {
                vec![format!("{path}: napkin {a}, PyTorch {b}")]
            }
        }
        (a, b) if a == b => Vec::new(),
        (a, b) => vec![format!("{path}: napkin {a}, PyTorch {b}")],
    }
}

/// This process's resident bytes by kind now (Linux), as the reference reports its own.
fn resident_by_kind() -> Value {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024)
    };
    json!({
        "RssAnon": field("RssAnon"),
        "RssFile": field("RssFile"),
        "RssShmem": field("RssShmem"),
    })
}

/// A pause between the two sides' runs: BLAS and OpenMP worker threads spin (yielding) for a
/// while after each call, and would otherwise take cores from the other process's next run.
fn settle() {
    std::thread::sleep(std::time::Duration::from_millis(250));
}

fn print_header() {
    println!(
        "{:<40} {:>9} {:>21} {:>21} {:>16} {:>13} {:>13} {:>6}",
        "case",
        "unit",
        "napkin med [min-max]",
        "PyTorch med [min-max]",
        "speed× [95 %]",
        "peak MB n/pt",
        "%GEMM n/pt",
        "mem×"
    );
}

fn print_row(r: &CaseResult) {
    let side = |s: Option<&SideFigures>| {
        s.map_or("-".to_string(), |s| {
            format!("{} [{}-{}]", short(s.median), short(s.min), short(s.max))
        })
    };
    let mb = |s: Option<&SideFigures>| {
        s.and_then(|s| s.peak_resident_bytes)
            .map_or("-".to_string(), |b| format!("{:.0}", b as f64 / 1e6))
    };
    let pct = |s: Option<&SideFigures>| {
        s.and_then(|s| s.fraction_of_gemm)
            .map_or("-".to_string(), |f| format!("{:.0}", f * 100.0))
    };
    let ratio = |r: Option<f64>| r.map_or("-".to_string(), |r| format!("{r:.2}"));
    let speed = match (r.speed_ratio, r.speed_ratio_interval) {
        (Some(m), Some((lo, hi))) => format!("{m:.2} [{lo:.2}-{hi:.2}]"),
        (m, _) => ratio(m),
    };
    println!(
        "{:<40} {:>9} {:>21} {:>21} {:>16} {:>13} {:>13} {:>6}",
        r.name,
        r.unit,
        side(Some(&r.napkin)),
        side(r.pytorch.as_ref()),
        speed,
        format!("{}/{}", mb(Some(&r.napkin)), mb(r.pytorch.as_ref())),
        format!("{}/{}", pct(Some(&r.napkin)), pct(r.pytorch.as_ref())),
        ratio(r.memory_ratio),
    );
    if let Some(e) = &r.pytorch_error {
        println!("    PyTorch: {e}");
    }
    if r.pytorch.is_some() {
        println!("    same settings on both sides: {}", r.settings);
        let mb = |v: &Value, k: &str| {
            v[k].as_u64()
                .map_or("?".into(), |b| format!("{:.0}", b as f64 / 1e6))
        };
        let split = |v: &Value| format!("{}/{}", mb(v, "RssAnon"), mb(v, "RssFile"));
        let s = &r.resident_split;
        println!(
            "    resident after the peak run, anon/file MB: napkin {}, PyTorch {} (PyTorch idle {})",
            split(&s["napkin"]),
            split(&s["pytorch"]),
            split(&s["pytorch_idle"])
        );
    }
}

/// Three significant figures, no exponent.
fn short(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

fn print_summary(report: &SuiteReport) {
    let compared: Vec<&CaseResult> = report
        .cases
        .iter()
        .filter(|c| c.speed_ratio.is_some())
        .collect();
    if compared.is_empty() {
        return;
    }
    let faster = compared
        .iter()
        .filter(|c| c.speed_ratio.is_some_and(|r| r >= 1.0))
        .count();
    let leaner = compared
        .iter()
        .filter(|c| c.memory_ratio.is_some_and(|r| r <= 1.0))
        .count();
    println!(
        "napkin at least as fast in {faster} of {} cases, at most PyTorch's peak memory in {leaner} of {} (torch {})",
        compared.len(),
        compared.iter().filter(|c| c.memory_ratio.is_some()).count(),
        report.torch.as_deref().unwrap_or("?")
    );
}
