//! Shared helpers for the cross-crate tests: finding the reference fixtures and comparing
//! numbers with stated tolerances.
//!
//! The fixture root is `$NAPKIN_FIXTURES`, or `../shared/fixtures` beside the repository.
//! Tests discover every model folder and NF4 case under it, and under napkin's own fixtures in
//! the same layout (`tests/fixtures`, made by its script), instead of naming them, so the same
//! tests run on checkpoints that are not in the repository's view.

use std::path::{Path, PathBuf};

use napkin_core::io::SafetensorsCheckpoint;
use safetensors::Dtype;

/// The fixture root; panics with a clear message when it is missing (a test run without
/// fixtures must fail, never pass vacuously).
pub fn fixture_root() -> PathBuf {
    let root = match std::env::var_os("NAPKIN_FIXTURES") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures"),
    };
    assert!(
        root.is_dir(),
        "fixture root {} not found: set NAPKIN_FIXTURES or place shared/ beside the repository",
        root.display()
    );
    root
}

/// napkin's own fixtures (`tests/fixtures`): the shared layout, other shapes and cases.
pub fn own_fixture_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// The model folders each fixture root promises (`../shared/fixtures/README.md` and
/// `tests/fixtures/README.md`): a root that lacks one fails every test that reads the models,
/// rather than running on fewer.
const PROMISED: [&[&str]; 2] = [
    &["tiny-gqa", "tiny-mha", "tiny-smol"],
    &[
        "nk-gqa4-qv",
        "nk-hd64",
        "nk-mqa-odd",
        "nk-peft-init",
        "nk-qwen2",
        "nk-qwen3",
    ],
];

/// Every model folder (a `config.json` with a `reference.safetensors`) under the fixture root
/// and under napkin's own fixtures; each root must hold the ones it promises, and may hold more.
pub fn model_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for (root, promised) in [fixture_root(), own_fixture_root()]
        .into_iter()
        .zip(PROMISED)
    {
        let found: Vec<PathBuf> = std::fs::read_dir(&root)
            .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.join("config.json").is_file() && p.join("reference.safetensors").is_file()
            })
            .collect();
        for name in promised {
            assert!(
                found
                    .iter()
                    .any(|p| p.file_name() == Some(std::ffi::OsStr::new(name))),
                "{}: the model folder `{name}` (config.json and reference.safetensors) is missing",
                root.display()
            );
        }
        dirs.extend(found);
    }
    dirs.sort_by_key(|p| p.file_name().map(|n| n.to_os_string()));
    dirs
}

/// The model the tests that need a single one run on: napkin's own GQA 4:1 fixture, untied,
/// with peft's default q,v adapter (the model that sorted first before any test named one).
pub const ONE_MODEL: &str = "nk-gqa4-qv";

/// The promised model folder `name` (from either root's list), for a test that needs one
/// model rather than every one: named, so that a further folder in the fixture root (which
/// may sort first) never changes what such a test runs on.
pub fn model_dir(name: &str) -> PathBuf {
    assert!(
        PROMISED.iter().any(|names| names.contains(&name)),
        "`{name}` is not a promised fixture model"
    );
    model_dirs()
        .into_iter()
        .find(|p| p.file_name() == Some(std::ffi::OsStr::new(name)))
        .unwrap_or_else(|| panic!("the fixture model `{name}` is missing"))
}

/// Every NF4 case under `<root>/nf4` of the fixture root and of napkin's own fixtures: (case
/// name, `.safetensors` path, parsed `.json`).
pub fn nf4_cases() -> Vec<(String, PathBuf, serde_json::Value)> {
    let mut cases = Vec::new();
    for root in [fixture_root(), own_fixture_root()] {
        cases.extend(nf4_cases_in(&root.join("nf4")));
    }
    cases.sort_by(|a, b| a.0.cmp(&b.0));
    cases
}

/// The NF4 cases of one folder; it must hold at least one.
fn nf4_cases_in(dir: &Path) -> Vec<(String, PathBuf, serde_json::Value)> {
    let cases: Vec<(String, PathBuf, serde_json::Value)> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .map(|p| {
            let json_path = p.with_extension("json");
            let text = std::fs::read_to_string(&json_path)
                .unwrap_or_else(|e| panic!("{}: {e}", json_path.display()));
            let json = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{}: {e}", json_path.display()));
            let name = p
                .file_stem()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            (name, p, json)
        })
        .collect();
    assert!(!cases.is_empty(), "no NF4 cases under {}", dir.display());
    cases
}

/// The reference tensors of one model folder.
pub struct Reference {
    /// The folder's name, for messages.
    pub name: String,
    checkpoint: SafetensorsCheckpoint,
}

impl Reference {
    /// Opens `dir/reference.safetensors`.
    pub fn open(dir: &Path) -> Self {
        Self::open_file(&dir.join("reference.safetensors"))
    }

    /// Opens any safetensors file of reference tensors.
    pub fn open_file(path: &Path) -> Self {
        let checkpoint = SafetensorsCheckpoint::open(path).unwrap_or_else(|e| panic!("{e}"));
        let name = match path.file_name().and_then(|f| f.to_str()) {
            Some("reference.safetensors") => path.parent().and_then(|p| p.file_name()),
            _ => path.file_stem(),
        };
        Reference {
            name: name.unwrap_or_default().to_string_lossy().into_owned(),
            checkpoint,
        }
    }

    /// A uint8 tensor.
    pub fn u8(&self, name: &str) -> Vec<u8> {
        let (dtype, _, bytes) = self.raw(name);
        assert_eq!(dtype, Dtype::U8, "{}: `{name}`", self.name);
        bytes
    }

    /// A float tensor with its shape.
    pub fn f32(&self, name: &str) -> (Vec<usize>, Vec<f32>) {
        let (dtype, shape, bytes) = self.raw(name);
        let values = napkin_core::io::safetensors::decode_f32(dtype, &bytes)
            .unwrap_or_else(|| panic!("{}: `{name}` is {dtype:?}, not a float", self.name));
        (shape, values)
    }

    /// A float64 tensor.
    pub fn f64(&self, name: &str) -> Vec<f64> {
        let (dtype, _, bytes) = self.raw(name);
        assert_eq!(dtype, Dtype::F64, "{}: `{name}`", self.name);
        bytes
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect()
    }

    /// An int64 tensor with its shape.
    pub fn i64(&self, name: &str) -> (Vec<usize>, Vec<i64>) {
        let (dtype, shape, bytes) = self.raw(name);
        assert_eq!(dtype, Dtype::I64, "{}: `{name}`", self.name);
        let values = bytes
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        (shape, values)
    }

    /// A `[1]` scalar.
    pub fn scalar(&self, name: &str) -> f32 {
        self.f32(name).1[0]
    }

    /// Names starting with `prefix`, with the prefix removed.
    pub fn names_with_prefix(&self, prefix: &str) -> Vec<String> {
        self.checkpoint
            .names_with_prefix(prefix)
            .map(str::to_string)
            .collect()
    }

    /// Whether the reference has a tensor.
    pub fn has(&self, name: &str) -> bool {
        self.checkpoint.contains(name)
    }

    fn raw(&self, name: &str) -> (Dtype, Vec<usize>, Vec<u8>) {
        self.checkpoint
            .read_raw(name)
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("{}: reference has no `{name}`", self.name))
    }
}

/// The largest absolute difference, and the largest relative one (|a−b| / max(|b|, tiny)).
pub fn max_errors(got: &[f32], want: &[f32]) -> (f32, f32) {
    assert_eq!(got.len(), want.len(), "length mismatch");
    got.iter()
        .zip(want)
        .fold((0.0f32, 0.0f32), |(abs, rel), (&g, &w)| {
            let d = (g - w).abs();
            (abs.max(d), rel.max(d / w.abs().max(1e-12)))
        })
}

/// The largest `|got − want|` over the largest `|want|`: a normwise gap, "of the scale".
pub fn relative_gap(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "compared slices differ in length");
    let gap = got
        .iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs())
        .fold(0.0, f32::max);
    gap / want.iter().map(|w| w.abs()).fold(0.0, f32::max)
}

/// Asserts `got ≈ want` element-wise: every element within `abs` OR within `rel` relative.
/// Returns the largest absolute error, so tests can print how close they came.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], abs: f32, rel: f32) -> f32 {
    assert_eq!(
        got.len(),
        want.len(),
        "{what}: {} values, reference has {}",
        got.len(),
        want.len()
    );
    let mut worst = 0.0f32;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let d = (g - w).abs();
        worst = worst.max(d);
        assert!(
            g.is_finite() && (d <= abs || d <= rel * w.abs()),
            "{what}[{i}]: got {g}, reference {w} (|diff| {d:.3e} > {abs:.0e} abs and > {rel:.0e} rel)"
        );
    }
    worst
}

/// A minimal GGUF v3 writer for tests: string/u32/f32 metadata and F32 tensors (given in
/// row-major PyTorch order; written with ggml's reversed dims).
pub fn write_gguf(
    path: &Path,
    metadata: &[(&str, GgufTestValue)],
    tensors: &[(String, Vec<usize>, Vec<f32>)],
) {
    let mut out: Vec<u8> = Vec::new();
    let string = |out: &mut Vec<u8>, s: &str| {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    };
    out.extend(b"GGUF");
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata {
        string(&mut out, key);
        match value {
            GgufTestValue::U32(v) => {
                out.extend(4u32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            GgufTestValue::F32(v) => {
                out.extend(6u32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            GgufTestValue::Str(s) => {
                out.extend(8u32.to_le_bytes());
                string(&mut out, s);
            }
            GgufTestValue::StrArray(items) => {
                out.extend(9u32.to_le_bytes());
                out.extend(8u32.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for s in items {
                    string(&mut out, s);
                }
            }
            GgufTestValue::F32Array(items) => {
                out.extend(9u32.to_le_bytes());
                out.extend(6u32.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                items.iter().for_each(|v| out.extend(v.to_le_bytes()));
            }
            GgufTestValue::I32Array(items) => {
                out.extend(9u32.to_le_bytes());
                out.extend(5u32.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                items.iter().for_each(|v| out.extend(v.to_le_bytes()));
            }
        }
    }
    let mut offset = 0u64;
    for (name, shape, values) in tensors {
        string(&mut out, name);
        out.extend((shape.len() as u32).to_le_bytes());
        for &d in shape.iter().rev() {
            out.extend((d as u64).to_le_bytes());
        }
        out.extend(0u32.to_le_bytes()); // F32
        out.extend(offset.to_le_bytes());
        offset += (4 * values.len()).div_ceil(32) as u64 * 32;
    }
    while !out.len().is_multiple_of(32) {
        out.push(0);
    }
    for (_, _, values) in tensors {
        let start = out.len();
        out.extend(values.iter().flat_map(|v| v.to_le_bytes()));
        while !(out.len() - start).is_multiple_of(32) {
            out.push(0);
        }
    }
    std::fs::write(path, out).expect("write test GGUF");
}

/// A metadata value for [`write_gguf`].
#[derive(Debug, Clone)]
pub enum GgufTestValue {
    /// uint32.
    U32(u32),
    /// float32.
    F32(f32),
    /// string.
    Str(String),
    /// array of strings.
    StrArray(Vec<String>),
    /// array of float32.
    F32Array(Vec<f32>),
    /// array of int32.
    I32Array(Vec<i32>),
}

/// The reference `input_ids` as a batch, and the same ids as causal-LM labels.
pub fn input_batch(reference: &Reference) -> (napkin_core::model::TokenBatch, Vec<i64>) {
    let (shape, ids) = reference.i64("input_ids");
    let rows: Vec<Vec<u32>> = ids
        .chunks(shape[1])
        .map(|r| r.iter().map(|&i| i as u32).collect())
        .collect();
    let batch =
        napkin_core::model::TokenBatch::from_rows(&rows).expect("fixture batch is rectangular");
    (batch, ids)
}
