//! `napkin train` end to end on the tiny SmolLM2-shaped fixture with the shipped instruction
//! data: the loss falls, every output is written, a run killed with SIGKILL resumes to exactly
//! the losses of an uninterrupted run, and no checkpoint folder is ever left half-written.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use napkin_core::train::checkpoint::{list_checkpoints, read_checkpoint};

fn fixtures() -> PathBuf {
    std::env::var_os("NAPKIN_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures"))
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A scratch folder removed at the end of the test.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("napkin-train-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The arguments of a small QLoRA run writing into `out`.
fn train_args(out: &Path, steps: u64) -> Vec<String> {
    let f = fixtures();
    [
        "train",
        "--model",
        f.join("tiny-smol").to_str().unwrap(),
        "--tokenizer",
        f.join("tokenizer/tokenizer.json").to_str().unwrap(),
        "--chat-format",
        "chatml",
        "--data",
        repo().join("data/napkin-instruct.jsonl").to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--nf4",
        "--lora-r",
        "8",
        "--lr",
        "3e-3",
        "--seq-len",
        "96",
        "--micro-batch",
        "2",
        "--accum",
        "2",
        "--optimizer",
        "adamw8bit",
        "--lora-dropout",
        "0.1",
        "--steps",
        &steps.to_string(),
        "--save-every",
        "3",
        "--plain",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn losses(out: &Path) -> Vec<(u64, f64)> {
    let text = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap()))
        .collect()
}

fn run(args: &[String]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_napkin"))
        .args(args)
        .output()
        .expect("run napkin");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_killed_run_resumes_to_the_same_losses() {
    const STEPS: u64 = 24;
    // The uninterrupted run.
    let whole = Scratch::new("whole");
    let (ok, stderr) = run(&train_args(&whole.0, STEPS));
    assert!(ok, "{stderr}");
    let reference = losses(&whole.0);
    assert_eq!(reference.len(), STEPS as usize, "{stderr}");
    let first: f64 = reference[..3].iter().map(|l| l.1).sum::<f64>() / 3.0;
    let last: f64 = reference[reference.len() - 3..]
        .iter()
        .map(|l| l.1)
        .sum::<f64>()
        / 3.0;
    assert!(last < first - 0.5, "the loss falls: {reference:?}");
    for file in [
        "adapter_model.safetensors",
        "adapter_config.json",
        "run_config.toml",
    ] {
        assert!(whole.0.join(file).is_file(), "{file} written");
    }

    // The same run killed with SIGKILL, then resumed: after 8, 2 and 13 steps, and in the
    // middle of writing the 1st and the 3rd checkpoint (their temporary folder exists).
    let mut during_write = 0;
    for (tag, kill) in [
        ("after-8", Kill::AfterSteps(8)),
        ("after-2", Kill::AfterSteps(2)), // before the first checkpoint: starts over
        ("after-13", Kill::AfterSteps(13)),
        ("writing-1", Kill::DuringCheckpoint(1)),
        ("writing-3", Kill::DuringCheckpoint(3)),
    ] {
        during_write += usize::from(kill_and_resume(tag, kill, STEPS, &reference));
    }
    assert!(
        during_write >= 1,
        "no kill landed inside a checkpoint write"
    );
}

#[derive(Debug, Clone, Copy)]
enum Kill {
    /// Once this many steps are in metrics.jsonl.
    AfterSteps(u64),
    /// As soon as the n-th checkpoint's temporary folder appears.
    DuringCheckpoint(usize),
}

/// Runs, kills with SIGKILL at `kill`, checks every final-named checkpoint, resumes, and
/// compares the losses with `reference`. Returns whether the kill hit a checkpoint write.
fn kill_and_resume(tag: &str, kill: Kill, steps: u64, reference: &[(u64, f64)]) -> bool {
    let killed = Scratch::new(&format!("killed-{tag}"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_napkin"))
        .args(train_args(&killed.0, steps))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start napkin");
    let start = Instant::now();
    let mut seen_writes = std::collections::BTreeSet::new();
    let mut hit_write = false;
    loop {
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "{tag}: no progress"
        );
        if child.try_wait().unwrap().is_some() {
            break; // finished before the kill point: resume must then be a no-op
        }
        let writing: Vec<String> = std::fs::read_dir(&killed.0)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.ends_with(".tmp"))
                    .collect()
            })
            .unwrap_or_default();
        seen_writes.extend(writing.iter().cloned());
        let now = match kill {
            Kill::AfterSteps(n) => losses(&killed.0).len() as u64 >= n,
            Kill::DuringCheckpoint(n) => !writing.is_empty() && seen_writes.len() >= n,
        };
        if now {
            child.kill().expect("SIGKILL"); // Child::kill sends SIGKILL on Unix
            hit_write = !writing.is_empty();
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    child.wait().unwrap();
    eprintln!(
        "{tag}: killed after {} steps, {}",
        losses(&killed.0).len(),
        if hit_write {
            "inside a checkpoint write"
        } else {
            "between checkpoint writes"
        }
    );
    // Every checkpoint folder under its final name is complete and matches its checksums.
    for (_, dir) in &list_checkpoints(&killed.0) {
        read_checkpoint(dir).unwrap_or_else(|e| panic!("{tag}: {}: {e}", dir.display()));
    }
    let mut args = train_args(&killed.0, steps);
    args.push("--resume".into());
    let (ok, stderr) = run(&args);
    assert!(ok, "{tag}: {stderr}");
    assert_eq!(
        losses(&killed.0),
        reference,
        "{tag}: the resumed run repeats the uninterrupted one"
    );
    hit_write
}

#[test]
fn a_damaged_checkpoint_is_skipped_on_resume() {
    let out = Scratch::new("damaged");
    let (ok, stderr) = run(&train_args(&out.0, 6));
    assert!(ok, "{stderr}");
    // Two checkpoints kept (steps 3 and 6); damage the newest one's adapter.
    let newest = &list_checkpoints(&out.0)[0].1;
    let adapter = newest.join("adapter_model.safetensors");
    let mut bytes = std::fs::read(&adapter).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&adapter, bytes).unwrap();

    let mut args = train_args(&out.0, 6);
    args.push("--resume".into());
    let (ok, stderr) = run(&args);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("skipped a damaged checkpoint") && stderr.contains("checksum"),
        "{stderr}"
    );
    assert!(stderr.contains("resuming after step 3"), "{stderr}");
}

#[test]
fn bad_training_settings_are_one_line_errors() {
    let out = Scratch::new("bad");
    for (flag, value, needle) in [
        ("--dtype", "bf16", "computes in f32 only"),
        ("--dtype", "f8", "unknown precision"),
        ("--optimizer", "adam9", "unknown optimizer"),
        ("--lora-r", "0", "QLoRA needs LoRA adapters"),
        ("--chat-format", "alpaca", "unknown format"),
    ] {
        let mut args = train_args(&out.0, 2);
        match args.iter().position(|a| a == flag) {
            Some(i) => args[i + 1] = value.to_string(),
            None => args.extend([flag.to_string(), value.to_string()]),
        }
        let (ok, stderr) = run(&args);
        assert!(!ok, "{flag} {value} should fail");
        assert!(stderr.contains(needle), "{flag} {value}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn a_toml_config_is_read_and_flags_win() {
    let out = Scratch::new("toml");
    std::fs::create_dir_all(&out.0).unwrap();
    let f = fixtures();
    let toml = format!(
        "model = {:?}\ntokenizer = {:?}\nchat_format = \"chatml\"\ndata = {:?}\nout = {:?}\n\
         lora_r = 4\nseq_len = 64\nsteps = 2\nsave_every = 0\nlr = 1e-3\noptimizer = \"sgd\"\n",
        f.join("tiny-smol"),
        f.join("tokenizer/tokenizer.json"),
        repo().join("data/napkin-instruct.jsonl"),
        out.0,
    );
    let config = out.0.join("run.toml");
    std::fs::write(&config, toml).unwrap();
    let (ok, stderr) = run(&[
        "train".into(),
        "--config".into(),
        config.to_str().unwrap().into(),
        "--lora-r".into(),
        "6".into(),
        "--plain".into(),
    ]);
    assert!(ok, "{stderr}");
    let saved: toml::Value =
        toml::from_str(&std::fs::read_to_string(out.0.join("run_config.toml")).unwrap()).unwrap();
    assert_eq!(saved["lora_r"].as_integer(), Some(6), "the flag wins");
    assert_eq!(saved["seq_len"].as_integer(), Some(64), "the file's value");
    assert_eq!(saved["optimizer"].as_str(), Some("sgd"));
    assert_eq!(saved["lora_alpha"].as_float(), Some(32.0), "a default");
    assert_eq!(losses(&out.0).len(), 2);

    // An unknown key is an error that names it.
    std::fs::write(&config, "model = \"x\"\nlearning_rate = 1\n").unwrap();
    let (ok, stderr) = run(&[
        "train".into(),
        "--config".into(),
        config.to_str().unwrap().into(),
    ]);
    assert!(!ok);
    assert!(stderr.contains("learning_rate"), "{stderr}");
}

/// The pre-flight check: a run whose predicted peak is above `--memory-limit` is refused with
/// both numbers before anything is written; `--force` runs it anyway.
#[test]
fn a_run_that_cannot_fit_is_refused_up_front() {
    let out = Scratch::new("preflight");
    let mut args = train_args(&out.0, 1);
    args.extend(["--memory-limit".into(), "2 MiB".into()]);
    let (ok, stderr) = run(&args);
    assert!(!ok);
    assert!(
        stderr.contains("napkin predicts a peak of") && stderr.contains("2 MiB available"),
        "{stderr}"
    );
    assert!(!out.0.exists(), "nothing written before the refusal");
    args.push("--force".into());
    let (ok, stderr) = run(&args);
    assert!(ok, "{stderr}");
    let mut bad = train_args(&out.0, 1);
    bad.extend(["--memory-limit".into(), "lots".into()]);
    let (ok, stderr) = run(&bad);
    assert!(!ok && stderr.contains("--memory-limit"), "{stderr}");
}
