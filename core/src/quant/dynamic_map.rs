//! bitsandbytes' signed dynamic 8-bit map (`create_dynamic_map(signed=True)`), the code table
//! of double quantization and of 8-bit optimizer states.
//!
//! 256 sorted float32 values in [-0.99297, 1]: for each decade 10^(i−6), i = 0..6, the midpoints
//! of 2^i + 1 evenly spaced points in [0.1, 1], with both signs, plus 0 and 1. bitsandbytes
//! builds it with torch's vectorised float32 `linspace`, whose last-bit rounding depends on the
//! CPU kernel, so the table is a format constant here, stored as bit patterns (as bitsandbytes
//! 0.50 produced it) and checked against the fixture in the tests.

/// The raw float32 bit patterns, index = 8-bit code.
const DYNAMIC_MAP_SIGNED_BITS: [u32; 256] = [
    0xbf7e3333, 0xbf7a999a, 0xbf770000, 0xbf736666, 0xbf6fcccd, 0xbf6c3333, 0xbf68999a, 0xbf650000,
    0xbf616666, 0xbf5dcccd, 0xbf5a3333, 0xbf56999a, 0xbf530000, 0xbf4f6666, 0xbf4bcccd, 0xbf483333,
    0xbf44999a, 0xbf410000, 0xbf3d6666, 0xbf39cccd, 0xbf363334, 0xbf32999a, 0xbf2f0000, 0xbf2b6666,
    0xbf27cccd, 0xbf243334, 0xbf20999a, 0xbf1d0000, 0xbf196666, 0xbf15cccd, 0xbf123334, 0xbf0e999a,
    0xbf0b0000, 0xbf076666, 0xbf03cccc, 0xbf003333, 0xbef93332, 0xbef20000, 0xbeeacccc, 0xbee3999a,
    0xbedc6666, 0xbed53333, 0xbece0000, 0xbec6cccc, 0xbebf999a, 0xbeb86666, 0xbeb13333, 0xbeaa0000,
    0xbea2cccc, 0xbe9b999a, 0xbe946666, 0xbe8d3334, 0xbe860000, 0xbe7d9999, 0xbe6f3333, 0xbe60cccd,
    0xbe526666, 0xbe440000, 0xbe35999a, 0xbe273333, 0xbe18cccd, 0xbe0a6666, 0xbdf80000, 0xbddb3334,
    0xbdc9eb85, 0xbdc428f7, 0xbdbe6667, 0xbdb8a3d7, 0xbdb2e148, 0xbdad1eb8, 0xbda75c2a, 0xbda1999a,
    0xbd9bd70a, 0xbd96147b, 0xbd9051eb, 0xbd8a8f5d, 0xbd84cccd, 0xbd7e147b, 0xbd728f5d, 0xbd670a3d,
    0xbd5b851f, 0xbd500000, 0xbd447ae1, 0xbd38f5c3, 0xbd2d70a3, 0xbd21eb85, 0xbd166667, 0xbd0ae148,
    0xbcfeb852, 0xbce7ae15, 0xbcd0a3d7, 0xbcb9999a, 0xbca28f5d, 0xbc8b851f, 0xbc68f5c3, 0xbc3ae148,
    0xbc1f3b64, 0xbc160418, 0xbc0ccccd, 0xbc039581, 0xbbf4bc6a, 0xbbe24dd3, 0xbbcfdf3b, 0xbbbd70a4,
    0xbbab020d, 0xbb989374, 0xbb8624dd, 0xbb676c8a, 0xbb428f5c, 0xbb1db22d, 0xbaf1a9fc, 0xbaa7ef9d,
    0xba7765ff, 0xba59e83e, 0xba3c6a80, 0xba1eecc1, 0xba016f01, 0xb9c7e283, 0xb98ce705, 0xb923d70b,
    0xb8ba1f4b, 0xb88aefb3, 0xb8378034, 0xb7b24206, 0xb70205ff, 0xb65a1a94, 0xb513a3b7, 0x00000000,
    0x3513a3b7, 0x365a1a94, 0x370205ff, 0x37b24206, 0x38378034, 0x388aefb3, 0x38ba1f4b, 0x3923d70b,
    0x398ce705, 0x39c7e283, 0x3a016f01, 0x3a1eecc1, 0x3a3c6a80, 0x3a59e83e, 0x3a7765ff, 0x3aa7ef9d,
    0x3af1a9fc, 0x3b1db22d, 0x3b428f5c, 0x3b676c8a, 0x3b8624dd, 0x3b989374, 0x3bab020d, 0x3bbd70a4,
    0x3bcfdf3b, 0x3be24dd3, 0x3bf4bc6a, 0x3c039581, 0x3c0ccccd, 0x3c160418, 0x3c1f3b64, 0x3c3ae148,
    0x3c68f5c3, 0x3c8b851f, 0x3ca28f5d, 0x3cb9999a, 0x3cd0a3d7, 0x3ce7ae15, 0x3cfeb852, 0x3d0ae148,
    0x3d166667, 0x3d21eb85, 0x3d2d70a3, 0x3d38f5c3, 0x3d447ae1, 0x3d500000, 0x3d5b851f, 0x3d670a3d,
    0x3d728f5d, 0x3d7e147b, 0x3d84cccd, 0x3d8a8f5d, 0x3d9051eb, 0x3d96147b, 0x3d9bd70a, 0x3da1999a,
    0x3da75c2a, 0x3dad1eb8, 0x3db2e148, 0x3db8a3d7, 0x3dbe6667, 0x3dc428f7, 0x3dc9eb85, 0x3ddb3334,
    0x3df80000, 0x3e0a6666, 0x3e18cccd, 0x3e273333, 0x3e35999a, 0x3e440000, 0x3e526666, 0x3e60cccd,
    0x3e6f3333, 0x3e7d9999, 0x3e860000, 0x3e8d3334, 0x3e946666, 0x3e9b999a, 0x3ea2cccc, 0x3eaa0000,
    0x3eb13333, 0x3eb86666, 0x3ebf999a, 0x3ec6cccc, 0x3ece0000, 0x3ed53333, 0x3edc6666, 0x3ee3999a,
    0x3eeacccc, 0x3ef20000, 0x3ef93332, 0x3f003333, 0x3f03cccc, 0x3f076666, 0x3f0b0000, 0x3f0e999a,
    0x3f123334, 0x3f15cccd, 0x3f196666, 0x3f1d0000, 0x3f20999a, 0x3f243334, 0x3f27cccd, 0x3f2b6666,
    0x3f2f0000, 0x3f32999a, 0x3f363334, 0x3f39cccd, 0x3f3d6666, 0x3f410000, 0x3f44999a, 0x3f483333,
    0x3f4bcccd, 0x3f4f6666, 0x3f530000, 0x3f56999a, 0x3f5a3333, 0x3f5dcccd, 0x3f616666, 0x3f650000,
    0x3f68999a, 0x3f6c3333, 0x3f6fcccd, 0x3f736666, 0x3f770000, 0x3f7a999a, 0x3f7e3333, 0x3f800000,
];

/// The signed dynamic map as float32 values.
pub fn dynamic_map_signed() -> [f32; 256] {
    DYNAMIC_MAP_SIGNED_BITS.map(f32::from_bits)
}

/// bitsandbytes' unsigned dynamic map (`create_dynamic_map(signed=False)`), the code table of
/// an 8-bit optimizer's second moment, which is never negative: for each decade 10^(i−6),
/// i = 0..6, the midpoints of 2^(i+1) + 1 evenly spaced points in [0.1, 1], plus 0 and 1;
/// sorted. Twice the resolution of the signed map on [0, 1]. Computed here in f64 and rounded
/// once (bitsandbytes rounds through float32 `linspace`; the last bit may differ).
pub fn dynamic_map_unsigned() -> [f32; 256] {
    let mut values = vec![0.0f64, 1.0];
    for i in 0..7 {
        let points = (1usize << (i + 1)) + 1;
        let boundary = |k: usize| 0.1 + 0.9 * k as f64 / (points - 1) as f64;
        let decade = 10f64.powi(i - 6);
        values.extend((0..points - 1).map(|k| decade * (boundary(k) + boundary(k + 1)) / 2.0));
    }
    values.sort_by(f64::total_cmp);
    std::array::from_fn(|i| values[i] as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unsigned_map_covers_0_to_1_with_doubled_decades() {
        let map = dynamic_map_unsigned();
        assert!(map.windows(2).all(|w| w[0] < w[1]), "sorted and distinct");
        assert_eq!((map[0], map[255]), (0.0, 1.0));
        // Decade 10^0 holds 128 values in (0.1, 1); decade 10^-6 holds 2.
        assert_eq!(map.iter().filter(|&&v| v > 0.1 && v < 1.0).count(), 128);
        assert_eq!(map.iter().filter(|&&v| v > 0.0 && v < 1e-6).count(), 2);
    }

    /// The structure the table must have: sorted, one zero, one 1.0, ±symmetric apart from
    /// those, and each decade holding 2^i values of each sign.
    #[test]
    fn the_table_has_the_documented_structure() {
        let map = dynamic_map_signed();
        assert!(map.windows(2).all(|w| w[0] < w[1]), "sorted and distinct");
        assert_eq!(map[127], 0.0);
        assert_eq!(map[255], 1.0);
        for decade in 0..7 {
            let (lo, hi) = (10f32.powi(decade - 7), 10f32.powi(decade - 6));
            let count = map.iter().filter(|&&v| v > lo && v < hi).count();
            assert_eq!(count, 1 << decade, "positive values in decade {decade}");
            let neg = map.iter().filter(|&&v| -v > lo && -v < hi).count();
            assert_eq!(neg, 1 << decade, "negative values in decade {decade}");
        }
    }
}
