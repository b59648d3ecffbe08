//! Optimizer offload (ZeRO-Offload on one device): the optimizer state and an f32 master copy
//! of every trainable parameter live in host memory; the device keeps the parameters the
//! forward and backward read, and no optimizer state.
//!
//! One optimizer step, per trainable parameter of `n` values:
//! gradient `[n]` device → host (4n bytes); the update rule runs on the host over the master
//! copy and the host-side state; the new values `[n]` host → device (4n bytes). The first step
//! also copies each parameter to the host once to start its master copy.
//!
//! On a CPU backend the "device" already is host memory: offload would only copy tensors from
//! one heap to another, so the trainer refuses it there (the predictor still shows it).
//!
//! The bytes are counted where the copies happen (`device::link`), not from the formula above.

use std::collections::HashMap;

use burn::module::ParamId;
use burn::tensor::{Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::device::link::{
    self,
    Direction::{ToDevice, ToHost},
    Traffic,
};

/// Bytes that crossed the host link, counted at each copy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkTraffic {
    /// Device → host: gradients (and the first step's parameter copies).
    pub to_host: u64,
    /// Host → device: updated parameters.
    pub to_device: u64,
}

/// The host half of an offloaded optimizer.
#[derive(Debug, Clone)]
pub struct HostOffload {
    host: Device,
    /// f32 master copy of each trainable parameter, `[numel]`, on the host.
    masters: HashMap<ParamId, Tensor<1>>,
    traffic: LinkTraffic,
}

fn bytes(t: &Tensor<1>) -> u64 {
    (t.dtype().size() * t.dims()[0]) as u64
}

impl HostOffload {
    /// Offload to `host` (a CPU device).
    pub fn new(host: Device) -> Self {
        HostOffload {
            host,
            masters: HashMap::new(),
            traffic: LinkTraffic::default(),
        }
    }

    /// The host device.
    pub fn host(&self) -> &Device {
        &self.host
    }

    /// Bytes of master copies held on the host.
    pub fn master_bytes(&self) -> u64 {
        self.masters.values().map(bytes).sum()
    }

    /// Every byte copied across the link since the optimizer was made.
    pub fn traffic(&self) -> LinkTraffic {
        self.traffic
    }

    /// Updates one parameter: `p` (the device's value) and `g` (its gradient), both `[numel]`
    /// on the device; `rule` maps (master, gradient) on the host to the new master. Returns
    /// the new value on `p`'s device.
    pub fn update(
        &mut self,
        id: ParamId,
        p: Tensor<1>,
        g: Tensor<1>,
        rule: impl FnOnce(Tensor<1>, Tensor<1>) -> Tensor<1>,
    ) -> Tensor<1> {
        let device = p.device();
        let master = match self.masters.remove(&id) {
            Some(master) => master,
            None => {
                let (master, bytes) = link::move_to(p, &self.host, ToHost, Traffic::Optimizer);
                self.traffic.to_host += bytes;
                master
            }
        };
        let (g, bytes) = link::move_to(g, &self.host, ToHost, Traffic::Optimizer);
        self.traffic.to_host += bytes;
        let updated = rule(master, g);
        let (on_device, bytes) =
            link::move_to(updated.clone(), &device, ToDevice, Traffic::Optimizer);
        self.traffic.to_device += bytes;
        self.masters.insert(id, updated);
        on_device
    }
}
