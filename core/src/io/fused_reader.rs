//! Reading the model's weights by their Hugging Face names from a checkpoint that may store
//! some of them fused (Phi-3's `qkv_proj` and `gate_up_proj`, `config/fused.rs`): a part is
//! the rows of its fused tensor, read once for all its parts.
//!
//! Under NF4 the fused tensor is quantized as one, as bitsandbytes quantizes Phi-3's
//! `qkv_proj`, and each part keeps its blocks: the same codes, block scales and double
//! quantization offset (`Nf4Tensor::quantize_parts`). That needs each part to be whole
//! second-level groups (256 blocks of 64 under double quantization, as in Phi-3-mini); a part
//! that is not is quantized alone, so its double quantization's offset is its own mean rather
//! than the fused tensor's.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use burn::tensor::{Device, Tensor, TensorData};

use crate::config::{LlamaConfig, Nf4Config, StoredRows};
use crate::error::{Error, Result};
use crate::model::linear::Linear;
use crate::quant::nf4::Nf4Tensor;

/// Reads the model's weights through `read` (a stored tensor's name and shape → its values).
pub struct FusedReader<'a, F> {
    config: &'a LlamaConfig,
    read: F,
    /// The fused tensor read last, for its other parts.
    last: RefCell<Option<(String, Rc<Vec<f32>>)>>,
    /// Under NF4, the fused tensor quantized last and its parts.
    last_nf4: RefCell<Option<QuantizedParts>>,
}

/// A fused tensor's name and its quantized parts, each by its first row.
type QuantizedParts = (String, Vec<(usize, Nf4Tensor)>);

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

    /// The block linear `name` of `[rows, cols]` on `device`: dense, or with `nf4` quantized
    /// (a fused part keeps its blocks of the fused tensor's quantization).
    pub fn linear(
        &self,
        name: &str,
        shape: [usize; 2],
        nf4: Option<&Nf4Config>,
        device: &Device,
    ) -> Result<Linear> {
        match nf4 {
            Some(nf4) => {
                let quantized = self
                    .read_nf4(name, shape, nf4)
                    .map_err(|e| Error::Input(format!("{name}: {e}")))?;
                Ok(Linear::nf4(Arc::new(quantized), device))
            }
            None => {
                let values = self.read(name, &shape)?;
                let weight = Tensor::from_data(TensorData::new(values, shape), device);
                Ok(Linear::from_weight(weight))
            }
        }
    }

    /// The HF weight `name` of `[rows, cols]` in NF4: a fused part is its rows of the fused
    /// tensor's quantization, else the weight is quantized alone.
    pub fn read_nf4(&self, name: &str, shape: [usize; 2], nf4: &Nf4Config) -> Result<Nf4Tensor> {
        let [_, cols] = shape;
        let Some(rows) = self.config.stored_rows(name) else {
            return Nf4Tensor::quantize(&(self.read)(name, &shape)?, &shape, nf4);
        };
        let mut cached = self.last_nf4.borrow_mut();
        if cached
            .as_ref()
            .is_none_or(|(tensor, _)| *tensor != rows.tensor)
        {
            // The fused tensor's values are needed only for its quantization: not kept.
            let values = (self.read)(&rows.tensor, &[rows.total, cols])?;
            let parts = self.config.stored_parts(&rows.tensor);
            let part_rows: Vec<usize> = parts
                .iter()
                .filter_map(|part| self.config.stored_rows(part))
                .map(|part| part.rows)
                .collect();
            let quantized = Nf4Tensor::quantize_parts(&values, &part_rows, cols, nf4)?;
            let mut start = 0;
            let by_start = part_rows
                .iter()
                .zip(quantized)
                .map(|(&n, q)| {
                    start += n;
                    (start - n, q)
                })
                .collect();
            *cached = Some((rows.tensor.clone(), by_start));
        }
        cached
            .as_ref()
            .and_then(|(_, parts)| parts.iter().find(|(start, _)| *start == rows.start))
            .map(|(_, q)| q.clone())
            .ok_or_else(|| {
                Error::Internal(format!("no rows of `{}` at {}", rows.tensor, rows.start))
            })
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
