//! Running out of GPU memory as an error, not a crash.
//!
//! burn's cubecl backends (wgpu, WebGPU, CUDA) report an allocation that does not fit by
//! panicking, and since their work is queued the panic surfaces where the allocation is made
//! or at the next read (the loss, a gradient norm). Work that may allocate on a GPU runs under
//! [`guard_device_memory`]: a panic whose text is cubecl's allocation failure becomes
//! [`Error::OutOfDeviceMemory`], naming the device and the bytes asked for; any other panic is
//! passed on unchanged (a bug stays a bug).

use std::panic::{AssertUnwindSafe, PanicHookInfo};
use std::sync::Arc;

use crate::error::{Error, Result};

/// cubecl's texts for an allocation the device cannot make, each followed by the bytes asked
/// for: `IoError::BufferTooBig` (larger than the device allows in one buffer) and
/// `IoError::OutOfMemory` (no device memory left); `LaunchError::OutOfMemory` names none.
const ALLOCATION_FAILURES: [(&str, Option<&str>); 3] = [
    ("can't allocate buffer of size", Some("size: ")),
    ("out of device memory allocating", Some("allocating ")),
    ("out-of-memory error happened", None),
];

/// Runs `work`, turning a GPU allocation failure inside it into
/// [`Error::OutOfDeviceMemory`] for `device` while doing `what` (e.g. "a training step").
/// On a CPU backend nothing panics this way, and the guard costs one hook swap.
pub fn guard_device_memory<T>(
    device: &str,
    what: &str,
    work: impl FnOnce() -> Result<T>,
) -> Result<T> {
    // The default hook would print the allocation failure's text and backtrace before it is
    // caught; it is kept quiet for those panics only, and restored afterwards.
    let previous: Arc<dyn Fn(&PanicHookInfo<'_>) + Send + Sync> =
        Arc::from(std::panic::take_hook());
    let delegate = Arc::clone(&previous);
    std::panic::set_hook(Box::new(move |info| {
        if allocation_failure(info.payload_as_str().unwrap_or_default()).is_none() {
            delegate(info);
        }
    }));
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(work));
    drop(std::panic::take_hook());
    std::panic::set_hook(Box::new(move |info| previous(info)));
    match outcome {
        Ok(result) => result,
        Err(payload) => {
            let text = panic_text(payload.as_ref());
            match allocation_failure(text) {
                Some(requested_bytes) => Err(Error::OutOfDeviceMemory {
                    device: device.to_string(),
                    during: what.to_string(),
                    requested_bytes,
                    cause: first_line_with_failure(text),
                }),
                None => std::panic::resume_unwind(payload),
            }
        }
    }
}

/// A panic's message (`panic!` with a literal or a formatted text), empty for any other payload.
pub(super) fn panic_text(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or_default()
}

/// `Some(bytes asked for, where the text names them)` when `text` is cubecl's allocation
/// failure.
fn allocation_failure(text: &str) -> Option<Option<u64>> {
    ALLOCATION_FAILURES
        .iter()
        .find_map(|(marker, before_size)| {
            let at = text.find(marker)?;
            let size = before_size.and_then(|before| {
                let rest = &text[at..];
                let digits = &rest[rest.find(before)? + before.len()..];
                let end = digits
                    .find(|c: char| !c.is_ascii_digit())
                    .unwrap_or(digits.len());
                digits[..end].parse().ok()
            });
            Some(size)
        })
}

/// The line of `text` that says what failed (cubecl's panics add a cause chain and a
/// backtrace).
fn first_line_with_failure(text: &str) -> String {
    text.lines()
        .find(|line| {
            ALLOCATION_FAILURES
                .iter()
                .any(|(marker, _)| line.contains(marker))
        })
        .unwrap_or(text)
        .trim()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cubecl_texts_are_read_with_their_bytes() {
        let too_big = "An IO error happened\nCaused by:\n  can't allocate buffer of size: \
                       4294967296\n<backtrace>";
        assert_eq!(allocation_failure(too_big), Some(Some(4_294_967_296)));
        assert_eq!(
            first_line_with_failure(too_big),
            "can't allocate buffer of size: 4294967296"
        );
        assert_eq!(
            allocation_failure("out of device memory allocating 1048576 bytes\n"),
            Some(Some(1_048_576))
        );
        assert_eq!(
            allocation_failure("An out-of-memory error happened during launch"),
            Some(None)
        );
        assert_eq!(
            allocation_failure("index out of bounds: the len is 3"),
            None
        );
    }

    #[test]
    fn an_allocation_panic_becomes_the_typed_error_and_others_pass_through() {
        let caught = guard_device_memory("wgpu", "a training step", || -> Result<()> {
            panic!("An IO error happened\nCaused by:\n  can't allocate buffer of size: 8192\n")
        });
        match caught {
            Err(Error::OutOfDeviceMemory {
                device,
                during,
                requested_bytes,
                ..
            }) => {
                assert_eq!(device, "wgpu");
                assert_eq!(during, "a training step");
                assert_eq!(requested_bytes, Some(8192));
            }
            other => panic!("expected OutOfDeviceMemory, got {other:?}"),
        }
        let bug = std::panic::catch_unwind(|| {
            guard_device_memory("wgpu", "a training step", || -> Result<()> {
                panic!("index out of bounds")
            })
        });
        assert!(
            bug.is_err(),
            "a panic that is not an allocation failure is passed on"
        );
        assert_eq!(guard_device_memory("cpu", "a step", || Ok(7)).ok(), Some(7));
    }
}
