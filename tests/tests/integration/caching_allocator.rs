//! The replay of PyTorch's CUDA caching allocator (`predict::pytorch::caching_allocator`)
//! against the allocator itself: each case of `measured-cuda.json` was measured in a process of
//! its own with the allocator's history recorded (`measure.py --fresh --traces`), and its every
//! allocation and free, in order, is replayed here. The replay must end holding the segments
//! PyTorch held when `memory_reserved()` was read, and make the `cudaMalloc`s it made.

use std::path::{Path, PathBuf};

use napkin_core::predict::pytorch::caching_allocator::CachingAllocator;
use serde_json::Value;

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/pytorch_profile")
}

/// What one trace's replay ends with.
struct Replayed {
    reserved: u64,
    max_allocated: u64,
    segment_mallocs: usize,
    /// The `cudaMalloc`s PyTorch recorded.
    measured_segment_mallocs: usize,
}

fn replay(trace: &str) -> Replayed {
    let mut allocator = CachingAllocator::new();
    let mut addresses = std::collections::HashMap::new();
    let mut measured_segment_mallocs = 0;
    for line in trace.lines().filter(|l| !l.starts_with('#')) {
        let fields: Vec<&str> = line.split(' ').collect();
        match fields[..] {
            ["a", id, bytes] => {
                let address = allocator.malloc(bytes.parse().unwrap());
                addresses.insert(id.to_string(), address);
            }
            ["f", id] => allocator.free(addresses.remove(id).expect("freed once")),
            ["s", _] => measured_segment_mallocs += 1,
            ["e"] => allocator.empty_cache(),
            _ => panic!("unreadable trace line {line:?}"),
        }
    }
    Replayed {
        reserved: allocator.reserved(),
        max_allocated: allocator.max_allocated(),
        segment_mallocs: allocator.segment_mallocs(),
        measured_segment_mallocs,
    }
}

#[test]
fn the_allocator_replay_holds_the_segments_pytorch_held() {
    let text = std::fs::read_to_string(corpus().join("measured-cuda.json")).unwrap();
    let measured: Value = serde_json::from_str(&text).unwrap();
    let mut failures = vec![];
    let mut replayed_cases = 0;
    for case in measured["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let path = corpus().join("allocator").join(format!("{name}.txt"));
        let Ok(trace) = std::fs::read_to_string(&path) else {
            continue;
        };
        replayed_cases += 1;
        let r = replay(&trace);
        let reserved = case["reserved"].as_u64().unwrap();
        let max_allocated = case["max_allocated"].as_u64().unwrap();
        let line = format!(
            "{name:<26} reserved {:>13} replayed {:>13} ({:.4}); cudaMallocs {} replayed {}; max allocated {max_allocated} replayed {}",
            reserved,
            r.reserved,
            r.reserved as f64 / reserved as f64,
            r.measured_segment_mallocs,
            r.segment_mallocs,
            r.max_allocated,
        );
        println!("{line}");
        // The measured maximum is the step's (the counter was reset before it); the replay's
        // covers the whole process, so it can only be as high or higher.
        if r.reserved != reserved
            || r.segment_mallocs != r.measured_segment_mallocs
            || r.max_allocated < max_allocated
        {
            failures.push(line);
        }
    }
    assert!(replayed_cases >= 10, "only {replayed_cases} traces found");
    assert!(
        failures.is_empty(),
        "replay differs:\n{}",
        failures.join("\n")
    );
}
