//! Writing GGUF v3 files: the header, metadata key/values with the types llama.cpp checks
//! (`u32` counts, `f32` floats, `i32` token types), tensor infos, then the tensor data, each
//! tensor aligned to 32 bytes. The data is produced one tensor at a time by the caller, so a
//! model is never held whole; the file is written beside its name and renamed when complete.

use std::io::Write;
use std::path::Path;

use super::dequant::GgmlType;
use super::reader::GgufValue;
use crate::error::{Error, Result};
use crate::io::atomic::write_atomic_with;

/// The alignment of the data section and of every tensor in it (GGUF's default).
pub const ALIGNMENT: u64 = 32;

/// A metadata value as it is written (the type is part of the format).
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U32(u32),
    U64(u64),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    StrArray(Vec<String>),
    I32Array(Vec<i32>),
    F32Array(Vec<f32>),
}

impl MetaValue {
    /// The value read from a GGUF, in the type llama.cpp expects for it: integers that fit are
    /// `u32`/`i32`, floats `f32`, integer arrays `i32` (token types), float arrays `f32`.
    pub fn from_read(value: &GgufValue) -> Option<Self> {
        Some(match value {
            GgufValue::Uint(v) => match u32::try_from(*v) {
                Ok(v) => MetaValue::U32(v),
                Err(_) => MetaValue::U64(*v),
            },
            GgufValue::Int(v) => MetaValue::I32(i32::try_from(*v).ok()?),
            GgufValue::Float(v) => MetaValue::F32(*v as f32),
            GgufValue::Bool(b) => MetaValue::Bool(*b),
            GgufValue::String(s) => MetaValue::Str(s.clone()),
            GgufValue::Array(items) => match items.first() {
                None | Some(GgufValue::String(_)) => MetaValue::StrArray(
                    items
                        .iter()
                        .map(|v| v.as_str().map(str::to_string))
                        .collect::<Option<_>>()?,
                ),
                Some(GgufValue::Float(_)) => MetaValue::F32Array(
                    items
                        .iter()
                        .map(|v| v.as_f64().map(|f| f as f32))
                        .collect::<Option<_>>()?,
                ),
                Some(GgufValue::Uint(_) | GgufValue::Int(_)) => MetaValue::I32Array(
                    items
                        .iter()
                        .map(|v| match v {
                            GgufValue::Uint(u) => i32::try_from(*u).ok(),
                            GgufValue::Int(i) => i32::try_from(*i).ok(),
                            _ => None,
                        })
                        .collect::<Option<_>>()?,
                ),
                Some(_) => return None,
            },
        })
    }

    fn write(&self, out: &mut Vec<u8>) {
        const U32: u32 = 4;
        const I32: u32 = 5;
        const F32: u32 = 6;
        const BOOL: u32 = 7;
        const STRING: u32 = 8;
        const ARRAY: u32 = 9;
        const U64: u32 = 10;
        let array = |out: &mut Vec<u8>, kind: u32, len: usize| {
            out.extend(ARRAY.to_le_bytes());
            out.extend(kind.to_le_bytes());
            out.extend((len as u64).to_le_bytes());
        };
        match self {
            MetaValue::U32(v) => {
                out.extend(U32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            MetaValue::U64(v) => {
                out.extend(U64.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            MetaValue::I32(v) => {
                out.extend(I32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            MetaValue::F32(v) => {
                out.extend(F32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            MetaValue::Bool(b) => {
                out.extend(BOOL.to_le_bytes());
                out.push(u8::from(*b));
            }
            MetaValue::Str(s) => {
                out.extend(STRING.to_le_bytes());
                string(out, s);
            }
            MetaValue::StrArray(items) => {
                array(out, STRING, items.len());
                items.iter().for_each(|s| string(out, s));
            }
            MetaValue::I32Array(items) => {
                array(out, I32, items.len());
                items.iter().for_each(|v| out.extend(v.to_le_bytes()));
            }
            MetaValue::F32Array(items) => {
                array(out, F32, items.len());
                items.iter().for_each(|v| out.extend(v.to_le_bytes()));
            }
        }
    }
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// A tensor to write: its GGUF name, its row-major shape (`[rows, cols]`, as Hugging Face
/// writes it; GGUF stores the dimensions innermost first) and its storage type.
#[derive(Debug, Clone)]
pub struct TensorEntry {
    pub name: String,
    pub shape: Vec<usize>,
    pub ggml_type: GgmlType,
}

impl TensorEntry {
    fn bytes(&self) -> Result<u64> {
        let n = self.shape.iter().product::<usize>() as u64;
        self.ggml_type.byte_size(n).ok_or_else(|| {
            Error::Input(format!(
                "tensor `{}`: {n} values are not whole {:?} blocks",
                self.name, self.ggml_type
            ))
        })
    }
}

/// Writes a GGUF file: `metadata`, then each tensor of `tensors` as `data(entry)` returns its
/// bytes (checked against the size its type and shape give).
pub fn write_gguf(
    path: &Path,
    metadata: &[(String, MetaValue)],
    tensors: &[TensorEntry],
    mut data: impl FnMut(&TensorEntry) -> Result<Vec<u8>>,
) -> Result<()> {
    let mut header = Vec::new();
    header.extend(b"GGUF");
    header.extend(3u32.to_le_bytes());
    header.extend((tensors.len() as u64).to_le_bytes());
    header.extend((metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata {
        string(&mut header, key);
        value.write(&mut header);
    }
    let mut offset = 0u64;
    let mut sizes = Vec::with_capacity(tensors.len());
    for t in tensors {
        string(&mut header, &t.name);
        header.extend((t.shape.len() as u32).to_le_bytes());
        for &d in t.shape.iter().rev() {
            header.extend((d as u64).to_le_bytes());
        }
        let id = t.ggml_type.id().ok_or_else(|| {
            Error::Input(format!(
                "tensor `{}`: {:?} cannot be written",
                t.name, t.ggml_type
            ))
        })?;
        header.extend(id.to_le_bytes());
        header.extend(offset.to_le_bytes());
        let size = t.bytes()?;
        sizes.push(size);
        offset = (offset + size).next_multiple_of(ALIGNMENT);
    }
    header.resize(header.len().next_multiple_of(ALIGNMENT as usize), 0);

    write_atomic_with(path, |out, tmp| {
        let io = |e| Error::io(tmp, e);
        out.write_all(&header).map_err(io)?;
        for (t, &size) in tensors.iter().zip(&sizes) {
            let bytes = data(t)?;
            if bytes.len() as u64 != size {
                return Err(Error::Input(format!(
                    "tensor `{}`: {} bytes made, {size} expected",
                    t.name,
                    bytes.len()
                )));
            }
            out.write_all(&bytes).map_err(io)?;
            let padding = size.next_multiple_of(ALIGNMENT) - size;
            out.write_all(&vec![0u8; padding as usize]).map_err(io)?;
        }
        Ok(())
    })
}
