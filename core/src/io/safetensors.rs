//! Reading safetensors checkpoints: one `model.safetensors` or shards listed in
//! `model.safetensors.index.json`, memory-mapped, with F32/F16/BF16 converted to f32.
//!
//! The `safetensors` crate validates the header (size bound, contiguous in-range offsets,
//! byte counts matching shapes) before we touch any data, so a hostile file is an error.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use crate::error::{Error, Result};

/// One memory-mapped safetensors file.
struct MappedFile {
    path: PathBuf,
    map: Mmap,
}

/// A checkpoint made of one or more safetensors files.
pub struct SafetensorsCheckpoint {
    /// The folder or file the user named (for messages).
    pub location: PathBuf,
    files: Vec<MappedFile>,
    /// Tensor name → index into `files`.
    index: BTreeMap<String, usize>,
}

/// Shape and on-disk dtype of a stored tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredTensorInfo {
    /// The shape as stored.
    pub shape: Vec<usize>,
    /// The dtype as stored.
    pub dtype: Dtype,
}

impl SafetensorsCheckpoint {
    /// Opens a folder (`model.safetensors` or a sharded index) or a single `.safetensors` file.
    pub fn open(path: &Path) -> Result<Self> {
        if path.is_file() {
            return Self::from_files(path, vec![path.to_path_buf()]);
        }
        let single = path.join("model.safetensors");
        let index = path.join("model.safetensors.index.json");
        if index.is_file() {
            let text = std::fs::read_to_string(&index).map_err(|e| Error::io(&index, e))?;
            let json: serde_json::Value =
                serde_json::from_str(&text).map_err(|error| Error::Json {
                    path: index.clone(),
                    error,
                })?;
            let map = json
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| Error::checkpoint(&index, "no `weight_map` object"))?;
            let mut shards: Vec<String> = Vec::new();
            for (name, file) in map {
                let file = file.as_str().ok_or_else(|| {
                    Error::checkpoint(&index, format!("`weight_map.{name}` is not a file name"))
                })?;
                // Shards must be plain file names in the same folder: no escaping it.
                if file.contains('/') || file.contains('\\') || file.starts_with('.') {
                    return Err(Error::checkpoint(
                        &index,
                        format!("shard name `{file}` must be a plain file name"),
                    ));
                }
                if !shards.iter().any(|s| s == file) {
                    shards.push(file.to_string());
                }
            }
            let files = shards.iter().map(|s| path.join(s)).collect();
            let checkpoint = Self::from_files(path, files)?;
            // Every name the index promises must be in the shard it names.
            for (name, file) in map {
                let shard = file.as_str().unwrap_or_default();
                let found = checkpoint
                    .index
                    .get(name)
                    .map(|&i| &checkpoint.files[i].path);
                if found
                    .map(|p| p.file_name().and_then(|f| f.to_str()) != Some(shard))
                    .unwrap_or(true)
                {
                    return Err(Error::checkpoint(
                        &index,
                        format!("tensor `{name}` is not in shard `{shard}`"),
                    ));
                }
            }
            Ok(checkpoint)
        } else if single.is_file() {
            Self::from_files(path, vec![single])
        } else {
            Err(Error::checkpoint(
                path,
                "no model.safetensors or model.safetensors.index.json in this folder",
            ))
        }
    }

    fn from_files(location: &Path, paths: Vec<PathBuf>) -> Result<Self> {
        let mut files = Vec::with_capacity(paths.len());
        let mut index = BTreeMap::new();
        for path in paths {
            let file = File::open(&path).map_err(|e| Error::io(&path, e))?;
            // SAFETY: the map is read-only; a file truncated by another process while mapped
            // would fault, as with any reader of memory-mapped checkpoints.
            let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(&path, e))?;
            let (_, metadata) = SafeTensors::read_metadata(&map)
                .map_err(|e| Error::checkpoint(&path, format!("bad safetensors header: {e}")))?;
            for name in metadata.tensors().keys() {
                if index.insert(name.clone(), files.len()).is_some() {
                    return Err(Error::checkpoint(
                        &path,
                        format!("tensor `{name}` appears in more than one shard"),
                    ));
                }
            }
            files.push(MappedFile { path, map });
        }
        Ok(SafetensorsCheckpoint {
            location: location.to_path_buf(),
            files,
            index,
        })
    }

    /// Every tensor name, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }

    /// Whether a tensor is present.
    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    fn view(&self, name: &str) -> Result<Option<(safetensors::tensor::TensorView<'_>, &Path)>> {
        let Some(&i) = self.index.get(name) else {
            return Ok(None);
        };
        let file = &self.files[i];
        let tensors = SafeTensors::deserialize(&file.map)
            .map_err(|e| Error::checkpoint(&file.path, format!("bad safetensors header: {e}")))?;
        let view = tensors
            .tensor(name)
            .map_err(|e| Error::checkpoint(&file.path, format!("tensor `{name}`: {e}")))?;
        Ok(Some((view, &file.path)))
    }

    /// Shape and dtype of a tensor, if present.
    pub fn info(&self, name: &str) -> Result<Option<StoredTensorInfo>> {
        Ok(self.view(name)?.map(|(v, _)| StoredTensorInfo {
            shape: v.shape().to_vec(),
            dtype: v.dtype(),
        }))
    }

    /// Bytes on disk per dtype name (for `napkin inspect`).
    pub fn bytes_by_dtype(&self) -> Result<BTreeMap<String, u64>> {
        let mut out = BTreeMap::new();
        for name in self.index.keys() {
            if let Some((view, _)) = self.view(name)? {
                *out.entry(format!("{:?}", view.dtype())).or_insert(0) += view.data().len() as u64;
            }
        }
        Ok(out)
    }

    /// Reads a float tensor as f32, checking its shape.
    ///
    /// Returns `MissingTensor` or `ShapeMismatch` naming the tensor; other dtypes than
    /// F32/F16/BF16 are refused.
    pub fn read_f32(&self, name: &str, expected: &[usize]) -> Result<Vec<f32>> {
        let (view, path) = self.view(name)?.ok_or_else(|| Error::MissingTensor {
            path: self.location.clone(),
            name: name.to_string(),
            expected: expected.to_vec(),
        })?;
        if view.shape() != expected {
            return Err(Error::ShapeMismatch {
                path: path.to_path_buf(),
                name: name.to_string(),
                found: view.shape().to_vec(),
                expected: expected.to_vec(),
            });
        }
        decode_f32(view.dtype(), view.data()).ok_or_else(|| Error::UnsupportedDtype {
            path: path.to_path_buf(),
            name: name.to_string(),
            dtype: format!("{:?}", view.dtype()),
        })
    }

    /// Reads any tensor (float or integer) with its shape, for reference fixtures.
    pub fn read_raw(&self, name: &str) -> Result<Option<RawTensor>> {
        Ok(self
            .view(name)?
            .map(|(v, _)| (v.dtype(), v.shape().to_vec(), v.data().to_vec())))
    }

    /// All tensors whose name starts with `prefix`, with the prefix removed.
    pub fn names_with_prefix<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.names().filter_map(move |n| n.strip_prefix(prefix))
    }
}

/// Converts little-endian F32/F16/BF16 bytes to f32; `None` for other dtypes.
pub fn decode_f32(dtype: Dtype, bytes: &[u8]) -> Option<Vec<f32>> {
    let words2 = || {
        bytes
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
    };
    match dtype {
        Dtype::F32 => Some(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        Dtype::F16 => Some(words2().map(|w| half::f16::from_bits(w).to_f32()).collect()),
        Dtype::BF16 => Some(
            words2()
                .map(|w| half::bf16::from_bits(w).to_f32())
                .collect(),
        ),
        _ => None,
    }
}

/// A map from names to owned f32 tensors, for writers and tests.
pub type TensorMap = HashMap<String, (Vec<usize>, Vec<f32>)>;

/// A stored tensor as it is in the file: its dtype, shape and little-endian bytes.
pub type RawTensor = (Dtype, Vec<usize>, Vec<u8>);

/// f32 → IEEE half bits, rounding to nearest even (for writing f16 checkpoints).
pub fn f32_to_f16_bits(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}
