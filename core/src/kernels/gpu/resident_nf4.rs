//! An NF4 tensor resident on a GPU: its packed codes and scales uploaded once, as integer and
//! float tensors on the device, and dequantized there by `nf4_dequantize.rs` for each product.
//!
//! Device bytes, against the host format (`quant::nf4`): the codes are the same n/2 bytes
//! (rounded up to a u32 word); the scales are the same f32 absmax, or under double quantization
//! the same one byte per block plus one f32 per 256 blocks. The tables (the 16 NF4 values and
//! the 256 of the signed dynamic map, 1,088 bytes) are uploaded once per device and shared.

use std::sync::Mutex;

use burn::tensor::{Device, FloatDType, Int, Tensor, TensorData};

use crate::device::link::{self, Traffic};
use crate::quant::dynamic_map::dynamic_map_signed;
use crate::quant::nf4::{NF4_CODEBOOK, Nf4Scales, Nf4Tensor};

/// The scales of a resident NF4 tensor.
#[derive(Debug, Clone)]
// Read by the kernel's launch only, which CPU-only builds do not compile.
#[cfg_attr(not(any(feature = "wgpu", feature = "cuda")), allow(dead_code))]
// Two tensors by value (a burn tensor is 256 bytes) against one: one per NF4 weight, not worth
// a box.
#[allow(clippy::large_enum_variant)]
enum ResidentScales {
    /// `[num_blocks]` f32.
    Plain(Tensor<1>),
    /// `[ceil(num_blocks / 4)]` u32 codes, `[ceil(num_blocks / 256)]` f32 scales, the offset.
    Double {
        qwords: Tensor<1, Int>,
        absmax2: Tensor<1>,
        offset: f32,
    },
}

/// A LoRA adapter's path that [`ResidentNf4::rows_times_transposed`] adds to its product:
/// `scaling · down · Bᵀ`.
#[derive(Debug, Clone)]
pub struct LoraPath {
    /// `x · Aᵀ`, `[rows, r]`.
    pub down: Tensor<2>,
    /// B, `[out, r]`.
    pub lora_b: Tensor<2>,
    /// s (α/r or α/√r).
    pub scaling: f64,
}

/// Codes and scales of one `[out, in]` NF4 weight on a GPU device.
#[derive(Debug, Clone)]
#[cfg_attr(not(any(feature = "wgpu", feature = "cuda")), allow(dead_code))]
pub struct ResidentNf4 {
    /// `[out, in]`.
    shape: [usize; 2],
    block_size: usize,
    /// `[ceil(n / 8)]` u32: the packed codes, four bytes a word, little endian.
    words: Tensor<1, Int>,
    scales: ResidentScales,
    /// `[16 + 256]` f32, shared by every weight on the device.
    tables: Tensor<1>,
}

/// Four bytes to a little-endian word; a short tail is padded with zeros.
fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks(4)
        .map(|c| {
            let mut w = [0u8; 4];
            w[..c.len()].copy_from_slice(c);
            u32::from_le_bytes(w)
        })
        .collect()
}

/// Whether NF4 products on `device` dequantize there: a GPU (cubecl) device.
pub fn dequantizes_on(device: &Device) -> bool {
    crate::device::is_gpu(device)
}

/// The shared tables of `device`, uploaded on first use.
fn tables(device: &Device) -> Tensor<1> {
    static TABLES: Mutex<Vec<(Device, Tensor<1>)>> = Mutex::new(Vec::new());
    let mut cache = TABLES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, t)) = cache.iter().find(|(d, _)| d == device) {
        return t.clone();
    }
    let mut values = NF4_CODEBOOK.to_vec();
    values.extend_from_slice(&dynamic_map_signed());
    let len = values.len();
    let t: Tensor<1> = link::upload(TensorData::new(values, [len]), device, Traffic::Weights);
    cache.push((device.clone(), t.clone()));
    t
}

fn upload_words(bytes: &[u8], device: &Device) -> Tensor<1, Int> {
    let w = words(bytes);
    let len = w.len();
    link::upload_as(
        TensorData::new(w, [len]),
        device,
        burn::tensor::DType::U32,
        Traffic::Weights,
    )
}

fn upload_f32(values: &[f32], device: &Device) -> Tensor<1> {
    link::upload(
        TensorData::new(values.to_vec(), [values.len()]),
        device,
        Traffic::Weights,
    )
}

impl ResidentNf4 {
    /// Uploads `q` (a 2-D weight) to `device` when NF4 products dequantize there; `None` on
    /// the CPU backends.
    pub fn upload(q: &Nf4Tensor, device: &Device) -> Option<Self> {
        if !dequantizes_on(device) || q.shape.len() != 2 {
            return None;
        }
        let device = device.clone().without_autodiff();
        let scales = match &q.scales {
            Nf4Scales::Plain { absmax } => ResidentScales::Plain(upload_f32(absmax, &device)),
            Nf4Scales::Double {
                offset,
                qabsmax,
                absmax2,
            } => ResidentScales::Double {
                qwords: upload_words(qabsmax, &device),
                absmax2: upload_f32(absmax2, &device),
                offset: *offset,
            },
        };
        Some(ResidentNf4 {
            shape: [q.shape[0], q.shape[1]],
            block_size: q.block_size,
            words: upload_words(&q.packed, &device),
            scales,
            tables: tables(&device),
        })
    }

    /// The device the codes live on (without autodiff).
    pub fn device(&self) -> Device {
        self.words.device()
    }

    /// Bytes this weight holds on the device (codes and scales; the shared tables not
    /// included).
    pub fn device_bytes(&self) -> u64 {
        let f32s = |t: &Tensor<1>| 4 * t.dims()[0] as u64;
        let words = 4 * self.words.dims()[0] as u64;
        words
            + match &self.scales {
                ResidentScales::Plain(absmax) => f32s(absmax),
                ResidentScales::Double {
                    qwords, absmax2, ..
                } => 4 * qwords.dims()[0] as u64 + f32s(absmax2),
            }
    }

    /// The dequantized `[out, in]` weight on the device, in f32 (bit-exact with the CPU) or a
    /// 16-bit dtype (that value rounded once): a transient the caller drops after its product.
    pub fn dequantize(&self, dtype: FloatDType) -> Tensor<2> {
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        {
            use burn::backend::Cube;
            let primitives = self.primitives();
            let [out, inp] = self.shape;
            let weight = super::nf4_dequantize::dequantize(
                primitives.words,
                primitives.scales,
                primitives.tables,
                out * inp,
                self.block_size,
                self.shape,
                burn::tensor::DType::from(dtype),
            );
            Tensor::from_primitive::<Cube>(weight)
        }
        #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
        {
            // `upload` returns None in builds without a cubecl backend: never constructed.
            let _ = dtype;
            unreachable!("no cubecl backend in this build")
        }
    }

    /// Whether [`Self::rows_times_transposed`] takes `rows` rows of `inp` values.
    pub fn reads_rows(&self, rows: usize, inp: usize) -> bool {
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        {
            inp == self.shape[1]
                && super::nf4_row_product::supports(self.shape, self.block_size, rows)
        }
        #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
        {
            let _ = (rows, inp);
            false
        }
    }

    /// `x · Wᵀ` read straight from the codes (`nf4_row_product.rs`): `[rows, in]` →
    /// `[rows, out]` in f32, with no dequantized weight, plus a LoRA adapter's path when given
    /// (in the same launch); `None` where that kernel does not take this shape
    /// ([`Self::reads_rows`]; the caller dequantizes instead). `x` must live on this weight's
    /// device (untracked: the product has no backward).
    pub fn rows_times_transposed(
        &self,
        x: &Tensor<2>,
        adapter: Option<LoraPath>,
    ) -> Option<Tensor<2>> {
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        {
            use super::nf4_row_product::{LowRankPath, rows_times_transposed};
            use burn::backend::Cube;
            let [rows, inp] = x.dims();
            if !self.reads_rows(rows, inp) {
                return None;
            }
            let primitive = |t: &Tensor<2>| {
                t.clone()
                    .without_autodiff()
                    .cast(FloatDType::F32)
                    .try_into_primitive::<Cube>()
                    .ok()
            };
            let low_rank = match adapter {
                Some(path) => {
                    let [down_rows, rank] = path.down.dims();
                    if down_rows != rows || path.lora_b.dims() != [self.shape[0], rank] {
                        return None;
                    }
                    Some(LowRankPath {
                        down: primitive(&path.down)?,
                        lora_b: primitive(&path.lora_b)?,
                        scaling: path.scaling as f32,
                    })
                }
                None => None,
            };
            let primitives = self.primitives();
            let y = rows_times_transposed(
                primitive(x)?,
                primitives.words,
                primitives.scales,
                primitives.tables,
                self.shape,
                self.block_size,
                low_rank,
            );
            Some(Tensor::from_primitive::<Cube>(y))
        }
        #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
        {
            let _ = (x, adapter);
            unreachable!("no cubecl backend in this build")
        }
    }

    /// The codes, scales and tables as cubecl primitives.
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    fn primitives(&self) -> Primitives {
        use super::nf4_dequantize::DeviceScales;
        use burn::backend::Cube;
        // Uploaded by `upload` to a cubecl device: these conversions cannot fail.
        let int = |t: &Tensor<1, Int>| {
            t.clone()
                .try_into_primitive::<Cube>()
                .expect("resident NF4 tensors live on a cubecl device")
        };
        let float = |t: &Tensor<1>| {
            t.clone()
                .try_into_primitive::<Cube>()
                .expect("resident NF4 tensors live on a cubecl device")
        };
        let scales = match &self.scales {
            ResidentScales::Plain(absmax) => DeviceScales::Plain(float(absmax)),
            ResidentScales::Double {
                qwords,
                absmax2,
                offset,
            } => DeviceScales::Double {
                qwords: int(qwords),
                absmax2: float(absmax2),
                offset: *offset,
            },
        };
        Primitives {
            words: int(&self.words),
            scales,
            tables: float(&self.tables),
        }
    }
}

/// A resident weight's tensors as the kernels take them.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
struct Primitives {
    words: burn_cubecl::tensor::CubeTensor,
    scales: super::nf4_dequantize::DeviceScales,
    tables: burn_cubecl::tensor::CubeTensor,
}

#[cfg(test)]
mod tests {
    use super::words;

    #[test]
    fn words_are_little_endian_and_pad_the_tail() {
        assert_eq!(
            words(&[0x01, 0x02, 0x03, 0x04, 0xab]),
            vec![0x0403_0201, 0xab]
        );
    }
}
