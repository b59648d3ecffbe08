//! ggml tensor types and their dequantization to f32, following llama.cpp's reference
//! (`ggml-quants.c`, `dequantize_row_*`). Supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0,
//! Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (so the common Q2_K, Q3_K_M, Q4_K_M, Q5_K_M, Q6_K and Q8_0
//! files load; checked against gguf-py's dequantizer by `tests/integration/gguf_files.rs`). Other
//! ggml types are recognised and refused with a message that lists these.

use half::{bf16, f16};

/// A ggml storage type, by its GGUF id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    /// 0: f32.
    F32,
    /// 1: f16.
    F16,
    /// 2: blocks of 32: f16 scale d, 16 bytes of 4-bit q; x = d·(q − 8).
    Q4_0,
    /// 3: blocks of 32: f16 d, f16 m, 16 bytes of 4-bit q; x = d·q + m.
    Q4_1,
    /// 6: blocks of 32: f16 d, 32 high bits, 16 bytes of low nibbles; x = d·(q − 16).
    Q5_0,
    /// 7: blocks of 32: f16 d, f16 m, 32 high bits, 16 bytes of low nibbles; x = d·q + m.
    Q5_1,
    /// 8: blocks of 32: f16 d, 32 × i8 q; x = d·q.
    Q8_0,
    /// 10: super-blocks of 256: 16 bytes of 4-bit (scale, min) pairs, 64 bytes of 2-bit q, f16 d,
    /// f16 dmin; x = d·scale·q − dmin·min.
    Q2K,
    /// 11: super-blocks of 256: 32 bytes of high-bit masks, 64 bytes of 2-bit q, 12 bytes of
    /// 6-bit scales, f16 d; x = d·(scale − 32)·(q − 4·[high bit unset]).
    Q3K,
    /// 12: super-blocks of 256: f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes of q.
    Q4K,
    /// 13: super-blocks of 256: as Q4_K, with 32 bytes of fifth bits before the nibbles.
    Q5K,
    /// 14: super-blocks of 256: 128 bytes low 4 bits, 64 bytes high 2 bits, 16 × i8 scales, f16 d.
    Q6K,
    /// 30: bfloat16.
    Bf16,
    /// A type napkin recognises but does not dequantize (Q8_1, Q8_K, the IQ types, ...).
    Unsupported(u32),
}

/// The message for unsupported types.
pub const SUPPORTED: &str =
    "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K";

impl GgmlType {
    /// The type of a GGUF id, `None` for ids no ggml version defines.
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            10 => GgmlType::Q2K,
            11 => GgmlType::Q3K,
            12 => GgmlType::Q4K,
            13 => GgmlType::Q5K,
            14 => GgmlType::Q6K,
            30 => GgmlType::Bf16,
            9 | 15..=29 | 31..=41 => GgmlType::Unsupported(id),
            _ => return None,
        })
    }

    /// The GGUF id of a type napkin reads (`None` for an unsupported one).
    pub fn id(self) -> Option<u32> {
        Some(match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q2K => 10,
            GgmlType::Q3K => 11,
            GgmlType::Q4K => 12,
            GgmlType::Q5K => 13,
            GgmlType::Q6K => 14,
            GgmlType::Bf16 => 30,
            GgmlType::Unsupported(_) => return None,
        })
    }

    /// (elements per block, bytes per block); `None` when unsupported.
    pub fn block(self) -> Option<(u64, u64)> {
        Some(match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::Bf16 => (1, 2),
            GgmlType::Q4_0 => (32, 18),
            GgmlType::Q4_1 => (32, 20),
            GgmlType::Q5_0 => (32, 22),
            GgmlType::Q5_1 => (32, 24),
            GgmlType::Q8_0 => (32, 34),
            GgmlType::Q2K => (256, 84),
            GgmlType::Q3K => (256, 110),
            GgmlType::Q4K => (256, 144),
            GgmlType::Q5K => (256, 176),
            GgmlType::Q6K => (256, 210),
            GgmlType::Unsupported(_) => return None,
        })
    }

    /// Bytes of `n` elements; `None` if `n` is not a whole number of blocks or overflows. For
    /// an unsupported type the size is unknown and reported as 0 (the tensor cannot be read).
    pub fn byte_size(self, n: u64) -> Option<u64> {
        match self.block() {
            Some((per, bytes)) if n.is_multiple_of(per) => (n / per).checked_mul(bytes),
            Some(_) => None,
            None => Some(0),
        }
    }

    /// Dequantizes `n` elements from `bytes`.
    pub fn dequantize(self, bytes: &[u8], n: usize) -> Result<Vec<f32>, String> {
        let Some((per, size)) = self.block() else {
            return Err(format!(
                "ggml type {self:?} is not supported; napkin reads {SUPPORTED}"
            ));
        };
        let (per, size) = (per as usize, size as usize);
        if !n.is_multiple_of(per) || bytes.len() != n / per * size {
            return Err(format!(
                "{} bytes for {n} elements of {self:?}",
                bytes.len()
            ));
        }
        let mut out = Vec::with_capacity(n);
        let h = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
        for block in bytes.chunks_exact(size) {
            match self {
                GgmlType::F32 => {
                    out.push(f32::from_le_bytes([block[0], block[1], block[2], block[3]]))
                }
                GgmlType::F16 => out.push(h(block, 0)),
                GgmlType::Bf16 => out.push(bf16::from_le_bytes([block[0], block[1]]).to_f32()),
                GgmlType::Q8_0 => {
                    let d = h(block, 0);
                    out.extend(block[2..34].iter().map(|&q| (q as i8) as f32 * d));
                }
                GgmlType::Q4_0 => {
                    let d = h(block, 0);
                    let qs = &block[2..18];
                    // Low nibbles are elements 0..16, high nibbles 16..32.
                    out.extend(qs.iter().map(|&q| ((q & 0x0f) as i32 - 8) as f32 * d));
                    out.extend(qs.iter().map(|&q| ((q >> 4) as i32 - 8) as f32 * d));
                }
                GgmlType::Q4_1 => {
                    let (d, m) = (h(block, 0), h(block, 2));
                    let qs = &block[4..20];
                    out.extend(qs.iter().map(|&q| (q & 0x0f) as f32 * d + m));
                    out.extend(qs.iter().map(|&q| (q >> 4) as f32 * d + m));
                }
                GgmlType::Q5_0 => {
                    let d = h(block, 0);
                    let high = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
                    out.extend(fifth_bit_values(&block[6..22], high).map(|q| (q - 16) as f32 * d));
                }
                GgmlType::Q5_1 => {
                    let (d, m) = (h(block, 0), h(block, 2));
                    let high = u32::from_le_bytes([block[4], block[5], block[6], block[7]]);
                    out.extend(fifth_bit_values(&block[8..24], high).map(|q| q as f32 * d + m));
                }
                GgmlType::Q2K => dequantize_q2_k(block, &mut out),
                GgmlType::Q3K => dequantize_q3_k(block, &mut out),
                GgmlType::Q4K => dequantize_q4_k(block, &mut out),
                GgmlType::Q5K => dequantize_q5_k(block, &mut out),
                GgmlType::Q6K => dequantize_q6_k(block, &mut out),
                GgmlType::Unsupported(_) => unreachable!("refused above"),
            }
        }
        Ok(out)
    }
}

/// The 32 five-bit values of a Q5_0/Q5_1 block: element j < 16 is the low nibble of `qs[j]`
/// with bit j of `high` on top; element j + 16 the high nibble with bit j + 16.
fn fifth_bit_values(qs: &[u8], high: u32) -> impl Iterator<Item = i32> + '_ {
    let low = qs
        .iter()
        .enumerate()
        .map(move |(j, &q)| ((q & 0x0f) as u32 | (((high >> j) & 1) << 4)) as i32);
    let upper = qs
        .iter()
        .enumerate()
        .map(move |(j, &q)| ((q >> 4) as u32 | (((high >> (j + 16)) & 1) << 4)) as i32);
    low.chain(upper)
}

/// The 16 signed 6-bit scales of a Q3_K super-block: the low 4 bits of each are packed two
/// to a byte in the first 8 bytes, the high 2 bits four to a byte in the last 4.
fn q3_k_scales(packed: &[u8]) -> [i32; 16] {
    let mut out = [0i32; 16];
    for (i, scale) in out.iter_mut().enumerate() {
        let low = if i < 8 {
            packed[i] & 0x0f
        } else {
            packed[i - 8] >> 4
        };
        let high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
        *scale = (low | (high << 4)) as i32 - 32;
    }
    out
}

fn dequantize_q2_k(block: &[u8], out: &mut Vec<f32>) {
    let scales = &block[0..16];
    let qs = &block[16..80];
    let d = f16::from_le_bytes([block[80], block[81]]).to_f32();
    let dmin = f16::from_le_bytes([block[82], block[83]]).to_f32();
    // Two halves of 128 values, each 32 bytes of q read four times (2 bits each); each read
    // is two groups of 16 with their own (scale, min) byte: scale low nibble, min high.
    let mut is = 0;
    for q in qs.chunks_exact(32) {
        for shift in [0, 2, 4, 6] {
            for part in [0..16, 16..32] {
                let sc = scales[is];
                is += 1;
                let (dl, ml) = (d * (sc & 0x0f) as f32, dmin * (sc >> 4) as f32);
                out.extend(part.map(|l| dl * ((q[l] >> shift) & 3) as f32 - ml));
            }
        }
    }
}

fn dequantize_q3_k(block: &[u8], out: &mut Vec<f32>) {
    let hmask = &block[0..32];
    let qs = &block[32..96];
    let scales = q3_k_scales(&block[96..108]);
    let d = f16::from_le_bytes([block[108], block[109]]).to_f32();
    // Two halves of 128 values, each 32 bytes of q read four times (2 bits each); the k-th
    // read of the whole super-block takes bit k of each hmask byte as its high bit.
    let mut is = 0;
    let mut bit = 0;
    for q in qs.chunks_exact(32) {
        for shift in [0, 2, 4, 6] {
            for part in [0..16, 16..32] {
                let dl = d * scales[is] as f32;
                is += 1;
                out.extend(part.map(|l| {
                    let low = ((q[l] >> shift) & 3) as i32;
                    let minus = if hmask[l] & (1 << bit) != 0 { 0 } else { 4 };
                    dl * (low - minus) as f32
                }));
            }
            bit += 1;
        }
    }
}

fn dequantize_q5_k(block: &[u8], out: &mut Vec<f32>) {
    let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
    let dmin = f16::from_le_bytes([block[2], block[3]]).to_f32();
    k_groups(
        d,
        dmin,
        &block[4..16],
        &block[48..176],
        Some(&block[16..48]),
        out,
    );
}

/// Q4_K and Q5_K's four groups of 64: 32 low nibbles with one (scale, min), 32 high nibbles
/// with the next. Q5_K adds a fifth bit (16) from `qh`: group g's low nibbles take bit 2g, its
/// high nibbles bit 2g + 1.
fn k_groups(d: f32, dmin: f32, scales: &[u8], qs: &[u8], qh: Option<&[u8]>, out: &mut Vec<f32>) {
    let fifth = |l: usize, bit: usize| match qh {
        Some(qh) if qh[l] & (1 << bit) != 0 => 16.0,
        _ => 0.0,
    };
    for (g, q) in qs.chunks_exact(32).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * g, scales);
        let (sc2, m2) = scale_min_k4(2 * g + 1, scales);
        let (d1, min1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, min2) = (d * sc2 as f32, dmin * m2 as f32);
        out.extend(
            q.iter()
                .enumerate()
                .map(|(l, &b)| d1 * ((b & 0x0f) as f32 + fifth(l, 2 * g)) - min1),
        );
        out.extend(
            q.iter()
                .enumerate()
                .map(|(l, &b)| d2 * ((b >> 4) as f32 + fifth(l, 2 * g + 1)) - min2),
        );
    }
}

/// The j-th 6-bit (scale, min) pair of a Q4_K super-block.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

fn dequantize_q4_k(block: &[u8], out: &mut Vec<f32>) {
    let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
    let dmin = f16::from_le_bytes([block[2], block[3]]).to_f32();
    k_groups(d, dmin, &block[4..16], &block[16..144], None, out);
}

fn dequantize_q6_k(block: &[u8], out: &mut Vec<f32>) {
    let ql_all = &block[0..128];
    let qh_all = &block[128..192];
    let sc_all = &block[192..208];
    let d = f16::from_le_bytes([block[208], block[209]]).to_f32();
    // Two halves of 128: each element is 4 low bits from ql and 2 high bits from qh, minus 32.
    for half in 0..2 {
        let (ql, qh, sc) = (
            &ql_all[64 * half..],
            &qh_all[32 * half..],
            &sc_all[8 * half..],
        );
        let mut y = [0.0f32; 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
        out.extend_from_slice(&y);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    #[test]
    fn q8_0_is_scale_times_signed_byte() {
        let mut block = h(0.5).to_vec();
        block.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let got = GgmlType::Q8_0.dequantize(&block, 32).unwrap();
        assert_eq!(got[0], -8.0); // -16 · 0.5
        assert_eq!(got[31], 7.5); // 15 · 0.5
    }

    #[test]
    fn q4_0_low_nibbles_first_then_high_minus_8() {
        let mut block = h(2.0).to_vec();
        block.extend([0x9Fu8; 16]); // low 0xF = 15 → (15−8)·2 = 14; high 0x9 = 9 → (9−8)·2 = 2
        let got = GgmlType::Q4_0.dequantize(&block, 32).unwrap();
        assert!(got[..16].iter().all(|&v| v == 14.0));
        assert!(got[16..].iter().all(|&v| v == 2.0));
    }

    #[test]
    fn q4_1_adds_the_block_minimum() {
        let mut block = h(0.25).to_vec();
        block.extend(h(-1.0));
        block.extend([0x40u8; 16]); // low 0 → −1.0; high 4 → 4·0.25 − 1 = 0
        let got = GgmlType::Q4_1.dequantize(&block, 32).unwrap();
        assert!(got[..16].iter().all(|&v| v == -1.0));
        assert!(got[16..].iter().all(|&v| v == 0.0));
    }

    #[test]
    fn q4_k_uses_six_bit_scales_and_mins() {
        let mut block = h(1.0).to_vec();
        block.extend(h(0.5)); // dmin
        // scales[0..4] = sc for sub-blocks 0..3 (low 6 bits), scales[4..8] = mins 0..3.
        let mut scales = [0u8; 12];
        scales[0] = 2; // sub-block 0: scale 2
        scales[4] = 3; // sub-block 0: min 3 → 1.5
        scales[1] = 1; // sub-block 1: scale 1, min 0
        // Sub-blocks 4..7: scale low 4 bits in scales[8..12], high 2 bits from scales[0..4] >> 6.
        scales[8] = 0x25; // sub-block 4: scale 5, min 2 → 1.0
        block.extend(scales);
        block.extend([0x73u8; 128]); // low nibble 3, high nibble 7
        let got = GgmlType::Q4K.dequantize(&block, 256).unwrap();
        assert_eq!(got[0], 2.0 * 3.0 - 1.5); // sub-block 0, low nibble
        assert_eq!(got[32], 7.0); // sub-block 1, high nibble, scale 1, min 0
        assert_eq!(got[128], 5.0 * 3.0 - 1.0); // sub-block 4 (third group, low nibbles)
    }

    #[test]
    fn q6_k_combines_four_low_and_two_high_bits() {
        let mut block = vec![0u8; 210];
        block[0] = 0x21; // ql[0]: low nibble 1 (element 0), high nibble 2 (element 64)
        block[128] = 0b0000_0010; // qh[0]: bits 0..2 = 2 → element 0 gets +32
        block[192] = 3; // scale of elements 0..16
        block[196] = 0xFE; // scale −2 for elements 64..80 (is + 4)
        block[208..210].copy_from_slice(&h(0.5));
        let got = GgmlType::Q6K.dequantize(&block, 256).unwrap();
        assert_eq!(got[0], 0.5 * 3.0 * (1 + 32 - 32) as f32); // q = 1 | 2<<4 = 33 → 1
        assert_eq!(got[64], 0.5 * -2.0 * (2 - 32) as f32);
    }

    #[test]
    fn ids_round_trip() {
        for id in 0..=41 {
            if let Some(t) = GgmlType::from_id(id)
                && t.id().is_some()
            {
                assert_eq!(t.id(), Some(id));
            }
        }
    }

    #[test]
    fn unsupported_types_name_the_supported_ones() {
        // 16: IQ2_XXS, recognised, not read.
        let err = GgmlType::from_id(16)
            .unwrap()
            .dequantize(&[], 0)
            .unwrap_err();
        assert!(err.contains("Q2_K") && err.contains("Q5_K"), "{err}");
        assert_eq!(GgmlType::from_id(9999), None);
    }

    #[test]
    fn wrong_byte_count_is_an_error() {
        assert!(GgmlType::Q8_0.dequantize(&[0u8; 33], 32).is_err());
        assert_eq!(GgmlType::Q8_0.byte_size(31), None);
    }
}
