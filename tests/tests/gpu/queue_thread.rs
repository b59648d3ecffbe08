//! The device's queue thread is not confined to the CPU of the compute thread that opened it.
//!
//! cubecl runs each device's queue on a thread of its own, started by the first use of the
//! device, and the command's thread hands it work by spinning. napkin's compute threads are
//! pinned one CPU each (`device/pinning.rs`); a queue thread started from one inherited that
//! single CPU, and the two took turns on it: every small op cost ~124 µs instead of ~10 on an
//! H200 (and on lavapipe). The check runs in a process of its own, so that this process's
//! device, opened by whichever test came first, plays no part.

use std::process::Command;

use napkin_core::device::{DeviceKind, PIN_THREADS_VAR, on_compute_threads};

const CHILD: &str = "NAPKIN_QUEUE_THREAD_CHILD";

/// How many CPUs a `Cpus_allowed_list` (`0-3,8`) names.
fn cpu_count(list: &str) -> usize {
    list.split(',')
        .filter(|part| !part.is_empty())
        .map(|part| match part.split_once('-') {
            Some((lo, hi)) => hi.parse::<usize>().unwrap() - lo.parse::<usize>().unwrap() + 1,
            None => 1,
        })
        .sum()
}

/// The CPUs thread `task` of this process may run on (`self` for the calling thread).
fn allowed_cpus(task: &str) -> usize {
    let path = match task {
        "self" => "/proc/thread-self/status".to_string(),
        id => format!("/proc/self/task/{id}/status"),
    };
    let status = std::fs::read_to_string(path).unwrap();
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Linux reports Cpus_allowed_list")
        .trim();
    cpu_count(list)
}

/// (thread id, name) of every thread of this process.
fn threads() -> Vec<(String, String)> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .map(|entry| {
            let id = entry.file_name().to_string_lossy().into_owned();
            let name = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
            (id, name.trim().to_string())
        })
        .collect()
}

#[test]
fn the_queue_thread_is_not_pinned_with_the_thread_that_opened_the_device() {
    if !cfg!(target_os = "linux") || std::thread::available_parallelism().map_or(1, |n| n.get()) < 2
    {
        return; // nothing is pinned
    }
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "queue_thread::open_the_device_from_a_pinned_compute_thread",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .env_remove(PIN_THREADS_VAR)
        .env_remove("RAYON_NUM_THREADS")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    println!("{text}");
    assert!(output.status.success(), "the child failed:\n{text}");
    assert!(text.contains("1 passed"), "the child ran no test:\n{text}");
}

#[test]
#[ignore = "run in a process of its own by the test above"]
fn open_the_device_from_a_pinned_compute_thread() {
    if std::env::var(CHILD).is_err() {
        return;
    }
    let opener_cpus = on_compute_threads(|| {
        let device = DeviceKind::Wgpu.open().expect("a wgpu adapter");
        drop(device);
        allowed_cpus("self")
    });
    // The precondition: napkin's compute thread was pinned to one CPU.
    assert_eq!(opener_cpus, 1, "the compute thread was not pinned");
    let runners: Vec<(String, String)> = threads()
        .into_iter()
        .filter(|(_, name)| name.starts_with("DS"))
        .collect();
    assert!(
        !runners.is_empty(),
        "no cubecl queue thread: {:?}",
        threads()
    );
    for (id, name) in runners {
        let cpus = allowed_cpus(&id);
        println!("queue thread {name} ({id}) may run on {cpus} CPUs");
        assert!(cpus > 1, "queue thread {name} is confined to {cpus} CPU");
    }
}
