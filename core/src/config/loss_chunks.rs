//! How many logits rows a chunk of the chunked loss takes (`model/chunked_loss.rs`): the
//! trainer runs it, the predictor counts its chunks' bytes.

/// The f32 bytes of one chunk's logits that [`default_chunk_rows`] aims at.
pub const CHUNK_LOGITS_BYTES: usize = 16 << 20;

/// Rows per chunk for a vocabulary of `vocab` words: as many as keep a chunk's f32 logits
/// within [`CHUNK_LOGITS_BYTES`], at least 16.
pub fn default_chunk_rows(vocab: usize) -> usize {
    (CHUNK_LOGITS_BYTES / (4 * vocab.max(1))).max(16)
}
