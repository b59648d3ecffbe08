//! The key/value cache of generation: every seen token's keys and values, one layer at a time.
//!
//! Each layer holds its keys and values in buffers with room to spare, and a new token's are
//! written into them in place (one slice-assign each) rather than concatenated with the whole
//! cache into a new tensor every token: on a GPU that is one launch instead of two per tensor,
//! and no copy of the cache per token. A full buffer is grown by doubling, so a sequence of S
//! tokens copies its cache about log2(S / first capacity) times in all.
//!
//! The attention reads a view of the written part. The buffers are written in place only
//! while the cache holds them alone: callers drop the views of one step before the next
//! append (burn copies a shared buffer before writing into it, so holding a view is never
//! wrong, only slower).
//!
//! # Shapes
//! - keys, values: `[B, Hkv, capacity, Dh]`, positions `0..len` written (keys after RoPE)

use burn::tensor::Tensor;

/// Tokens a layer's buffers have room for when first written, unless more arrive at once.
pub const FIRST_CAPACITY: usize = 128;

/// The keys and values of one layer for every token seen so far (generation).
#[derive(Debug, Clone, Default)]
pub struct LayerKvCache {
    /// `[B, Hkv, capacity, Dh]` keys after RoPE; positions `len..` not yet written.
    keys: Option<Tensor<4>>,
    /// `[B, Hkv, capacity, Dh]` values.
    values: Option<Tensor<4>>,
    /// Tokens written.
    len: usize,
}

impl LayerKvCache {
    /// Writes the new keys and values after the cached ones and returns views of all of them.
    /// Drop the views before the next call (see the module's note).
    ///
    /// # Shapes
    /// - `k`, `v`: `[B, Hkv, T, Dh]` → two `[B, Hkv, len + T, Dh]`
    pub fn append(&mut self, k: Tensor<4>, v: Tensor<4>) -> (Tensor<4>, Tensor<4>) {
        let start = self.len;
        let end = start + k.dims()[2];
        let keys = write_after(self.keys.take(), k, start);
        let values = write_after(self.values.take(), v, start);
        self.keys = Some(keys.clone());
        self.values = Some(values.clone());
        self.len = end;
        (keys.narrow(2, 0, end), values.narrow(2, 0, end))
    }

    /// Cached tokens.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Tokens the buffers hold room for before they grow (0 before the first append).
    pub fn capacity(&self) -> usize {
        self.keys.as_ref().map_or(0, |k| k.dims()[2])
    }
}

/// `buffer` with `new` written at positions `start..start + T` of its sequence axis, grown
/// first (to a power of two, at least [`FIRST_CAPACITY`]) when it has no room; the first
/// `start` positions are kept.
///
/// # Shapes
/// - `buffer`: `[B, Hkv, capacity, Dh]`, `new`: `[B, Hkv, T, Dh]` → `[B, Hkv, capacity', Dh]`
fn write_after(buffer: Option<Tensor<4>>, new: Tensor<4>, start: usize) -> Tensor<4> {
    let [b, heads, t, dh] = new.dims();
    let end = start + t;
    let buffer = match buffer {
        Some(buffer) if buffer.dims()[2] >= end => buffer,
        old => {
            let capacity = end.next_power_of_two().max(FIRST_CAPACITY);
            let grown = Tensor::<4>::empty([b, heads, capacity, dh], (&new.device(), new.dtype()));
            match old {
                Some(old) if start > 0 => {
                    grown.slice_assign([0..b, 0..heads, 0..start, 0..dh], old.narrow(2, 0, start))
                }
                _ => grown,
            }
        }
    };
    buffer.slice_assign([0..b, 0..heads, start..end, 0..dh], new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, Distribution, Tensor};

    /// Appending chunks (one token, a few, a whole prompt; across two growths) gives what
    /// concatenating them gives, and the buffers grow only when full.
    #[test]
    fn appends_equal_concatenation_across_growths() {
        let device = Device::flex();
        let mut cache = LayerKvCache::default();
        let (mut all_k, mut all_v): (Vec<Tensor<4>>, Vec<Tensor<4>>) = (vec![], vec![]);
        let mut capacities = vec![];
        for t in [5, 1, 1, 3, 120, 1, 140, 2] {
            let k = Tensor::<4>::random([2, 3, t, 8], Distribution::Normal(0.0, 1.0), &device);
            let v = Tensor::<4>::random([2, 3, t, 8], Distribution::Normal(0.0, 1.0), &device);
            all_k.push(k.clone());
            all_v.push(v.clone());
            let (keys, values) = cache.append(k, v);
            let want_k = Tensor::cat(all_k.clone(), 2);
            let want_v = Tensor::cat(all_v.clone(), 2);
            assert_eq!(keys.dims(), want_k.dims());
            assert_eq!(keys.into_data(), want_k.into_data());
            assert_eq!(values.into_data(), want_v.into_data());
            capacities.push(cache.capacity());
        }
        assert_eq!(cache.len(), 273);
        // The fifth chunk (130 tokens in all) grows the buffers to 256, the seventh (271) to 512.
        assert_eq!(capacities, [128, 128, 128, 128, 256, 256, 512, 512]);
    }
}
