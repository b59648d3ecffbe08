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
