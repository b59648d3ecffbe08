//! A GPU allocation that cannot be made is a typed error naming the device and the bytes, and
//! the device still works afterwards. lavapipe refuses a single buffer larger than its limit
//! (a 4 GiB f32 tensor) the way a real GPU refuses one larger than its free memory: by a panic
//! of burn's cubecl backend at the next read, which `guard_device_memory` turns into the error.

use burn::tensor::Tensor;
use napkin_core::device::guard_device_memory;
use napkin_core::error::Error;

use super::{ONE_AT_A_TIME, wgpu_device};

#[test]
fn an_allocation_the_gpu_refuses_is_a_typed_error_and_the_device_survives() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device();
    let elements = 1usize << 30; // 4 GiB of f32
    let refused = guard_device_memory("wgpu", "a test step", || {
        let huge = Tensor::<1>::ones([elements], &device);
        Ok(huge.sum().into_scalar::<f32>())
    });
    match refused {
        Err(Error::OutOfDeviceMemory {
            device: name,
            during,
            requested_bytes,
            cause,
        }) => {
            assert_eq!(name, "wgpu");
            assert_eq!(during, "a test step");
            assert_eq!(requested_bytes, Some(4 * elements as u64), "cause: {cause}");
            let message = Error::OutOfDeviceMemory {
                device: name,
                during,
                requested_bytes,
                cause,
            }
            .to_string();
            assert!(
                message.contains("4294967296 bytes (4096.0 MiB)"),
                "{message}"
            );
        }
        other => panic!("expected OutOfDeviceMemory, got {other:?}"),
    }
    // The same device keeps working: a small product round-trips.
    let a = Tensor::<2>::ones([64, 64], &device);
    let sum = a.clone().matmul(a).sum().into_scalar::<f32>();
    assert_eq!(sum, 64.0 * 64.0 * 64.0);
}
