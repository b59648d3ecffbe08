//! Reading GGUF files (versions 2 and 3): the header, every metadata value type, tensor infos
//! and the aligned data section, from a memory map (or, where there is no file system, as in
//! the browser, from bytes already in memory).
//!
//! Every count, length and offset read from the file is checked against the file's size before
//! anything is allocated or read, so a truncated or hostile file is a typed error, never a
//! panic or a huge allocation.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use super::dequant::GgmlType;
use crate::error::{Error, Result};
use crate::kernels::cpu::quantized::{BlockBytes, SharedBuffer};

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    /// u8, u16, u32, u64.
    Uint(u64),
    /// i8, i16, i32, i64.
    Int(i64),
    /// f32, f64.
    Float(f64),
    /// bool.
    Bool(bool),
    /// UTF-8 string (lossy).
    String(String),
    /// Array of values of one type.
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// As an unsigned integer, if it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::Uint(v) => Some(v),
            GgufValue::Int(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// As a float, if it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::Float(v) => Some(v),
            GgufValue::Uint(v) => Some(v as f64),
            GgufValue::Int(v) => Some(v as f64),
            _ => None,
        }
    }

    /// As a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// As an array.
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// Where one tensor lives in the data section.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensorInfo {
    /// ggml dims, fastest-varying first (`[in, out]` for a linear weight).
    pub dims: Vec<u64>,
    /// Storage type.
    pub ggml_type: GgmlType,
    /// Byte offset from the start of the data section.
    pub offset: u64,
    /// Byte size (from type and dims).
    pub size: u64,
}

impl GgufTensorInfo {
    /// Number of elements.
    pub fn num_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// The shape in row-major (PyTorch) order: ggml dims reversed.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// An open GGUF file.
pub struct GgufFile {
    /// The file, for messages.
    pub path: PathBuf,
    /// GGUF version (2 or 3).
    pub version: u32,
    /// Every metadata key and value.
    pub metadata: BTreeMap<String, GgufValue>,
    /// Every tensor, by name.
    pub tensors: BTreeMap<String, GgufTensorInfo>,
    bytes: Arc<FileBytes>,
    data_start: usize,
}

/// Where a GGUF file's bytes are: mapped from disk, or owned (read or downloaded already).
enum FileBytes {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl AsRef<[u8]> for FileBytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl std::ops::Deref for FileBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            FileBytes::Mapped(map) => map,
            FileBytes::Owned(bytes) => bytes,
        }
    }
}

/// A bounds-checked little-endian cursor over the file.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn err(&self, what: &str) -> Error {
        Error::checkpoint(self.path, format!("GGUF: {what} at byte {}", self.pos))
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        match end {
            Some(end) => {
                let out = &self.bytes[self.pos..end];
                self.pos = end;
                Ok(out)
            }
            None => Err(self.err(&format!("file truncated while reading {what}"))),
        }
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count that must fit in what is left of the file at `min_item` bytes per item.
    fn count(&mut self, what: &str, min_item: usize) -> Result<usize> {
        let n = self.u64(what)?;
        let left = (self.bytes.len() - self.pos) as u64;
        if n > left / min_item.max(1) as u64 {
            return Err(self.err(&format!("{what} = {n} cannot fit in the {left} bytes left")));
        }
        Ok(n as usize)
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let len = self.count(what, 1)?;
        Ok(String::from_utf8_lossy(self.take(len, what)?).into_owned())
    }

    fn value(&mut self, kind: u32, depth: u32) -> Result<GgufValue> {
        Ok(match kind {
            0 => GgufValue::Uint(self.array::<1>("u8")?[0] as u64),
            1 => GgufValue::Int(self.array::<1>("i8")?[0] as i8 as i64),
            2 => GgufValue::Uint(u16::from_le_bytes(self.array("u16")?) as u64),
            3 => GgufValue::Int(i16::from_le_bytes(self.array("i16")?) as i64),
            4 => GgufValue::Uint(self.u32("u32")? as u64),
            5 => GgufValue::Int(i32::from_le_bytes(self.array("i32")?) as i64),
            6 => GgufValue::Float(f32::from_le_bytes(self.array("f32")?) as f64),
            7 => GgufValue::Bool(self.array::<1>("bool")?[0] != 0),
            8 => GgufValue::String(self.string("string")?),
            9 => {
                if depth > 4 {
                    return Err(self.err("arrays nested more than 4 deep"));
                }
                let inner = self.u32("array type")?;
                let n = self.count("array length", 1)?;
                let mut items = Vec::with_capacity(n.min(1 << 20));
                for _ in 0..n {
                    items.push(self.value(inner, depth + 1)?);
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::Uint(self.u64("u64")?),
            11 => GgufValue::Int(i64::from_le_bytes(self.array("i64")?)),
            12 => GgufValue::Float(f64::from_le_bytes(self.array("f64")?)),
            other => return Err(self.err(&format!("unknown metadata value type {other}"))),
        })
    }
}

impl GgufFile {
    /// Opens and validates a GGUF file: header, metadata, tensor infos, and that every tensor's
    /// bytes lie inside the data section without overlapping another's.
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: read-only map; see `SafetensorsCheckpoint::open`. A model loaded with its
        // blocks kept reads them from this map for as long as it lives.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        Self::parse(path, FileBytes::Mapped(map))
    }

    /// As [`GgufFile::open`], on a file's bytes already in memory (a download, a file the
    /// browser read); `name` stands for the file in messages.
    pub fn from_bytes(name: &str, bytes: Vec<u8>) -> Result<Self> {
        Self::parse(Path::new(name), FileBytes::Owned(bytes))
    }

    fn parse(path: &Path, map: FileBytes) -> Result<Self> {
        let mut c = Cursor {
            bytes: &map,
            pos: 0,
            path,
        };
        if c.take(4, "magic")? != b"GGUF" {
            return Err(Error::checkpoint(
                path,
                "not a GGUF file (the first 4 bytes are not `GGUF`)",
            ));
        }
        let version = c.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(Error::checkpoint(
                path,
                format!("GGUF version {version} is not supported (2 or 3)"),
            ));
        }
        // A tensor info is at least 8+1 (name) + 4 + 8 + 4 + 8 bytes; a key-value pair ≥ 8+1+4+1.
        let n_tensors = c.count("tensor count", 33)?;
        let n_kv = c.count("metadata count", 14)?;
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = c.string("metadata key")?;
            let kind = c.u32("metadata type")?;
            let value = c.value(kind, 0)?;
            metadata.insert(key, value);
        }
        let mut infos = Vec::with_capacity(n_tensors);
        for _ in 0..n_tensors {
            let name = c.string("tensor name")?;
            let n_dims = c.u32("tensor dims")?;
            if !(1..=4).contains(&n_dims) {
                return Err(Error::checkpoint(
                    path,
                    format!("tensor `{name}` has {n_dims} dims (1 to 4 expected)"),
                ));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(c.u64("tensor dim")?);
            }
            let type_id = c.u32("tensor type")?;
            let offset = c.u64("tensor offset")?;
            let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| {
                Error::checkpoint(
                    path,
                    format!("tensor `{name}`: unknown ggml type {type_id}"),
                )
            })?;
            infos.push((name, dims, ggml_type, offset));
        }
        let alignment = match metadata.get("general.alignment") {
            Some(v) => v
                .as_u64()
                .filter(|a| a.is_power_of_two() && *a <= 1 << 16)
                .ok_or_else(|| {
                    Error::checkpoint(path, "general.alignment must be a power of two up to 65536")
                })?,
            None => 32,
        } as usize;
        let data_start = c.pos.div_ceil(alignment) * alignment;
        if data_start > map.len() && !infos.is_empty() {
            // Found by the fuzzer: zero-byte tensors of an unsupported type would otherwise
            // point past the end of the file.
            return Err(Error::checkpoint(
                path,
                format!(
                    "the tensor data would start at byte {data_start}, past the end of the {}-byte file",
                    map.len()
                ),
            ));
        }
        let data_len = (map.len().saturating_sub(data_start)) as u64;

        let mut tensors = BTreeMap::new();
        let mut spans: Vec<(u64, u64, String)> = Vec::with_capacity(infos.len());
        for (name, dims, ggml_type, offset) in infos {
            let elements = dims
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .filter(|&n| n > 0)
                .ok_or_else(|| {
                    Error::checkpoint(
                        path,
                        format!("tensor `{name}`: dims {dims:?} are empty or overflow"),
                    )
                })?;
            let size = ggml_type.byte_size(elements).ok_or_else(|| {
                Error::checkpoint(
                    path,
                    format!("tensor `{name}`: {elements} elements is not a whole number of {ggml_type:?} blocks"),
                )
            })?;
            if offset % alignment as u64 != 0 {
                return Err(Error::checkpoint(
                    path,
                    format!("tensor `{name}`: offset {offset} is not aligned to {alignment}"),
                ));
            }
            if offset.checked_add(size).is_none_or(|end| end > data_len) {
                return Err(Error::checkpoint(
                    path,
                    format!(
                        "tensor `{name}`: bytes {offset}..{} lie outside the {data_len}-byte data section",
                        offset.saturating_add(size)
                    ),
                ));
            }
            spans.push((offset, size, name.clone()));
            if tensors
                .insert(
                    name.clone(),
                    GgufTensorInfo {
                        dims,
                        ggml_type,
                        offset,
                        size,
                    },
                )
                .is_some()
            {
                return Err(Error::checkpoint(
                    path,
                    format!("tensor `{name}` appears twice"),
                ));
            }
        }
        spans.sort();
        for w in spans.windows(2) {
            if w[0].0 + w[0].1 > w[1].0 {
                return Err(Error::checkpoint(
                    path,
                    format!("tensors `{}` and `{}` overlap", w[0].2, w[1].2),
                ));
            }
        }
        Ok(GgufFile {
            path: path.to_path_buf(),
            version,
            metadata,
            tensors,
            bytes: Arc::new(map),
            data_start,
        })
    }

    /// A tensor's raw bytes (bounds were checked at open).
    pub fn tensor_bytes(&self, info: &GgufTensorInfo) -> &[u8] {
        let start = self.data_start + info.offset as usize;
        &self.bytes[start..start + info.size as usize]
    }

    /// A tensor's raw bytes as a range of the file's shared bytes, for a model that reads them in
    /// place for as long as it lives (the map, or the owned bytes, stay alive while it does).
    pub fn shared_tensor_bytes(&self, info: &GgufTensorInfo) -> BlockBytes {
        let start = self.data_start + info.offset as usize;
        let buffer: SharedBuffer = self.bytes.clone();
        BlockBytes::shared(buffer, start..start + info.size as usize)
            .expect("tensor bounds were checked at open")
    }

    /// `range` of a tensor's bytes (relative to its first), shared as
    /// [`GgufFile::shared_tensor_bytes`]: some of its rows. None past the tensor's end.
    pub fn shared_tensor_range(
        &self,
        info: &GgufTensorInfo,
        range: std::ops::Range<usize>,
    ) -> Option<BlockBytes> {
        if range.end > info.size as usize {
            return None;
        }
        let start = self.data_start + info.offset as usize;
        BlockBytes::shared(self.bytes.clone(), start + range.start..start + range.end)
    }

    /// Drops a mapped tensor's pages from this process after its values were read into a copy
    /// (a converted tensor): `madvise(DONTNEED)` on a read-only file mapping, which changes no
    /// byte (a later read faults the page in from the file again) but stops the pages counting
    /// in the process's resident size. Owned bytes, or a system without `madvise`: nothing to
    /// do.
    pub fn release(&self, info: &GgufTensorInfo) {
        #[cfg(unix)]
        if let FileBytes::Mapped(map) = self.bytes.as_ref() {
            let start = self.data_start + info.offset as usize;
            // SAFETY: the map is read-only and backed by the file; dropping its pages leaves
            // every byte as it was for any reference into it (they are read again from the file).
            // A failed advice changes nothing, so its error is ignored.
            let _ = unsafe {
                map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    start,
                    info.size as usize,
                )
            };
        }
        #[cfg(not(unix))]
        let _ = info;
    }

    /// A metadata value or a typed error naming the missing key.
    pub fn require(&self, key: &str) -> Result<&GgufValue> {
        self.metadata
            .get(key)
            .ok_or_else(|| Error::checkpoint(&self.path, format!("GGUF metadata has no `{key}`")))
    }

    /// A required unsigned integer.
    pub fn require_u64(&self, key: &str) -> Result<u64> {
        self.require(key)?.as_u64().ok_or_else(|| {
            Error::checkpoint(
                &self.path,
                format!("GGUF metadata `{key}` is not an unsigned integer"),
            )
        })
    }

    /// The tensor `name` dequantized to f32, row-major in PyTorch order.
    pub fn read_f32(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let info = self
            .tensors
            .get(name)
            .ok_or_else(|| Error::checkpoint(&self.path, format!("GGUF has no tensor `{name}`")))?;
        let values = info
            .ggml_type
            .dequantize(self.tensor_bytes(info), info.num_elements() as usize)
            .map_err(|m| Error::checkpoint(&self.path, format!("tensor `{name}`: {m}")))?;
        Ok((info.shape(), values))
    }
}
