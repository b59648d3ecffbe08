//! Reading the model's weights by their Hugging Face names from a checkpoint that may store
//! some of them fused (Phi-3's `qkv_proj` and `gate_up_proj`, `config/fused.rs`): a part is
//! the rows of its fused tensor, read once for all its parts.
//!
//! Under NF4 the fused tensor is quantized as one, as bitsandbytes quantizes Phi-3's
//! `qkv_proj`, and each part keeps its blocks: the same codes, block scales and double
//! quantization offset. That needs each part to be whole second-level groups (256 blocks of
//! 64 under double quantization, as in Phi-3-mini); a part that is not is quantized alone, so
//! its double quantization's offset is its own mean rather than the fused tensor's.

use std::cell::RefCell;
use std::rc::Rc;

use crate::config::{LlamaConfig, Nf4Config, StoredRows};
use crate::error::Result;
use crate::quant::nf4::Nf4Tensor;

/// Reads the model's weights through `read` (a stored tensor's name and shape → its values).
pub struct FusedReader<'a, F> {
    config: &'a LlamaConfig,
    read: F,
    /// The fused tensor read last, for its other parts.
    last: RefCell<Option<(String, Rc<Vec<f32>>)>>,
    /// Its quantization, when asked for under NF4.
    last_nf4: RefCell<Option<(String, Rc<Nf4Tensor>)>>,
}

impl<'a, F: Fn(&str, &[usize]) -> Result<Vec<f32>>> FusedReader<'a, F> {
    /// A reader of `config`'s weights from the stored tensors `read` returns.
    pub fn new(config: &'a LlamaConfig, read: F) -> Self {
        FusedReader {
            config,
            read,
            last: RefCell::new(None),
            last_nf4: RefCell::new(None),
        }
    }

    /// The values of the HF tensor `name` of `shape`: stored as is, or rows of a fused one.
    pub fn read(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let Some(rows) = self.config.stored_rows(name) else {
            return (self.read)(name, shape);
        };
        let cols = shape[1];
        let fused = self.fused(&rows, cols)?;
        Ok(fused[rows.start * cols..(rows.start + rows.rows) * cols].to_vec())
    }

    /// The HF weight `name` of `[rows, cols]` in NF4: a fused part keeps its blocks of the
    /// fused tensor's quantization when it is whole groups of them, else is quantized alone.
    pub fn read_nf4(&self, name: &str, shape: [usize; 2], nf4: &Nf4Config) -> Result<Nf4Tensor> {
        let [_, cols] = shape;
        if let Some(rows) = self.config.stored_rows(name) {
            let cached = self
                .last_nf4
                .borrow()
                .as_ref()
                .filter(|(tensor, _)| *tensor == rows.tensor)
                .map(|(_, q)| q.clone());
            let whole = match cached {
                Some(q) => q,
                None => {
                    let values = self.fused(&rows, cols)?;
                    let q = Rc::new(Nf4Tensor::quantize(&values, &[rows.total, cols], nf4)?);
                    *self.last_nf4.borrow_mut() = Some((rows.tensor.clone(), q.clone()));
                    q
                }
            };
            if let Some(part) = whole.rows(rows.start, rows.rows) {
                return Ok(part);
            }
        }
        Nf4Tensor::quantize(&self.read(name, &shape)?, &shape, nf4)
    }

    fn fused(&self, rows: &StoredRows, cols: usize) -> Result<Rc<Vec<f32>>> {
        if let Some((tensor, values)) = self.last.borrow().as_ref()
            && *tensor == rows.tensor
        {
            return Ok(values.clone());
        }
        let values = Rc::new((self.read)(&rows.tensor, &[rows.total, cols])?);
        *self.last.borrow_mut() = Some((rows.tensor.clone(), values.clone()));
        Ok(values)
    }
}
