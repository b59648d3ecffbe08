//! Generation's key/value cache on the GPU (`model/kv_cache.rs`): the new keys and values are
//! written into the cache's buffers in place, and what the attention reads back is every token
//! appended so far, in order — through two growths of the buffers, for head sizes whose views
//! are offsets into the buffer (64) and ones burn copies (16), and for two batch rows. A view
//! held across an append keeps the values it had (burn copies a shared buffer before writing).

use burn::tensor::{Distribution, Tensor};
use napkin_core::kernels::values::to_f32_vec;
use napkin_core::model::kv_cache::{FIRST_CAPACITY, LayerKvCache};

use super::{ONE_AT_A_TIME, wgpu_device};

/// Row-major `[B, Hkv, S, Dh]` from the chunks `[B, Hkv, T_i, Dh]` joined along S.
fn joined(chunks: &[Vec<f32>], lens: &[usize], b: usize, heads: usize, dh: usize) -> Vec<f32> {
    let mut out = Vec::new();
    for row in 0..b * heads {
        for (chunk, &t) in chunks.iter().zip(lens) {
            out.extend_from_slice(&chunk[row * t * dh..(row + 1) * t * dh]);
        }
    }
    out
}

#[test]
fn the_cache_on_the_device_reads_back_every_appended_token_in_order() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device();
    // A prompt, single tokens past the first capacity, a burst past the second.
    let mut lens = vec![5];
    lens.extend(std::iter::repeat_n(1, FIRST_CAPACITY));
    lens.push(2 * FIRST_CAPACITY);
    for (b, heads, dh) in [(1, 3, 64), (2, 2, 16)] {
        let mut cache = LayerKvCache::default();
        let (mut keys_seen, mut values_seen) = (Vec::new(), Vec::new());
        let mut capacities = Vec::new();
        let mut held = None;
        for (i, &t) in lens.iter().enumerate() {
            let k = Tensor::<4>::random([b, heads, t, dh], Distribution::Normal(0.0, 1.0), &device);
            let v = Tensor::<4>::random([b, heads, t, dh], Distribution::Normal(0.0, 1.0), &device);
            keys_seen.push(to_f32_vec(k.clone()));
            values_seen.push(to_f32_vec(v.clone()));
            let (keys, values) = cache.append(k, v);
            let so_far = &lens[..=i];
            assert_eq!(keys.dims(), [b, heads, so_far.iter().sum(), dh]);
            // Every few steps (reading back every one would dominate the test's time).
            if i % 16 == 0
                || i + 1 == lens.len()
                || cache.capacity() != *capacities.last().unwrap_or(&0)
            {
                assert_eq!(
                    to_f32_vec(keys.clone()),
                    joined(&keys_seen, so_far, b, heads, dh)
                );
                assert_eq!(
                    to_f32_vec(values),
                    joined(&values_seen, so_far, b, heads, dh)
                );
            }
            // A view held over the next append (the prompt's) keeps its values.
            if i == 0 {
                held = Some(keys);
            }
            capacities.push(cache.capacity());
        }
        let held = held.expect("the prompt's view");
        assert_eq!(
            to_f32_vec(held),
            keys_seen[0],
            "b {b}, Dh {dh}: a held view changed"
        );
        let total: usize = lens.iter().sum();
        assert_eq!(cache.len(), total);
        // 5 + 128 single tokens = 133 > 128: one growth to 256; + 256 = 389: to 512.
        assert_eq!(capacities.first(), Some(&FIRST_CAPACITY));
        assert_eq!(
            capacities.iter().filter(|&&c| c == FIRST_CAPACITY).count(),
            124
        );
        assert_eq!(cache.capacity(), total.next_power_of_two());
    }
}
