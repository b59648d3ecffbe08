//! An NF4-quantized `[out, in]` weight: packed codes and scales, never a float copy.
//!
//! The codes live in host memory (`quant::nf4::Nf4Tensor`: checkpoints, merging, the CPU
//! products) and, on a GPU device, also on the device (`kernels::gpu::resident_nf4`), uploaded once
//! when the weight is made or moved there. A product on the GPU dequantizes on the device from
//! the resident codes; nothing crosses the host link per product.

use std::sync::Arc;

use burn::module::Module;
use burn::tensor::{Device, FloatDType, Tensor, TensorData};

use crate::device::link::{self, Traffic};
use crate::kernels::gpu::resident_nf4::ResidentNf4;
use crate::quant::nf4::Nf4Tensor;

/// An NF4 weight: the host codes, and their copy on the model's GPU device when it has one.
#[derive(Module, Debug)]
pub struct Nf4Weight {
    /// The packed codes and scales, shared (not copied) with the backward step.
    #[module(skip)]
    pub quantized: Arc<Nf4Tensor>,
    /// The same codes and scales on a GPU device (`None` on the CPU backends).
    #[module(skip)]
    pub resident: Option<Arc<ResidentNf4>>,
}

impl Nf4Weight {
    /// A weight for a model on `device`: the codes are uploaded once when it is a GPU.
    pub fn new(quantized: Arc<Nf4Tensor>, device: &Device) -> Self {
        let resident = ResidentNf4::upload(&quantized, device).map(Arc::new);
        Nf4Weight {
            quantized,
            resident,
        }
    }

    /// The same codes placed for `device` (uploaded there when it is a GPU; kept as they are
    /// when they already live there).
    pub fn placed_on(&self, device: &Device) -> Self {
        let target = device.clone().without_autodiff();
        match &self.resident {
            Some(r) if r.device() == target => self.clone(),
            _ => Self::new(self.quantized.clone(), device),
        }
    }

    /// `[out, in]`.
    pub fn dims(&self) -> [usize; 2] {
        [self.quantized.shape[0], self.quantized.shape[1]]
    }

    /// The codes on `device`, when they live there.
    pub fn resident_on(&self, device: &Device) -> Option<&ResidentNf4> {
        let target = device.clone().without_autodiff();
        self.resident.as_deref().filter(|r| r.device() == target)
    }

    /// The dequantized `[out, in]` weight on `device` as a transient, in `dtype`: by a device
    /// kernel from the resident codes, else on the host and uploaded.
    pub fn dequantized(&self, device: &Device, dtype: FloatDType) -> Tensor<2> {
        match self.resident_on(device) {
            Some(resident) => resident.dequantize(dtype),
            None => {
                let w = host_dequantized(&self.quantized, device);
                if dtype == FloatDType::F32 {
                    w
                } else {
                    w.cast(dtype)
                }
            }
        }
    }
}

/// The weight dequantized on the host and uploaded to `device` (counted as weight traffic).
pub fn host_dequantized(weight: &Nf4Tensor, device: &Device) -> Tensor<2> {
    let shape = [weight.shape[0], weight.shape[1]];
    link::upload(
        TensorData::new(weight.dequantize(), shape),
        device,
        Traffic::Weights,
    )
}
