//! Pinning the compute threads to CPUs of their own (Linux; elsewhere nothing is pinned).
//!
//! rayon's threads sleep within microseconds of running out of work. After the process had
//! been idle for a while (~250 ms; a virtual machine halts its idle vCPUs), the kernel woke a
//! sleeping worker on the CPU of the thread that woke it, and both threads then shared one
//! core for the whole next step. Measured on two vCPUs, the small model's forward
//! (4 × 128 tokens) in one process: 34–37 ms back to back, 56–72 ms after a 250 ms sleep with
//! ~25 involuntary context switches per run instead of ~1; with the pool pinned the paused
//! runs used both cores again (docs/performance.md, run 9). PyTorch's OpenMP threads, which
//! spin before they sleep, did not show it (34 → 37 ms).
//!
//! Only a pool with one thread per allowed CPU (rayon's default) is pinned. Pinned threads
//! hand their one-CPU affinity to any process or thread they start, so children are started
//! with [`spawn_unpinned`], and a GPU device is opened under [`with_process_cpus`]: cubecl
//! runs each device's queue on a thread of its own that the opening thread starts, and the
//! command's thread hands work to it by spinning — sharing one CPU, each small op cost
//! ~124 µs instead of ~10 on CUDA (an H200), and 124 instead of ~32 on lavapipe.

use rayon::ThreadPoolBuilder;

/// Set to `0` to leave the compute threads unpinned.
pub const PIN_THREADS_VAR: &str = "NAPKIN_PIN_THREADS";

/// The size rayon gives its global pool: `RAYON_NUM_THREADS` when set above zero, else the
/// CPUs this process may use.
pub(super) fn global_pool_size() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// `builder` for a pool of `threads` threads, each pinned to its own CPU of the calling
/// thread's allowed set, when the pool has exactly one thread per allowed CPU. Unchanged when
/// [`PIN_THREADS_VAR`] is `0`, pinning is not supported here, or the counts differ: with more
/// threads than CPUs some would have to share one, and with fewer (`RAYON_NUM_THREADS` set
/// low, e.g. to leave cores to other work) every process would pin to the same first CPUs.
pub(super) fn pin_each_thread(builder: ThreadPoolBuilder, threads: usize) -> ThreadPoolBuilder {
    if std::env::var(PIN_THREADS_VAR).is_ok_and(|v| v.trim() == "0") {
        return builder;
    }
    match affinity::of_this_thread() {
        Some(cpus) if threads >= 1 && cpus.len() == threads => {
            builder.start_handler(move |index| {
                // A refusal (a cpuset changed meanwhile) leaves the thread unpinned.
                let _ = affinity::set_this_thread(&cpus[index..=index]);
            })
        }
        _ => builder,
    }
}

/// How many CPUs the process may use: its main thread's set (which napkin never pins), not the
/// one CPU a pinned compute thread sees; the standard library's count where that is unknown.
pub fn process_cpu_count() -> usize {
    affinity::of_main_thread()
        .map(|cpus| cpus.len())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Runs `work` with the calling thread allowed the CPUs of the process's main thread (which
/// napkin never pins), then restores its own: what a pinned compute thread starts meanwhile
/// (a child process, a thread) inherits the wide set instead of the one CPU.
pub fn with_process_cpus<R>(work: impl FnOnce() -> R) -> R {
    let own = affinity::of_this_thread();
    let process = affinity::of_main_thread();
    match (own, process) {
        (Some(own), Some(process)) if own != process => {
            let widened = affinity::set_this_thread(&process);
            let result = work();
            if widened {
                let _ = affinity::set_this_thread(&own);
            }
            result
        }
        _ => work(),
    }
}

/// Starts `command` with the CPUs of the process's main thread instead of the calling
/// thread's: from a pinned compute thread a child would otherwise run on that one CPU (the
/// benchmark's PyTorch reference did, at ~60 % of its speed).
pub fn spawn_unpinned(command: &mut std::process::Command) -> std::io::Result<std::process::Child> {
    with_process_cpus(|| command.spawn())
}

#[cfg(target_os = "linux")]
mod affinity {
    //! `sched_getaffinity` / `sched_setaffinity` on CPU lists.

    fn read(tid: libc::pid_t) -> Option<Vec<usize>> {
        // SAFETY: `cpu_set_t` is plain bits (all zero is the empty set); the kernel writes at
        // most the size we pass; CPU_ISSET reads below CPU_SETSIZE.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
                return None;
            }
            Some(
                (0..libc::CPU_SETSIZE as usize)
                    .filter(|&cpu| libc::CPU_ISSET(cpu, &set))
                    .collect(),
            )
        }
    }

    /// The CPUs the calling thread may run on.
    pub fn of_this_thread() -> Option<Vec<usize>> {
        read(0)
    }

    /// The CPUs the process's main thread (thread id = process id) may run on.
    pub fn of_main_thread() -> Option<Vec<usize>> {
        // SAFETY: getpid has no preconditions.
        read(unsafe { libc::getpid() })
    }

    /// Restricts the calling thread to `cpus`; false when the kernel refuses.
    pub fn set_this_thread(cpus: &[usize]) -> bool {
        // SAFETY: as in `read`; CPU numbers at or above CPU_SETSIZE are skipped.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for &cpu in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
                libc::CPU_SET(cpu, &mut set);
            }
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod affinity {
    //! No thread affinity here: nothing is pinned.

    pub fn of_this_thread() -> Option<Vec<usize>> {
        None
    }

    pub fn of_main_thread() -> Option<Vec<usize>> {
        None
    }

    pub fn set_this_thread(_cpus: &[usize]) -> bool {
        false
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::{affinity, pin_each_thread, spawn_unpinned};

    /// Each thread of a pinned pool runs on one CPU, and no two share one.
    #[test]
    fn every_pool_thread_gets_a_cpu_of_its_own() {
        let allowed = affinity::of_this_thread().expect("sched_getaffinity works on Linux");
        let threads = allowed.len();
        let pool = pin_each_thread(rayon::ThreadPoolBuilder::new(), threads)
            .num_threads(threads)
            .build()
            .unwrap();
        let mut seen = pool.broadcast(|_| affinity::of_this_thread().unwrap());
        for cpus in &seen {
            assert_eq!(cpus.len(), 1, "a pool thread may run on {cpus:?}");
            assert!(
                allowed.contains(&cpus[0]),
                "{cpus:?} is outside {allowed:?}"
            );
        }
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), threads, "pool threads share CPUs: {seen:?}");
    }

    /// More threads than CPUs (some would have to share one) or fewer (every process would
    /// pin to the same first CPUs): nothing is pinned.
    #[test]
    fn a_pool_of_another_size_than_the_cpu_set_stays_unpinned() {
        let allowed = affinity::of_this_thread().unwrap();
        for threads in [allowed.len() - 1, allowed.len() + 1] {
            if threads == 0 {
                continue;
            }
            let pool = pin_each_thread(rayon::ThreadPoolBuilder::new(), threads)
                .num_threads(threads)
                .build()
                .unwrap();
            for cpus in pool.broadcast(|_| affinity::of_this_thread().unwrap()) {
                assert_eq!(cpus, allowed, "{threads} threads");
            }
        }
    }

    /// A child started from a thread pinned to one CPU gets the process's CPUs (the control
    /// shows that a plain spawn from that thread would not).
    #[test]
    fn children_of_a_pinned_thread_get_every_cpu() {
        let process = affinity::of_main_thread().unwrap();
        if process.len() < 2 {
            return; // one CPU: pinned and unpinned are the same set
        }
        let child_cpus = |unpinned: bool| {
            std::thread::scope(|s| {
                s.spawn(|| {
                    assert!(affinity::set_this_thread(&process[..1]));
                    let mut command = std::process::Command::new("grep");
                    command
                        .args(["Cpus_allowed_list", "/proc/self/status"])
                        .stdout(std::process::Stdio::piped());
                    let child = if unpinned {
                        spawn_unpinned(&mut command)
                    } else {
                        command.spawn()
                    }
                    .unwrap();
                    let out = child.wait_with_output().unwrap();
                    // The pinned thread itself is pinned again after the spawn.
                    assert_eq!(affinity::of_this_thread().unwrap(), &process[..1]);
                    String::from_utf8(out.stdout).unwrap()
                })
                .join()
                .unwrap()
            })
        };
        let expand = |line: &str| -> Vec<usize> {
            let ranges = line.split(':').nth(1).unwrap().trim();
            ranges
                .split(',')
                .flat_map(|r| match r.split_once('-') {
                    Some((a, b)) => (a.parse().unwrap()..=b.parse().unwrap()).collect(),
                    None => vec![r.parse::<usize>().unwrap()],
                })
                .collect()
        };
        assert_eq!(expand(&child_cpus(false)), &process[..1], "control");
        assert_eq!(expand(&child_cpus(true)), process);
    }
}
