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

/// `napkin train` on the tiny SmolLM2-shaped fixture (ChatML, plain progress lines) reading
/// `data`, writing into `out`, with `extra` settings.
fn tiny_run(data: &Path, out: &Path, extra: &[&str]) -> Vec<String> {
    let f = fixtures();
    let mut args: Vec<String> = [
        "train",
        "--model",
        f.join("tiny-smol").to_str().unwrap(),
        "--tokenizer",
        f.join("tokenizer/tokenizer.json").to_str().unwrap(),
        "--chat-format",
        "chatml",
        "--data",
        data.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--plain",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// The arguments of a small QLoRA run writing into `out`.
fn train_args(out: &Path, steps: u64) -> Vec<String> {
    let steps = steps.to_string();
    tiny_run(
        &repo().join("data/napkin-instruct.jsonl"),
        out,
        &[
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
            &steps,
            "--save-every",
            "3",
        ],
    )
}

fn losses(out: &Path) -> Vec<(u64, f64)> {
    let text = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| Some((v["step"].as_u64()?, v["loss"].as_f64()?)))
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

/// The QLoRA recipe with dropout 0.1 (the small run above) trains with `--checkpointing` to
/// the plain run's losses, since each recomputed block draws its first forward's masks; and
/// `--rslora` writes peft's `use_rslora`, scales the adapters by α/√r (the same first loss, B
/// being 0, then others), and a run continuing that adapter adopts the rule.
#[test]
fn checkpointing_keeps_dropouts_losses_and_rslora_trains() {
    const STEPS: u64 = 3;
    let run_with = |tag: &str, extra: &[&str]| {
        let out = Scratch::new(tag);
        let mut args = train_args(&out.0, STEPS);
        args.extend(extra.iter().map(|s| s.to_string()));
        let (ok, stderr) = run(&args);
        assert!(ok, "{tag}: {stderr}");
        let l = losses(&out.0);
        assert_eq!(l.len(), STEPS as usize, "{tag}: {stderr}");
        (out, l, stderr)
    };
    let (_plain, plain, _) = run_with("dropout-plain", &[]);
    let (_ckpt, ckpt, _) = run_with("dropout-ckpt", &["--checkpointing"]);
    for ((step, a), (_, b)) in plain.iter().zip(&ckpt) {
        assert!(
            (a - b).abs() <= 1e-4,
            "step {step}: plain {a} vs checkpointed {b}"
        );
    }

    let (rs, rslora, _) = run_with("rslora", &["--rslora"]);
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(rs.0.join("adapter_config.json")).unwrap())
            .unwrap();
    assert_eq!(config["use_rslora"], serde_json::json!(true));
    assert!(
        (rslora[0].1 - plain[0].1).abs() <= 1e-6,
        "B = 0: the same first loss"
    );
    assert!(
        (rslora[2].1 - plain[2].1).abs() > 1e-3,
        "α/√r = 11.3 against α/r = 4: {rslora:?} vs {plain:?}"
    );
    let (_more, _, stderr) = run_with("rslora-continued", &["--adapter", rs.0.to_str().unwrap()]);
    assert!(
        stderr.contains("scale α/√r replace the run's r 8, α 32, scale α/r"),
        "{stderr}"
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

/// `--preset` trains a seeded random model of a named shape: the run writes an adapter that
/// names the preset, a LoRA run resumed from its checkpoint makes the same base again (steps 3
/// and 4 equal the uninterrupted run's), and a tokenizer larger than the preset's vocabulary
/// or a missing tokenizer is refused in a line.
#[test]
fn a_preset_trains_from_seeded_random_weights() {
    let preset_args = |out: &Path, steps: u64| {
        let mut args = train_args(out, steps);
        let i = args.iter().position(|a| a == "--model").unwrap();
        args[i] = "--preset".into();
        args[i + 1] = "tiny-smol".into();
        let i = args.iter().position(|a| a == "--save-every").unwrap();
        args[i + 1] = "2".into();
        args
    };
    let whole = Scratch::new("preset-whole");
    let (ok, stderr) = run(&preset_args(&whole.0, 4));
    assert!(ok, "{stderr}");
    let reference = losses(&whole.0);
    assert_eq!(reference.len(), 4, "{stderr}");
    let adapter = std::fs::read_to_string(whole.0.join("adapter_config.json")).unwrap();
    assert!(adapter.contains("tiny-smol (random weights)"), "{adapter}");

    // Stopped after step 2 (its checkpoint kept), then resumed to step 4.
    let resumed = Scratch::new("preset-resumed");
    let (ok, stderr) = run(&preset_args(&resumed.0, 4));
    assert!(ok, "{stderr}");
    for later in ["checkpoint-000004", "adapter_model.safetensors"] {
        let path = resumed.0.join(later);
        let _ = std::fs::remove_dir_all(&path);
        let _ = std::fs::remove_file(&path);
    }
    let mut args = preset_args(&resumed.0, 4);
    args.push("--resume".into());
    let (ok, stderr) = run(&args);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("resuming after step 2"), "{stderr}");
    assert_eq!(losses(&resumed.0), reference, "{stderr}");

    let refused = Scratch::new("preset-refused");
    let mut args = preset_args(&refused.0, 1);
    let i = args.iter().position(|a| a == "--tokenizer").unwrap();
    args.drain(i..i + 2);
    let (ok, stderr) = run(&args);
    assert!(!ok && stderr.contains("give --tokenizer FILE"), "{stderr}");
    let smollm2 = repo().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        smollm2.is_file(),
        "{} missing: run scripts/fetch/smollm2.sh (scripts/test.sh does)",
        smollm2.display()
    );
    let mut args = preset_args(&refused.0, 1);
    let i = args.iter().position(|a| a == "--tokenizer").unwrap();
    args[i + 1] = smollm2.to_str().unwrap().into();
    let (ok, stderr) = run(&args);
    assert!(!ok && stderr.contains("embeds 512"), "{stderr}");
    assert_eq!(
        stderr
            .trim()
            .lines()
            .last()
            .map(|l| l.starts_with("error: ")),
        Some(true)
    );
}

#[test]
fn bad_training_settings_are_one_line_errors() {
    let out = Scratch::new("bad");
    for (flag, value, needle) in [
        ("--dtype", "bf16", "computes in f32 only"),
        ("--dtype", "f8", "possible values: f32, bf16, f16"),
        (
            "--optimizer",
            "adam9",
            "possible values: adamw, adamw8bit, sgd",
        ),
        ("--lora-r", "0", "QLoRA needs LoRA adapters"),
        (
            "--chat-format",
            "alpaca",
            "possible values: chatml, llama2, zephyr",
        ),
        (
            "--data-format",
            "csv",
            "possible values: auto, alpaca, sharegpt",
        ),
        (
            "--device",
            "tpu",
            "possible values: cpu, flex, ndarray, wgpu, cuda",
        ),
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

/// A `--tokenizer` whose ids pass the model's embedding (the shared fixtures' 512-token
/// tokenizer on tests/corpus/qwen2's 256-token Qwen2) is refused in one line; it used to panic
/// in the embedding lookup.
#[test]
fn a_tokenizer_beyond_the_models_vocabulary_is_refused() {
    let out = Scratch::new("vocab");
    let f = fixtures();
    let args: Vec<String> = vec![
        "train".to_string(),
        "--model".into(),
        repo().join("tests/corpus/qwen2/hf").display().to_string(),
        "--tokenizer".into(),
        f.join("tokenizer/tokenizer.json").display().to_string(),
        "--data".into(),
        f.join("corpus.txt").display().to_string(),
        "--out".into(),
        out.0.display().to_string(),
        "--lora-r".into(),
        "4".into(),
        "--seq-len".into(),
        "32".into(),
        "--steps".into(),
        "1".into(),
    ];
    let (ok, stderr) = run(&args);
    assert!(!ok, "{stderr}");
    assert!(
        stderr.contains("--tokenizer") && stderr.contains("the model embeds 256 tokens"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
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
        "--keep-checkpoints".into(),
        "1".into(),
        "--nf4-block-size".into(),
        "32".into(),
        "--momentum".into(),
        "0.5".into(),
        "--plain".into(),
    ]);
    assert!(ok, "{stderr}");
    let saved: toml::Value =
        toml::from_str(&std::fs::read_to_string(out.0.join("run_config.toml")).unwrap()).unwrap();
    assert_eq!(saved["lora_r"].as_integer(), Some(6), "the flag wins");
    assert_eq!(saved["seq_len"].as_integer(), Some(64), "the file's value");
    assert_eq!(saved["optimizer"].as_str(), Some("sgd"));
    assert_eq!(saved["lora_alpha"].as_float(), Some(32.0), "a default");
    // The flags for keys that were TOML-only before (they were once parsed and ignored).
    assert_eq!(saved["keep_checkpoints"].as_integer(), Some(1));
    assert_eq!(saved["nf4_block_size"].as_integer(), Some(32));
    assert_eq!(saved["momentum"].as_float(), Some(0.5));
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

    // A value outside a key's set is an error that lists the set.
    for (line, needle) in [
        (
            "device = \"tpu\"",
            "device: unknown device `tpu`: expected cpu, flex, ndarray, wgpu or cuda",
        ),
        (
            "dtype = \"f8\"",
            "dtype: unknown precision `f8`: expected f32, bf16 or f16",
        ),
        (
            "data_format = \"csv\"",
            "unknown format `csv`: expected auto, alpaca, sharegpt",
        ),
        (
            "lr_scheduler = \"step\"",
            "unknown schedule `step`: expected constant, linear or cosine",
        ),
    ] {
        std::fs::write(&config, format!("model = \"x\"\n{line}\n")).unwrap();
        let (ok, stderr) = run(&[
            "train".into(),
            "--config".into(),
            config.to_str().unwrap().into(),
        ]);
        assert!(!ok && stderr.contains(needle), "{line}: {stderr}");
    }
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

/// (step, eval_loss) of every evaluation in metrics.jsonl.
fn eval_losses(out: &Path) -> Vec<(u64, f64)> {
    let text = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| Some((v["step"].as_u64()?, v["eval_loss"].as_f64()?)))
        .collect()
}

/// Full fine-tuning of the tiny fixture with a plain-text held-out file: the held-out loss
/// logged after the last step equals `napkin eval` of the saved model on the same text.
#[test]
fn the_held_out_loss_equals_napkin_eval_on_the_same_text() {
    let out = Scratch::new("eval-equals");
    std::fs::create_dir_all(&out.0).unwrap();
    let held_out = "The capital of Italy is Rome. Low-rank adapters train a few weights.";
    let eval_file = out.0.join("held-out.txt");
    std::fs::write(&eval_file, held_out).unwrap();
    let mut args = train_args(&out.0.join("run"), 3);
    for (flag, value) in [
        ("--lora-r", "0"),
        ("--optimizer", "adamw"),
        ("--lr", "1e-3"),
    ] {
        let i = args.iter().position(|a| a == flag).unwrap();
        args[i + 1] = value.to_string();
    }
    args.retain(|a| a != "--nf4");
    args.extend(
        [
            "--eval-data",
            eval_file.to_str().unwrap(),
            "--eval-every",
            "2",
            "--sample-prompt",
            "Hi",
            "--sample-tokens",
            "6",
        ]
        .map(String::from),
    );
    let (ok, stderr) = run(&args);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("held out: 1 sample ("), "{stderr}");
    let evals = eval_losses(&out.0.join("run"));
    assert_eq!(
        evals.iter().map(|e| e.0).collect::<Vec<_>>(),
        [0, 2, 3],
        "before training, every 2 steps and after the last"
    );
    let f = fixtures();
    let eval = Command::new(env!("CARGO_BIN_EXE_napkin"))
        .args([
            "eval",
            "--model",
            out.0.join("run").to_str().unwrap(),
            "--tokenizer",
            f.join("tokenizer/tokenizer.json").to_str().unwrap(),
            "--text",
            held_out,
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        eval.status.success(),
        "{}",
        String::from_utf8_lossy(&eval.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&eval.stdout).unwrap();
    let want = report["loss"].as_f64().unwrap();
    let got = evals[2].1;
    assert!(
        (got - want).abs() < 1e-5 * want.abs().max(1.0),
        "held-out loss {got} vs napkin eval {want}"
    );

    // The sample logged after the last step is `napkin generate`'s greedy answer from the
    // saved model to the same prompt through ChatML.
    let metrics = std::fs::read_to_string(out.0.join("run/metrics.jsonl")).unwrap();
    let last: serde_json::Value = serde_json::from_str(metrics.lines().last().unwrap()).unwrap();
    assert_eq!(last["samples"][0]["prompt"], "Hi");
    let sample = last["samples"][0]["completion"].as_str().unwrap();
    let generated = Command::new(env!("CARGO_BIN_EXE_napkin"))
        .args([
            "generate",
            "--model",
            out.0.join("run").to_str().unwrap(),
            "--tokenizer",
            f.join("tokenizer/tokenizer.json").to_str().unwrap(),
            "--prompt",
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
            "--max-new-tokens",
            "6",
        ])
        .output()
        .unwrap();
    assert!(generated.status.success());
    let stdout = String::from_utf8_lossy(&generated.stdout);
    assert_eq!(
        stdout.strip_suffix('\n'),
        Some(sample),
        "logged sample vs napkin generate"
    );

    // The report written at the end draws these numbers: one training point per step, one
    // held-out point per evaluation (the baseline included), the sample, the memory check;
    // nothing outside the page is loaded.
    let page = std::fs::read_to_string(out.0.join("run/report.html")).unwrap();
    let points_of = |class: &str| -> usize {
        let tag = format!("<polyline class=\"c-series {class}\" fill=\"none\" points=\"");
        let at = page.find(&tag).unwrap_or_else(|| panic!("no {class} line")) + tag.len();
        page[at..page[at..].find('"').unwrap() + at]
            .split(' ')
            .count()
    };
    assert_eq!(points_of("c-train"), 3, "training loss at steps 1, 2, 3");
    assert_eq!(points_of("c-eval"), 3, "held-out loss at steps 0, 2, 3");
    assert!(page.contains("<td>Hi</td>"), "the sample prompt");
    assert!(
        page.contains("measured / predicted"),
        "the memory check on a CPU run"
    );
    let no_namespace = page.replace("xmlns=\"http://www.w3.org/2000/svg\"", "");
    for external in ["http:", "https:", "<script", "src=", "<link", "url("] {
        assert!(!no_namespace.contains(external), "{external} in the report");
    }
}

/// Early stopping on a held-out text of tokens the training data never shows: as QLoRA
/// learns the instruction data, their probability falls and the held-out loss rises. The run
/// stops after `patience` evaluations without a new best, says why, and `best/` holds the
/// weights of the lowest held-out loss. A run resumed from the checkpoint before the stop
/// repeats the same evaluations and stops at the same step (the early-stopping state is in
/// every checkpoint).
#[test]
fn early_stopping_stops_on_a_rising_held_out_loss_and_keeps_the_best() {
    let out = Scratch::new("early-stop");
    std::fs::create_dir_all(&out.0).unwrap();
    let eval_file = out.0.join("unseen.txt");
    std::fs::write(
        &eval_file,
        "Ωμέγα ψυχή ξένος ζωή φως. Ωμέγα ψυχή ξένος ζωή φως.",
    )
    .unwrap();
    let run_dir = out.0.join("run");
    let mut args = train_args(&run_dir, 40);
    let i = args.iter().position(|a| a == "--save-every").unwrap();
    args[i + 1] = "1".into();
    args.extend(
        [
            "--eval-data",
            eval_file.to_str().unwrap(),
            "--eval-every",
            "1",
            "--early-stopping",
            "3",
        ]
        .map(String::from),
    );
    let (ok, stderr) = run(&args);
    assert!(ok, "{stderr}");
    let evals = eval_losses(&run_dir);
    let stop = evals.last().unwrap().0;
    assert!(stop < 40, "stopped before the last step: {evals:?}");
    assert!(
        stderr.contains(&format!("stopped early after step {stop} of 40")),
        "{stderr}"
    );
    assert_eq!(evals[0].0, 0, "the baseline before training");
    let (best_step, best_loss) = evals[1..]
        .iter()
        .copied()
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap();
    assert_eq!(
        stop,
        best_step + 3,
        "three evaluations without a new best: {evals:?}"
    );
    assert!(
        evals.last().unwrap().1 > best_loss,
        "the held-out loss rose: {evals:?}"
    );
    let best = read_checkpoint(&run_dir.join("best")).unwrap();
    assert_eq!(best.step, best_step);
    assert_eq!(best.eval.best_loss, Some(best_loss));
    assert!(run_dir.join("best/adapter_model.safetensors").is_file());

    // Resume from the checkpoint before the stop: the same evaluations, the same stop.
    let resumed = out.0.join("resumed");
    std::fs::create_dir_all(&resumed).unwrap();
    for entry in std::fs::read_dir(&run_dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_owned();
        if path.is_dir() {
            if name.to_string_lossy() == format!("checkpoint-{stop:06}") {
                continue;
            }
            std::fs::create_dir_all(resumed.join(&name)).unwrap();
            for f in std::fs::read_dir(&path).unwrap() {
                let f = f.unwrap().path();
                std::fs::copy(&f, resumed.join(&name).join(f.file_name().unwrap())).unwrap();
            }
        } else {
            std::fs::copy(&path, resumed.join(&name)).unwrap();
        }
    }
    let mut again = args.clone();
    let i = again.iter().position(|a| a == "--out").unwrap();
    again[i + 1] = resumed.to_str().unwrap().into();
    again.push("--resume".into());
    let (ok, stderr) = run(&again);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains(&format!("resuming after step {}", stop - 1)),
        "{stderr}"
    );
    assert_eq!(eval_losses(&resumed), evals);
    assert_eq!(losses(&resumed), losses(&run_dir));
}

/// Data files as users have them: a JSON array of alpaca records trains (it used to be read
/// as plain text), a held-out fraction is split off and reported, and an unknown extension
/// or a mixed file is refused naming the file and line.
#[test]
fn data_files_are_read_by_format_and_refused_clearly() {
    let out = Scratch::new("formats");
    std::fs::create_dir_all(&out.0).unwrap();
    let text = std::fs::read_to_string(repo().join("data/napkin-instruct.jsonl")).unwrap();
    let records: Vec<&str> = text.lines().take(40).collect();
    let array = out.0.join("alpaca_data.json");
    std::fs::write(&array, format!("[\n{}\n]\n", records.join(",\n"))).unwrap();
    let with_data = |data: &Path, extra: &[&str]| {
        let mut args = train_args(&out.0.join("run"), 2);
        let i = args.iter().position(|a| a == "--data").unwrap();
        args[i + 1] = data.to_str().unwrap().into();
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let (ok, stderr) = run(&with_data(
        &array,
        &["--val-fraction", "0.1", "--eval-every", "1"],
    ));
    assert!(ok, "{stderr}");
    // 40 records, round(0.1 · 40) = 4 held out: the other 36 are trained on or dropped (their
    // reply starts beyond T = 96, after the template's default system prompt).
    let number_before = |text: &str, marker: &str| -> usize {
        let end = text
            .find(marker)
            .unwrap_or_else(|| panic!("{marker}: {text}"));
        let start = text[..end]
            .rfind(|c: char| !c.is_ascii_digit())
            .map_or(0, |i| i + 1);
        text[start..end].parse().unwrap()
    };
    let trained = number_before(&stderr, " alpaca samples (");
    let dropped = number_before(&stderr, " with nothing to learn, dropped");
    assert_eq!(trained + dropped, 36, "{stderr}");
    assert!(
        stderr.contains("held out: 4 samples (0.1 of the data, seeded)"),
        "{stderr}"
    );
    assert_eq!(eval_losses(&out.0.join("run")).len(), 3, "steps 0, 1 and 2");

    let csv = out.0.join("data.csv");
    std::fs::write(&csv, "instruction,output\n").unwrap();
    let mixed = out.0.join("mixed.jsonl");
    std::fs::write(&mixed, format!("{}\n{{\"text\": \"t\"}}\n", records[0])).unwrap();
    for (args, needle) in [
        (
            with_data(&csv, &[]),
            "data.csv:0: unknown extension `.csv`".to_string(),
        ),
        (
            with_data(&mixed, &[]),
            "mixed.jsonl:2: this record is text but the file is alpaca".to_string(),
        ),
        (
            with_data(&array, &["--data-format", "sharegpt"]),
            "alpaca_data.json:2: this record is alpaca but the file is sharegpt".to_string(),
        ),
        (
            with_data(&array, &["--early-stopping", "2"]),
            "--early-stopping".to_string(),
        ),
        (
            with_data(&array, &["--val-fraction", "1.5"]),
            "--val-fraction".to_string(),
        ),
    ] {
        let (ok, stderr) = run(&args);
        assert!(!ok && stderr.contains(&needle), "{needle}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// The shipped preference pairs through `napkin train --objective dpo` (QLoRA, checkpointing,
/// accumulation, a held-out tenth) and `--objective orpo` on the tiny fixture: each step and
/// evaluation writes TRL's metrics, the report draws them, DPO's first step starts at log 2
/// (the adapters start at B = 0, so the policy is its reference), and bad pairs or settings
/// are refused in one line naming the file and line or the flag.
#[test]
fn preference_runs_write_trls_metrics_and_refuse_bad_input() {
    let f = fixtures();
    let base = |out: &Path, objective: &str| -> Vec<String> {
        [
            "train",
            "--model",
            f.join("tiny-smol").to_str().unwrap(),
            "--tokenizer",
            f.join("tokenizer/tokenizer.json").to_str().unwrap(),
            "--chat-format",
            "chatml",
            "--data",
            repo()
                .join("data/napkin-preference.jsonl")
                .to_str()
                .unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--objective",
            objective,
            "--lora-r",
            "8",
            "--lr",
            "3e-3",
            "--seq-len",
            "128",
            "--micro-batch",
            "2",
            "--steps",
            "3",
            "--val-fraction",
            "0.1",
            "--eval-every",
            "3",
            "--plain",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let metrics = |out: &Path| -> Vec<serde_json::Value> {
        std::fs::read_to_string(out.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let dpo = Scratch::new("dpo");
    let mut args = base(&dpo.0, "dpo");
    args.extend(["--nf4", "--checkpointing", "--accum", "2"].map(String::from));
    let (ok, stderr) = run(&args);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("reward accuracy"), "{stderr}");
    let lines = metrics(&dpo.0);
    let steps: Vec<&serde_json::Value> = lines.iter().filter(|l| l["loss"].is_f64()).collect();
    assert_eq!(steps.len(), 3);
    let first = steps[0]["loss"].as_f64().unwrap();
    assert!((first - std::f64::consts::LN_2).abs() < 1e-6, "{first}");
    for key in [
        "rewards/accuracies",
        "rewards/margins",
        "logps/chosen",
        "pairs",
    ] {
        assert!(steps[2][key].is_number(), "{key}: {}", steps[2]);
    }
    let evaluated = lines.last().unwrap();
    assert!(
        evaluated["eval_rewards/accuracies"].is_number(),
        "{evaluated}"
    );
    let report = std::fs::read_to_string(dpo.0.join("report.html")).unwrap();
    assert!(report.contains("Reward accuracy"));
    // From that adapter (--ref-from-adapter): it is the policy's start and the reference, so
    // the first step is log 2 again, though the adapter is no longer zero.
    let again = Scratch::new("dpo-again");
    let mut args = base(&again.0, "dpo");
    args.extend(["--nf4", "--ref-from-adapter", dpo.0.to_str().unwrap()].map(String::from));
    let i = args.iter().position(|a| a == "--steps").unwrap();
    args[i + 1] = "1".into();
    let (ok, stderr) = run(&args);
    assert!(ok, "{stderr}");
    let first = metrics(&again.0)
        .iter()
        .find_map(|l| l["loss"].as_f64())
        .unwrap();
    assert!((first - std::f64::consts::LN_2).abs() < 1e-6, "{first}");

    let orpo = Scratch::new("orpo");
    let (ok, stderr) = run(&base(&orpo.0, "orpo"));
    assert!(ok, "{stderr}");
    let lines = metrics(&orpo.0);
    assert!(
        lines
            .iter()
            .any(|l| l["nll_loss"].is_number() && l["log_odds_ratio"].is_number())
    );

    let bad = Scratch::new("bad-pairs");
    std::fs::create_dir_all(&bad.0).unwrap();
    let file = bad.0.join("pairs.jsonl");
    let good = r#"{"prompt": "2 + 2 =", "chosen": " 4", "rejected": " 5"}"#;
    for (text, needle) in [
        (
            format!("{good}\n{}", r#"{"prompt": "1 + 1 =", "chosen": " 2"}"#),
            "pairs.jsonl:2",
        ),
        (
            format!(
                "{good}\n{good}\n{}",
                r#"{"prompt": "x", "chosen": "", "rejected": "y"}"#
            ),
            "pairs.jsonl:3",
        ),
    ] {
        std::fs::write(&file, text).unwrap();
        let mut args = base(&bad.0.join("out"), "dpo");
        let i = args.iter().position(|a| a == "--data").unwrap();
        args[i + 1] = file.to_str().unwrap().to_string();
        let (ok, stderr) = run(&args);
        assert!(!ok && stderr.contains(needle), "{needle}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let mut args = base(&bad.0.join("out"), "dpo");
    let i = args.iter().position(|a| a == "--lora-r").unwrap();
    args[i + 1] = "0".into();
    let (ok, stderr) = run(&args);
    assert!(!ok && stderr.contains("--objective"), "{stderr}");
}

/// `--dora` as a user runs it: QLoRA with DoRA, dropout and checkpointing for 4 steps; the
/// adapter is peft's DoRA format (`use_dora`, a magnitude per adapted linear); `eval --adapter`
/// (the float model on the NF4 base the run trained on) and the merged folder score the
/// held-out text as the run's last evaluation did.
#[test]
fn a_dora_run_writes_peft_dora_and_scores_as_it_trained() {
    let out = Scratch::new("dora");
    std::fs::create_dir_all(&out.0).unwrap();
    let held_out = "Capital letters: GRADIENT. The capital of Peru is Lima.";
    let eval_file = out.0.join("held-out.txt");
    std::fs::write(&eval_file, held_out).unwrap();
    let run_dir = out.0.join("run");
    let mut args = train_args(&run_dir, 4);
    args.extend(
        [
            "--dora",
            "--checkpointing",
            "--eval-data",
            eval_file.to_str().unwrap(),
            "--merge",
        ]
        .map(String::from),
    );
    let (ok, stderr) = run(&args);
    assert!(ok, "{stderr}");
    let trained = eval_losses(&run_dir).last().unwrap().1;
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run_dir.join("adapter_config.json")).unwrap())
            .unwrap();
    assert_eq!(config["use_dora"], true);
    let tensors =
        napkin_core::io::SafetensorsCheckpoint::open(&run_dir.join("adapter_model.safetensors"))
            .unwrap();
    let magnitudes = tensors
        .names()
        .filter(|n| n.ends_with(".lora_magnitude_vector"))
        .count();
    let pairs = tensors.names().filter(|n| n.contains(".lora_A.")).count();
    assert!(
        magnitudes > 0 && magnitudes == pairs,
        "{magnitudes} vs {pairs}"
    );
    let f = fixtures();
    let scored = |model: &Path, adapter: Option<&Path>| -> f64 {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_napkin"));
        cmd.args([
            "eval",
            "--model",
            model.to_str().unwrap(),
            "--tokenizer",
            f.join("tokenizer/tokenizer.json").to_str().unwrap(),
            "--text",
            held_out,
            "--json",
        ]);
        if let Some(a) = adapter {
            cmd.args(["--adapter", a.to_str().unwrap()]);
        }
        let o = cmd.output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["loss"].as_f64().unwrap()
    };
    let with_adapter = scored(&f.join("tiny-smol"), Some(&run_dir));
    assert!(
        (with_adapter - trained).abs() < 1e-5 * trained,
        "eval --adapter {with_adapter} vs the run's last evaluation {trained}"
    );
    let merged = scored(&run_dir.join("merged"), None);
    assert!(
        (merged - trained).abs() < 1e-4 * trained,
        "the merged folder {merged} vs {trained}"
    );
}

/// Adapters on the embedding and the head from the command line (`--lora-targets` with
/// peft's `embed_tokens` and `lm_head`) on an untied model (`tests/corpus/head_lora`'s, whose
/// 256 tokens take the shared byte-level tokenizer without its merges) with checkpointing,
/// written in peft's layout; on a tied one (tiny-smol) refused in one line.
#[test]
fn embedding_and_head_adapters_train_from_the_command_line() {
    let scratch = Scratch::new("outer");
    std::fs::create_dir_all(&scratch.0).unwrap();
    let mut tokenizer: serde_json::Value = serde_json::from_slice(
        &std::fs::read(fixtures().join("tokenizer/tokenizer.json")).unwrap(),
    )
    .unwrap();
    let model = &mut tokenizer["model"];
    model["merges"] = serde_json::json!([]);
    let bytes: serde_json::Map<String, serde_json::Value> = model["vocab"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, id)| id.as_u64().is_some_and(|id| id < 256))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    model["vocab"] = serde_json::Value::Object(bytes);
    let tokenizer_file = scratch.0.join("tokenizer.json");
    std::fs::write(&tokenizer_file, tokenizer.to_string()).unwrap();
    let run_on = |out: &Path, model: &[&str]| {
        let args: Vec<String> = ["train"]
            .iter()
            .chain(model)
            .chain(&[
                "--tokenizer",
                tokenizer_file.to_str().unwrap(),
                "--chat-format",
                "chatml",
                "--data",
                repo().join("data/napkin-instruct.jsonl").to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
                "--lora-r",
                "4",
                "--lora-targets",
                "q,v,lm_head,embed_tokens",
                "--checkpointing",
                "--seq-len",
                "256",
                "--steps",
                "2",
                "--plain",
            ])
            .map(|s| s.to_string())
            .collect();
        run(&args)
    };
    let corpus = repo().join("tests/corpus/head_lora/hf");
    let out = scratch.0.join("run");
    let (ok, stderr) = run_on(&out, &["--model", corpus.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("adapter_config.json")).unwrap()).unwrap();
    let targets: Vec<&str> = config["target_modules"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(targets, ["q_proj", "v_proj", "embed_tokens", "lm_head"]);
    let tensors =
        napkin_core::io::SafetensorsCheckpoint::open(&out.join("adapter_model.safetensors"))
            .unwrap();
    for key in [
        "base_model.model.lm_head.lora_A.weight",
        "base_model.model.lm_head.lora_B.weight",
        "base_model.model.model.embed_tokens.lora_embedding_A",
        "base_model.model.model.embed_tokens.lora_embedding_B",
    ] {
        assert!(tensors.contains(key), "{key}");
    }
    let (ok, stderr) = run_on(&scratch.0.join("tied"), &["--preset", "tiny-smol"]);
    assert!(!ok && stderr.contains("tied"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// Every shipped example configuration parses as a run's settings and passes the checks that
/// need no model; the CPU QLoRA one runs a step from the repository root as its comment says
/// (its model is the GGUF `scripts/fetch/smollm2.sh` fetches).
#[test]
fn the_example_configs_parse_and_the_cpu_one_runs() {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(repo().join("examples")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let config: napkin_core::train::TrainConfig =
            toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        config
            .validate()
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        names.push(path.file_name().unwrap().to_string_lossy().into_owned());
    }
    names.sort();
    assert_eq!(
        names,
        [
            "dpo-smollm2-cpu.toml",
            "full-ft-smollm2-cpu.toml",
            "lora-tinyllama-gpu.toml",
            "qlora-smollm2-cpu.toml"
        ]
    );
    let out = Scratch::new("example");
    let output = Command::new(env!("CARGO_BIN_EXE_napkin"))
        .current_dir(repo())
        .args([
            "train",
            "--config",
            "examples/qlora-smollm2-cpu.toml",
            "--steps",
            "1",
            "--val-fraction",
            "0.02",
            "--sample-tokens",
            "4",
            "--seq-len",
            "64",
            "--out",
            out.0.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("sample after step 1"), "{stderr}");
    assert!(out.0.join("report.html").is_file());
}

/// `napkin completions` writes each shell's script with the flags, and for the shells whose
/// completion offers values (bash, zsh, fish; clap_complete's PowerShell and Elvish scripts
/// complete flags only) their fixed values.
#[test]
fn completions_list_the_flags_and_their_values() {
    for shell in ["bash", "zsh", "fish", "powershell", "elvish"] {
        let out = Command::new(env!("CARGO_BIN_EXE_napkin"))
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}");
        let script = String::from_utf8_lossy(&out.stdout);
        let values: &[&str] = match shell {
            "bash" | "zsh" | "fish" => &["prompt-completion", "adamw8bit", "efficient", "bf16"],
            _ => &[],
        };
        for needle in ["data-format", "early-stopping", "lora-targets"]
            .iter()
            .chain(values)
        {
            assert!(script.contains(needle), "{shell}: {needle}");
        }
    }
}

/// What a QLoRA run trained can be used: `napkin eval --adapter OUT` rebuilds the same NF4
/// base (from OUT/run_config.toml) under the adapter, and scores the held-out text exactly as
/// the run's last evaluation did.
#[test]
fn eval_with_the_adapter_scores_as_the_run_did() {
    let out = Scratch::new("adapter-eval");
    std::fs::create_dir_all(&out.0).unwrap();
    let held_out = "Capital letters: GRADIENT. The capital of Peru is Lima.";
    let eval_file = out.0.join("held-out.txt");
    std::fs::write(&eval_file, held_out).unwrap();
    let run_dir = out.0.join("run");
    let mut args = train_args(&run_dir, 4);
    args.extend(
        [
            "--eval-data",
            eval_file.to_str().unwrap(),
            "--double-quant",
            "--merge",
        ]
        .map(String::from),
    );
    let (ok, stderr) = run(&args);
    assert!(ok, "{stderr}");
    let trained = eval_losses(&run_dir).last().unwrap().1;
    let f = fixtures();
    let adapter_config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run_dir.join("adapter_config.json")).unwrap())
            .unwrap();
    assert_eq!(
        adapter_config["base_model_name_or_path"].as_str(),
        f.join("tiny-smol").to_str(),
        "peft's AutoPeftModel finds the base from it"
    );
    let scored = |adapter: Option<&Path>| -> (f64, String) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_napkin"));
        cmd.args([
            "eval",
            "--model",
            f.join("tiny-smol").to_str().unwrap(),
            "--tokenizer",
            f.join("tokenizer/tokenizer.json").to_str().unwrap(),
            "--text",
            held_out,
            "--json",
        ]);
        if let Some(a) = adapter {
            cmd.args(["--adapter", a.to_str().unwrap()]);
        }
        let o = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{stderr}");
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        (v["loss"].as_f64().unwrap(), stderr)
    };
    let (with_adapter, stderr) = scored(Some(&run_dir));
    assert!(
        stderr.contains("on an NF4 base (block 64, double quantization) as trained"),
        "{stderr}"
    );
    assert!(
        (with_adapter - trained).abs() < 1e-5 * trained,
        "eval --adapter {with_adapter} vs the run's last evaluation {trained}"
    );
    let (base, _) = scored(None);
    assert!(
        (base - trained).abs() > 1e-3,
        "the adapter changes the loss: {base} vs {trained}"
    );

    // `--merge` writes a complete folder: weights, config and the tokenizer it was trained
    // with, so `eval` and `generate` need no --tokenizer; the merged model (the dequantized
    // NF4 base plus B·A) scores as the adapter on its base.
    let merged = run_dir.join("merged");
    for file in [
        "model.safetensors",
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        assert!(merged.join(file).is_file(), "merged/{file}");
    }
    let o = Command::new(env!("CARGO_BIN_EXE_napkin"))
        .args([
            "eval",
            "--model",
            merged.to_str().unwrap(),
            "--text",
            held_out,
            "--json",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let merged_loss = v["loss"].as_f64().unwrap();
    assert!(
        (merged_loss - with_adapter).abs() < 1e-4 * with_adapter,
        "merged {merged_loss} vs adapter {with_adapter}"
    );
    let o = Command::new(env!("CARGO_BIN_EXE_napkin"))
        .args([
            "generate",
            "--model",
            merged.to_str().unwrap(),
            "--prompt",
            "Hi",
            "--max-new-tokens",
            "4",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// `--adapter` continues a finished run's adapter: the new run's baseline evaluation (before
/// any update) is the first run's last one, and the adapter's rank and targets replace the
/// flags', said in a line.
#[test]
fn train_continues_an_adapter() {
    let out = Scratch::new("continue");
    std::fs::create_dir_all(&out.0).unwrap();
    let eval_file = out.0.join("held-out.txt");
    std::fs::write(&eval_file, "The capital of Peru is Lima.").unwrap();
    let first = out.0.join("first");
    let mut args = train_args(&first, 3);
    args.extend(["--eval-data", eval_file.to_str().unwrap()].map(String::from));
    let (ok, stderr) = run(&args);
    assert!(ok, "{stderr}");
    let last = *eval_losses(&first).last().unwrap();

    let second = out.0.join("second");
    let mut args = train_args(&second, 1);
    let i = args.iter().position(|a| a == "--lora-r").unwrap();
    args[i + 1] = "4".into();
    args.extend(
        [
            "--eval-data",
            eval_file.to_str().unwrap(),
            "--adapter",
            first.to_str().unwrap(),
        ]
        .map(String::from),
    );
    let (ok, stderr) = run(&args);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("its r 8, α 32, targets"), "{stderr}");
    assert!(stderr.contains("replace the run's r 4"), "{stderr}");
    let baseline = eval_losses(&second)[0];
    assert_eq!(baseline.0, 0);
    assert!(
        (baseline.1 - last.1).abs() < 1e-6 * last.1,
        "the continued adapter starts where the first run ended: {} vs {}",
        baseline.1,
        last.1
    );
}

#[test]
fn generate_runs_a_qlora_adapter_on_its_nf4_base_kept_as_codes() {
    // QLoRA on the real SmolLM2 GGUF, then `generate` with the adapter: the block linears are
    // the NF4 base training used, kept as NF4 codes (not dequantized), and the greedy text is
    // the float model's (`--dequantize`: the same codes dequantized to f32).
    let smollm2 = repo().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        smollm2.is_file(),
        "{} missing: run scripts/fetch/smollm2.sh (scripts/test.sh does)",
        smollm2.display()
    );
    let out = Scratch::new("nf4-generate");
    let train = [
        "train",
        "--model",
        smollm2.to_str().unwrap(),
        "--data",
        repo().join("data/napkin-instruct.jsonl").to_str().unwrap(),
        "--out",
        out.0.to_str().unwrap(),
        "--nf4",
        "--double-quant",
        "--lora-r",
        "8",
        "--lr",
        "1e-2",
        "--seq-len",
        "64",
        "--steps",
        "2",
        "--save-every",
        "0",
        "--eval-every",
        "0",
    ]
    .map(String::from);
    let (ok, stderr) = run(&train);
    assert!(ok, "{stderr}");
    let generate = |extra: &[&str]| {
        let mut args = [
            "generate",
            "--model",
            smollm2.to_str().unwrap(),
            "--adapter",
            out.0.to_str().unwrap(),
            "--prompt",
            "The capital of France is",
            "--max-new-tokens",
            "12",
        ]
        .map(String::from)
        .to_vec();
        args.extend(extra.iter().map(|a| a.to_string()));
        let o = Command::new(env!("CARGO_BIN_EXE_napkin"))
            .args(&args)
            .output()
            .expect("run napkin");
        let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{stderr}");
        (String::from_utf8_lossy(&o.stdout).into_owned(), stderr)
    };
    let (codes, stderr) = generate(&[]);
    assert!(
        stderr.contains("Nf4 ×210") && stderr.contains("beside the NF4 base"),
        "{stderr}"
    );
    let (float, stderr) = generate(&["--dequantize"]);
    assert!(
        stderr.contains("on an NF4 base (block 64, double quantization) as trained"),
        "{stderr}"
    );
    assert!(!codes.trim().is_empty());
    assert_eq!(
        codes, float,
        "NF4 codes and the float model on them, greedily"
    );

    // `quantize` of the GGUF writes its tokenizer beside the NF4 checkpoint: `generate` needs
    // no --tokenizer, and runs the codes.
    let nf4 = out.0.join("nf4");
    let (ok, stderr) = run(&[
        "quantize".into(),
        "--model".into(),
        smollm2.to_str().unwrap().into(),
        "--out".into(),
        nf4.to_str().unwrap().into(),
        "--double-quant".into(),
    ]);
    assert!(ok, "{stderr}");
    assert!(nf4.join("tokenizer.json").is_file());
    let o = Command::new(env!("CARGO_BIN_EXE_napkin"))
        .args(["generate", "--model", nf4.to_str().unwrap()])
        .args([
            "--prompt",
            "The capital of France is",
            "--max-new-tokens",
            "4",
        ])
        .output()
        .expect("run napkin");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && stderr.contains("Nf4 ×210"),
        "{stderr}"
    );
}

/// The f32 tensors of an adapter file, by name.
fn adapter_values(dir: &Path) -> Vec<(String, Vec<f32>)> {
    let bytes = std::fs::read(dir.join("adapter_model.safetensors")).expect("the adapter");
    let file = safetensors::SafeTensors::deserialize(&bytes).expect("a safetensors file");
    let mut out: Vec<(String, Vec<f32>)> = file
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let values = view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            (name, values)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The run in `ranks` (several processes) trained what the one in `one` did: `steps` losses
/// each within 1e-6, every adapter value within 2e-6 of its tensor's largest (the sums run in
/// another order).
fn same_run(ranks: &Path, one: &Path, steps: usize) {
    let (a, b) = (losses(ranks), losses(one));
    assert_eq!((a.len(), b.len()), (steps, steps));
    for ((step, x), (_, y)) in a.iter().zip(&b) {
        assert!(
            (x - y).abs() <= 1e-6 * y.abs(),
            "step {step}: loss {x} on the ranks, {y} alone"
        );
    }
    let (a, b) = (adapter_values(ranks), adapter_values(one));
    assert_eq!(a.len(), b.len());
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        let scale = y.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let gap = x
            .iter()
            .zip(y)
            .fold(0.0f32, |m, (p, q)| m.max((p - q).abs()));
        assert!(
            gap <= 2e-6 * scale,
            "{name}: {gap} apart (largest value {scale})"
        );
    }
}

/// `mpirun -np 2 napkin train --shard ddp` (Open MPI, two CPU ranks on loopback) trains what
/// one process trains with twice the accumulation: each step's loss equal (the global mean over
/// both ranks' label tokens) and the adapter equal after 3 SGD steps; the gradients' all-reduce
/// carries exactly the bytes `napkin estimate --shard ddp` predicts.
#[test]
fn two_mpi_ranks_train_what_one_process_trains_with_twice_the_accumulation() {
    let version = Command::new("mpirun").arg("--version").output();
    assert!(
        version.is_ok_and(|o| o.status.success()),
        "mpirun not found: install Open MPI (scripts/setup-system.sh installs Debian's openmpi-bin)"
    );
    let f = fixtures();
    let (ranks, one) = (Scratch::new("ddp-ranks"), Scratch::new("ddp-one"));
    let data = repo().join("data/napkin-instruct.jsonl");
    let common = |out: &Path, accumulation: &str| -> Vec<String> {
        tiny_run(
            &data,
            out,
            &[
                "--lora-r",
                "8",
                "--lora-targets",
                "q_proj,v_proj,down_proj",
                "--optimizer",
                "sgd",
                "--lr",
                "0.5",
                "--seq-len",
                "96",
                "--micro-batch",
                "2",
                "--steps",
                "3",
                "--accum",
                accumulation,
            ],
        )
    };
    let mut ddp = common(&ranks.0, "1");
    ddp.extend(["--shard".to_string(), "ddp".to_string()]);
    let out = mpirun(2).args(&ddp).output().expect("run mpirun");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("over 2 ranks"), "{stderr}");
    let (ok, stderr) = run(&common(&one.0, "2"));
    assert!(ok, "{stderr}");

    same_run(&ranks.0, &one.0, 3);

    // Counted at the call against the prediction for the same adapter on 2 GPUs.
    let counts: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(ranks.0.join("communication.json")).expect("communication.json"),
    )
    .unwrap();
    let gradients = counts
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["what"] == "gradients")
        .expect("the gradients' all-reduce");
    assert_eq!(gradients["calls"], 3);
    let estimate = Command::new(env!("CARGO_BIN_EXE_napkin"))
        .args([
            "estimate",
            "--model",
            f.join("tiny-smol").to_str().unwrap(),
            "--lora-r",
            "8",
            "--lora-targets",
            "q_proj,v_proj,down_proj",
            "--shard",
            "ddp",
            "--gpus",
            "2",
            "--json",
        ])
        .output()
        .expect("run napkin estimate");
    assert!(estimate.status.success());
    let predicted: serde_json::Value = serde_json::from_slice(&estimate.stdout).unwrap();
    let payload = predicted["inventory"]["communication"]["calls"][0]["payload"]
        .as_u64()
        .unwrap();
    assert_eq!(gradients["payload_bytes"].as_u64().unwrap(), 3 * payload);

    // What it does not do is refused in one line: torchrun's rendezvous (NCCL), several ranks
    // without --shard ddp, and a strategy that is only predicted.
    let refused = |extra: &[&str], env: &[(&str, &str)], wanted: &[&str]| {
        let mut args = common(&one.0, "1");
        args.extend(extra.iter().map(|s| s.to_string()));
        let out = Command::new(env!("CARGO_BIN_EXE_napkin"))
            .args(&args)
            .envs(env.iter().copied())
            .output()
            .expect("run napkin");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        for w in wanted {
            assert!(stderr.contains(w), "missing {w:?} in {stderr}");
        }
    };
    let torchrun = [
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "127.0.0.1"),
    ];
    refused(
        &["--shard", "ddp"],
        &torchrun,
        &["torchrun", "NCCL", "mpirun -np 2"],
    );
    refused(&[], &torchrun, &["rank 0 of 2", "--shard ddp"]);
    refused(
        &["--shard", "zero3"],
        &[],
        &["--shard", "napkin estimate --shard zero3"],
    );
}

/// `mpirun` as CI runs it: more ranks than cores, and as root (which Open MPI refuses unless
/// told twice).
fn mpirun(ranks: usize) -> Command {
    let mut c = Command::new("mpirun");
    c.args([
        "--oversubscribe",
        "-np",
        &ranks.to_string(),
        env!("CARGO_BIN_EXE_napkin"),
    ])
    .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
    .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    c
}

/// A small SGD run on the first `records` records of the shipped instruction data, in `dir`.
fn small_run(dir: &Path, records: usize, extra: &[&str]) -> Vec<String> {
    std::fs::create_dir_all(dir).unwrap();
    let data = dir.join("data.jsonl");
    let text = std::fs::read_to_string(repo().join("data/napkin-instruct.jsonl")).unwrap();
    let head: Vec<&str> = text.lines().take(records).collect();
    std::fs::write(&data, head.join("\n") + "\n").unwrap();
    let mut settings = vec![
        "--lora-r",
        "4",
        "--optimizer",
        "sgd",
        "--lr",
        "0.5",
        "--seq-len",
        "64",
        "--micro-batch",
        "1",
    ];
    settings.extend(extra);
    tiny_run(&data, &dir.join("out"), &settings)
}

/// Three ranks over an epoch of 4 micro-batches (not a multiple of 3): each 3-micro-batch step
/// runs on into the next epoch as one process with 3 accumulation steps does, and the losses
/// and adapter equal that process's.
#[test]
fn three_mpi_ranks_over_an_uneven_epoch_equal_one_process() {
    let (ranks, one) = (Scratch::new("ddp3-ranks"), Scratch::new("ddp3-one"));
    let mut args = small_run(
        &ranks.0,
        12,
        &["--steps", "5", "--accum", "1", "--shard", "ddp"],
    );
    let out = mpirun(3).args(args.drain(..)).output().expect("run mpirun");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("4 micro-batches of 1×64 per epoch"),
        "{stderr}"
    );
    let (ok, stderr) = run(&small_run(&one.0, 12, &["--steps", "5", "--accum", "3"]));
    assert!(ok, "{stderr}");
    same_run(&ranks.0.join("out"), &one.0.join("out"), 5);
}

/// The process of this user whose environment says it is MPI rank `rank` and whose command
/// line names `dir`.
fn rank_process(rank: usize, dir: &Path) -> Option<i32> {
    let wanted = format!("OMPI_COMM_WORLD_RANK={rank}");
    let dir = dir.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|e| e.ok())
        .find_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let environ = std::fs::read(e.path().join("environ")).ok()?;
            let has = |bytes: &[u8], text: &str| {
                bytes
                    .split(|b| *b == 0)
                    .any(|part| String::from_utf8_lossy(part).contains(text))
            };
            (has(&cmdline, &dir) && has(&environ, &wanted) && has(&cmdline, "train")).then_some(pid)
        })
}

/// SIGKILL on rank 1 in the middle of a run: `mpirun` ends rank 0 and exits non-zero within
/// 30 seconds, and every checkpoint rank 0 wrote is intact.
#[test]
fn killing_one_rank_stops_the_others_and_keeps_the_checkpoints() {
    let dir = Scratch::new("ddp-kill");
    let out = dir.0.join("out");
    let args = small_run(
        &dir.0,
        40,
        &["--steps", "100000", "--save-every", "1", "--shard", "ddp"],
    );
    let mut child = mpirun(2)
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start mpirun");
    let start = Instant::now();
    // Once two checkpoints exist, kill rank 1.
    loop {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no checkpoint written"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended by itself"
        );
        if list_checkpoints(&out).len() >= 2
            && let Some(pid) = rank_process(1, &dir.0)
        {
            let killed = Command::new("kill").args(["-9", &pid.to_string()]).status();
            assert!(killed.is_ok_and(|s| s.success()));
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let killed_at = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(30),
            "rank 0 still running 30 s after rank 1 was killed"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success(), "mpirun exited 0 after a rank was killed");
    let checkpoints = list_checkpoints(&out);
    assert!(!checkpoints.is_empty());
    for (_, dir) in &checkpoints {
        read_checkpoint(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    }
}
