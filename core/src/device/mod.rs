//! Choosing the burn device at run time: `cpu` (the default), `wgpu`, `cuda`, or one CPU
//! backend by name (`flex`, `ndarray`) for comparisons.
//!
//! `cpu` is burn NdArray + OpenBLAS when the `openblas` feature is compiled in (about three
//! times Flex's GEMM throughput here), else burn Flex (pure Rust, builds for wasm).
//! ARCHITECTURE.md records the measurements behind that choice.

pub mod link;
#[cfg(feature = "openblas")]
pub mod openblas;
mod out_of_memory;
mod pinning;

pub use out_of_memory::guard_device_memory;
pub use pinning::{PIN_THREADS_VAR, process_cpu_count, spawn_unpinned, with_process_cpus};

use burn::tensor::Device;

use crate::config::spellings;
use crate::error::{Error, Result};
use crate::predict::row_layout::RowLayout;

/// A backend the user can ask for with `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceKind {
    /// The fastest CPU backend compiled in.
    #[default]
    Cpu,
    /// burn Flex on the CPU (pure Rust).
    Flex,
    /// burn NdArray with the system OpenBLAS on the CPU.
    Ndarray,
    /// burn wgpu (Vulkan, Metal, DX12, WebGPU).
    Wgpu,
    /// burn CUDA.
    Cuda,
}

spellings! {
    DeviceKind, "device", "device", serde;
    Cpu => "cpu" []: "the fastest CPU backend compiled in",
    Flex => "flex" []: "burn Flex on the CPU (pure Rust)",
    Ndarray => "ndarray" ["openblas"]: "burn NdArray with the system OpenBLAS",
    Wgpu => "wgpu" ["gpu"]: "burn wgpu: Vulkan, Metal, DX12 (built with --features wgpu)",
    Cuda => "cuda" []: "burn CUDA (built with --features cuda)",
}

impl DeviceKind {
    /// Opens the device, or says which cargo feature to build with.
    pub fn open(self) -> Result<Device> {
        // Unused only in a build with every backend compiled in (CI's clippy).
        #[cfg_attr(
            all(
                feature = "flex",
                feature = "openblas",
                feature = "wgpu",
                feature = "cuda"
            ),
            allow(unused_variables)
        )]
        let missing = |feature: &str| Error::Device {
            name: self.to_string(),
            message: format!(
                "this build has no {self} backend; rebuild with `--features {feature}`"
            ),
        };
        match self {
            DeviceKind::Cpu => Ok(cpu()),
            #[cfg(feature = "flex")]
            DeviceKind::Flex => Ok(Device::flex()),
            #[cfg(not(feature = "flex"))]
            DeviceKind::Flex => Err(missing("flex")),
            #[cfg(feature = "openblas")]
            DeviceKind::Ndarray => Ok(ndarray()),
            #[cfg(not(feature = "openblas"))]
            DeviceKind::Ndarray => Err(missing("openblas")),
            #[cfg(feature = "wgpu")]
            DeviceKind::Wgpu => self.usable(Device::wgpu(Default::default())),
            #[cfg(not(feature = "wgpu"))]
            DeviceKind::Wgpu => Err(missing("wgpu")),
            #[cfg(feature = "cuda")]
            DeviceKind::Cuda => self.usable(Device::cuda(0)),
            #[cfg(not(feature = "cuda"))]
            DeviceKind::Cuda => Err(missing("cuda")),
        }
    }

    /// `device` once a first transfer to it and back has worked: a GPU backend opens its
    /// driver lazily and panics when there is none (no CUDA driver, no Vulkan/Metal adapter),
    /// so the first use is made here and its failure becomes an error naming the device.
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    fn usable(self, device: Device) -> Result<Device> {
        let probe = device.clone();
        let quiet = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        // The first use starts the device's queue thread: from a pinned compute thread it
        // would share that thread's one CPU (`pinning.rs`).
        let opened = pinning::with_process_cpus(|| {
            std::panic::catch_unwind(move || {
                burn::tensor::Tensor::<1>::zeros([1], &probe)
                    .into_data()
                    .num_elements()
            })
        });
        std::panic::set_hook(quiet);
        match opened {
            Ok(_) => Ok(device),
            Err(panic) => {
                let why = match out_of_memory::panic_text(panic.as_ref()) {
                    "" => "the backend panicked while opening it".to_string(),
                    text => text.to_string(),
                };
                Err(Error::Device {
                    name: self.to_string(),
                    message: format!(
                        "could not open the {} device: {} ({why})",
                        self,
                        match self {
                            DeviceKind::Cuda => {
                                "is an NVIDIA GPU present, with its driver (libcuda) and NVRTC \
                                 (libnvrtc) installed?"
                            }
                            _ => "is a GPU with a Vulkan, Metal or DX12 driver present?",
                        }
                    ),
                })
            }
        }
    }

    /// The concrete backend behind the device, for reports.
    pub fn backend_name(self) -> &'static str {
        match self {
            DeviceKind::Cpu => cpu_backend_name(),
            DeviceKind::Flex => "burn-flex (CPU)",
            DeviceKind::Ndarray => "burn-ndarray + OpenBLAS (CPU)",
            DeviceKind::Wgpu => "burn-wgpu",
            DeviceKind::Cuda => "burn-cuda",
        }
    }

    /// Whether the backend computes in bf16 / f16 (mixed precision). burn NdArray is f32 only.
    pub fn supports_half_precision(self) -> bool {
        match self {
            DeviceKind::Cpu => !cfg!(feature = "openblas"),
            DeviceKind::Ndarray => false,
            DeviceKind::Flex | DeviceKind::Wgpu | DeviceKind::Cuda => true,
        }
    }

    /// How the backend lays rows out, before it is opened ([`row_layout_on`] reads an open
    /// device).
    pub fn row_layout(self) -> RowLayout {
        match self {
            DeviceKind::Cuda => RowLayout::CUDA,
            _ => RowLayout::Contiguous,
        }
    }

    /// Whether the backend computes in host memory (nothing to offload to).
    pub fn is_cpu(self) -> bool {
        matches!(
            self,
            DeviceKind::Cpu | DeviceKind::Flex | DeviceKind::Ndarray
        )
    }

    /// Every CPU backend compiled into this build.
    pub fn cpu_backends() -> Vec<DeviceKind> {
        [DeviceKind::Ndarray, DeviceKind::Flex]
            .into_iter()
            .filter(|k| k.open().is_ok())
            .collect()
    }
}

/// Whether `device` is a GPU backend (burn's cubecl backend: wgpu, WebGPU, CUDA), whose
/// memory lies across a link from the host's.
pub fn is_gpu(device: &Device) -> bool {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        matches!(
            device.clone().without_autodiff().as_dispatch(),
            burn_dispatch::DispatchDevice::Cube(_)
        )
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = device;
        false
    }
}

/// The byte alignment of `device`'s memory offsets (cubecl's `memory.alignment`: on wgpu the
/// larger of the uniform and storage binding offset alignments): a slice of a buffer whose
/// ends lie at multiples of it is a view, elsewhere burn copies it. None on the CPU backends.
pub fn memory_alignment(device: &Device) -> Option<u64> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        if let burn_dispatch::DispatchDevice::Cube(cube) =
            device.clone().without_autodiff().as_dispatch()
        {
            return Some(cube.client().properties().memory.alignment);
        }
        None
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = device;
        None
    }
}

/// How `device` lays a tensor's rows out in its memory: pitched on the runtimes whose
/// allocator pads rows (CUDA, HIP: cubecl's `PitchedMemoryLayoutPolicy`, at the device's
/// memory alignment), contiguous everywhere else.
pub fn row_layout_on(device: &Device) -> RowLayout {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        if let burn_dispatch::DispatchDevice::Cube(cube) =
            device.clone().without_autodiff().as_dispatch()
            && matches!(
                cube.runtime(),
                cubecl::device::RuntimeId::Cuda | cubecl::device::RuntimeId::Hip
            )
        {
            return RowLayout::Pitched {
                alignment: cube.client().properties().memory.alignment,
            };
        }
        RowLayout::Contiguous
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = device;
        RowLayout::Contiguous
    }
}

/// The device memory a GPU backend says a workload may use (its driver's budget), in bytes;
/// `None` on the CPU backends and where the driver states no figure.
pub fn memory_capacity(device: &Device) -> Option<u64> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        match device.clone().without_autodiff().as_dispatch() {
            burn_dispatch::DispatchDevice::Cube(cube) => {
                cube.client().properties().memory.max_memory()
            }
            _ => None,
        }
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = device;
        None
    }
}

/// Stack of each compute thread: burn's autodiff walks deep graphs recursively in places, and
/// the whole command runs on these threads (the main thread's own stack is 8 MiB).
const COMPUTE_THREAD_STACK: usize = 64 << 20;

/// Runs `work` on rayon's pool, the threads that run burn's CPU ops and napkin's GEMMs
/// (`kernels/cpu/gemm.rs`), so that a command's own thread is one of them: on two cores that is
/// two busy threads, not the caller plus two pool workers spinning between GEMMs. Each pool
/// thread is pinned to a CPU of its own where that is possible (`pinning.rs`).
pub fn on_compute_threads<R: Send>(work: impl FnOnce() -> R + Send) -> R {
    let builder = rayon::ThreadPoolBuilder::new().stack_size(COMPUTE_THREAD_STACK);
    let builder = pinning::pin_each_thread(builder, pinning::global_pool_size());
    // Fails only when the global pool already exists (a second call): then use it as it is.
    let _ = builder.build_global();
    rayon::scope(|_| work())
}

/// How many threads compute burn's CPU ops and napkin's GEMMs: the size of rayon's pool
/// (inside [`on_compute_threads`], the global one). Not the CPU count a pinned thread sees.
pub fn compute_thread_count() -> usize {
    rayon::current_num_threads()
}

/// The default CPU device: NdArray + OpenBLAS when compiled in, else Flex.
pub fn cpu() -> Device {
    #[cfg(feature = "openblas")]
    {
        ndarray()
    }
    #[cfg(not(feature = "openblas"))]
    {
        Device::flex()
    }
}

fn cpu_backend_name() -> &'static str {
    if cfg!(feature = "openblas") {
        "burn-ndarray + OpenBLAS (CPU)"
    } else {
        "burn-flex (CPU)"
    }
}

/// burn marks NdArray deprecated in favour of Flex; we keep it deliberately for its BLAS GEMM
/// (see ARCHITECTURE.md), in this one place.
#[cfg(feature = "openblas")]
#[allow(deprecated)]
fn ndarray() -> Device {
    crate::device::openblas::use_one_thread_pool();
    Device::ndarray()
}

#[cfg(test)]
mod tests {
    use super::on_compute_threads;

    /// The work runs on one of the pool's threads, so the GEMMs it starts split between it and
    /// the other workers instead of waking all of them while the caller waits.
    #[test]
    fn commands_run_on_a_pool_thread() {
        assert_eq!(rayon::current_thread_index(), None);
        let index = on_compute_threads(rayon::current_thread_index);
        assert!(index.is_some(), "the work ran outside rayon's pool");
    }
}
