//! The PyTorch reference as a child process (`scripts/reference/suite.py`), driven one run at
//! a time over its stdin/stdout so napkin's runs and its runs interleave.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use anyhow::{Context, Result, anyhow, bail};

use crate::cli::ReferenceEnv;
use serde_json::{Value, json};

/// A running reference process.
pub struct Reference {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

/// What the reference says after building a case.
#[derive(Debug, Clone)]
pub struct ReferenceSetup {
    /// Its resident bytes before building (the interpreter and torch, nothing of the case).
    pub idle_resident_bytes: u64,
    /// The same by kind (`RssAnon`, `RssFile`, `RssShmem`).
    pub idle_split: Value,
    /// torch's version string.
    pub torch: String,
    /// The hyper-parameters as its built objects hold them.
    pub settings: Value,
    /// Anything it could not do as asked (printed with the case).
    pub notes: Option<String>,
}

/// One run's figures.
#[derive(Debug, Clone)]
pub struct ReferenceRun {
    pub seconds: f64,
    /// The resident high-water mark after a [`RunKind::Peak`] run (0 after a timed one).
    pub peak_resident_bytes: u64,
    /// Resident bytes by kind at the end of the run.
    pub split: Value,
}

/// What a run is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunKind {
    /// Freed heap handed back to the OS and the high-water mark restarted before the run.
    Peak,
    /// Timed in the process's steady state: no trim, no forced garbage collection.
    Timed,
}

impl Reference {
    /// Starts `python script` with `threads` torch threads.
    pub fn start(python: &Path, script: &Path, threads: usize, env: ReferenceEnv) -> Result<Self> {
        if !script.is_file() {
            bail!(
                "the reference script {} does not exist (run from the repository root or give --reference-script)",
                script.display()
            );
        }
        let mut command = Command::new(python);
        command
            .arg(script)
            .env("NAPKIN_BENCH_THREADS", threads.to_string())
            .env("OMP_NUM_THREADS", threads.to_string())
            .env("HF_HUB_OFFLINE", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if env == ReferenceEnv::Napkin {
            // What napkin gets, the reference gets: glibc's allocator thresholds raised and
            // one arena as napkin's heap.rs sets them, and its OpenMP threads pinned one per
            // CPU as napkin's compute threads are.
            command
                .env("GLIBC_TUNABLES", crate::heap::glibc_tunables())
                .env("OMP_PROC_BIND", "close")
                .env("OMP_PLACES", "threads");
        }
        let mut child = napkin_core::device::spawn_unpinned(&mut command)
            .with_context(|| format!("starting the reference {}", python.display()))?;
        let stdin = child.stdin.take().context("the reference's stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("the reference's stdout")?);
        Ok(Reference {
            child,
            stdin,
            stdout,
        })
    }

    /// Builds the case (the reference runs one warm-up itself).
    pub fn setup(&mut self, request: &Value) -> Result<ReferenceSetup> {
        let answer = self.ask(&json!({ "op": "setup", "case": request }))?;
        Ok(ReferenceSetup {
            idle_resident_bytes: answer["idle_rss_bytes"].as_u64().unwrap_or(0),
            idle_split: answer["idle_split"].clone(),
            torch: answer["torch"].as_str().unwrap_or("?").to_string(),
            settings: answer["settings"].clone(),
            notes: answer["notes"].as_str().map(str::to_string),
        })
    }

    /// One run of the current case.
    pub fn run(&mut self, kind: RunKind) -> Result<ReferenceRun> {
        let answer = self.ask(&json!({ "op": "run", "peak": kind == RunKind::Peak }))?;
        Ok(ReferenceRun {
            seconds: answer["seconds"]
                .as_f64()
                .ok_or_else(|| anyhow!("the reference answered no `seconds`: {answer}"))?,
            peak_resident_bytes: answer["peak_rss_bytes"].as_u64().unwrap_or(0),
            split: answer["split"].clone(),
        })
    }

    fn ask(&mut self, request: &Value) -> Result<Value> {
        writeln!(self.stdin, "{request}").context("writing to the reference process")?;
        self.stdin
            .flush()
            .context("writing to the reference process")?;
        let mut line = String::new();
        let read = self
            .stdout
            .read_line(&mut line)
            .context("reading from the reference process")?;
        if read == 0 {
            bail!("the reference process exited (its error is printed above)");
        }
        let answer: Value = serde_json::from_str(&line).with_context(|| {
            format!("the reference answered something that is not JSON: {line}")
        })?;
        if let Some(error) = answer.get("error") {
            bail!("the reference failed: {}", error.as_str().unwrap_or("?"));
        }
        Ok(answer)
    }
}

impl Drop for Reference {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "{}", json!({ "op": "quit" }));
        let _ = self.stdin.flush();
        let _ = self.child.wait();
    }
}
