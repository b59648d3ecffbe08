//! Where a [`QuantizedMatrix`](super::QuantizedMatrix) reads its blocks: bytes of its own, or a
//! range of a buffer that several matrices share — a memory-mapped GGUF file, read in place, so
//! that a loaded model holds no copy of its weights (the file's pages become resident as the
//! products read them, and the kernel may drop them again under memory pressure, as with
//! llama.cpp's mapped models).

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

/// A buffer that can be shared between matrices and threads.
pub type SharedBuffer = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// A matrix's bytes: a range of a shared buffer (cloning is a reference count).
#[derive(Clone)]
pub struct BlockBytes {
    buffer: SharedBuffer,
    start: usize,
    len: usize,
}

impl BlockBytes {
    /// `range` of `buffer`; `None` when the range does not lie inside it.
    pub fn shared(buffer: SharedBuffer, range: Range<usize>) -> Option<Self> {
        let whole = (*buffer).as_ref().len();
        if range.start > range.end || range.end > whole {
            return None;
        }
        Some(BlockBytes {
            buffer,
            start: range.start,
            len: range.len(),
        })
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &(*self.buffer).as_ref()[self.start..self.start + self.len]
    }

    /// How many bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl From<Vec<u8>> for BlockBytes {
    fn from(bytes: Vec<u8>) -> Self {
        let len = bytes.len();
        BlockBytes {
            buffer: Arc::new(bytes),
            start: 0,
            len,
        }
    }
}

/// f32 values held as their little-endian bytes without a copy (on a big-endian machine each
/// value's bytes are swapped once, in place).
struct LittleEndianF32(Vec<f32>);

impl AsRef<[u8]> for LittleEndianF32 {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the slice covers exactly the vector's initialized values; any f32's four
        // bytes are valid u8s, and u8 needs no alignment.
        unsafe {
            std::slice::from_raw_parts(
                self.0.as_ptr().cast::<u8>(),
                std::mem::size_of_val(self.0.as_slice()),
            )
        }
    }
}

impl From<Vec<f32>> for BlockBytes {
    /// The values' little-endian bytes, in the vector's own memory.
    fn from(mut values: Vec<f32>) -> Self {
        if cfg!(target_endian = "big") {
            for v in &mut values {
                *v = f32::from_bits(v.to_bits().swap_bytes());
            }
        }
        let len = std::mem::size_of_val(values.as_slice());
        BlockBytes {
            buffer: Arc::new(LittleEndianF32(values)),
            start: 0,
            len,
        }
    }
}

impl fmt::Debug for BlockBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "BlockBytes({} bytes at {} of a {}-byte buffer)",
            self.len,
            self.start,
            (*self.buffer).as_ref().len()
        )
    }
}
