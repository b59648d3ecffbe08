//! Choosing the burn device at run time: `cpu` (the default), `wgpu`, `cuda`.
//!
//! The CPU backend is burn's Flex (pure Rust, multi-threaded GEMM, builds for wasm);
//! ARCHITECTURE.md records the measurements behind that choice.

use std::fmt;
use std::str::FromStr;

use burn::tensor::Device;

use crate::error::{Error, Result};

/// A backend the user can ask for with `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceKind {
    /// burn Flex on the CPU.
    #[default]
    Cpu,
    /// burn wgpu (Vulkan, Metal, DX12, WebGPU).
    Wgpu,
    /// burn CUDA.
    Cuda,
}

impl FromStr for DeviceKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "cpu" => Ok(DeviceKind::Cpu),
            "wgpu" | "gpu" => Ok(DeviceKind::Wgpu),
            "cuda" => Ok(DeviceKind::Cuda),
            other => Err(Error::Device {
                name: other.to_string(),
                message: "expected one of cpu, wgpu, cuda".into(),
            }),
        }
    }
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Wgpu => "wgpu",
            DeviceKind::Cuda => "cuda",
        })
    }
}

impl DeviceKind {
    /// Opens the device, or says which cargo feature to build with.
    pub fn open(self) -> Result<Device> {
        let missing = |feature: &str| Error::Device {
            name: self.to_string(),
            message: format!(
                "this build has no {self} backend; rebuild with `--features {feature}`"
            ),
        };
        match self {
            DeviceKind::Cpu => Ok(cpu()),
            #[cfg(feature = "wgpu")]
            DeviceKind::Wgpu => Ok(Device::wgpu(Default::default())),
            #[cfg(not(feature = "wgpu"))]
            DeviceKind::Wgpu => Err(missing("wgpu")),
            #[cfg(feature = "cuda")]
            DeviceKind::Cuda => Ok(Device::cuda(0)),
            #[cfg(not(feature = "cuda"))]
            DeviceKind::Cuda => Err(missing("cuda")),
        }
    }

    /// Short description of the backend behind the device, for reports.
    pub fn backend_name(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "burn-flex (CPU)",
            DeviceKind::Wgpu => "burn-wgpu",
            DeviceKind::Cuda => "burn-cuda",
        }
    }
}

/// The default CPU device.
pub fn cpu() -> Device {
    Device::flex()
}
