//! NF4 dequantization of one weight on the GPU, three ways, for the choice
//! `kernels/gpu/nf4_dequantize.rs` made:
//! - napkin's cubecl kernel on the resident codes (one dispatch; two with double quantization);
//! - burn's integer tensor ops on the same resident u32 words: eight shift-and-mask pairs, a
//!   stack, a gather from the codebook, a broadcast product with the scales;
//! - the host path the GPU backends had before: dequantized by the CPU, the f32 weight uploaded.
//!
//! Dispatches are the kernel launches each way makes (burn's cubecl backend runs one kernel per
//! op; fusion is not compiled in); the device peak is read from the pool at marks after each op
//! with its input still alive; times are medians to a sync.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use burn::tensor::{DType, Device, FloatDType, Int, Tensor, TensorData};
use napkin_core::config::Nf4Config;
use napkin_core::kernels::gpu::resident_nf4::ResidentNf4;
use napkin_core::memory::meter::Meter;
use napkin_core::model::nf4_weight::host_dequantized;
use napkin_core::predict::units::accelerate_units;
use napkin_core::quant::nf4::{NF4_CODEBOOK, Nf4Scales, Nf4Tensor};

use super::spread;

/// Shift of weight `j` (0..8) of a little-endian word of packed codes (byte k holds weights
/// 2k in its high nibble and 2k + 1 in its low one).
fn shift(j: u32) -> u32 {
    8 * (j / 2) + if j.is_multiple_of(2) { 4 } else { 0 }
}

/// The weight dequantized with burn's integer ops; `mark` after each op, while its input is
/// still alive (what the device holds at that op's end).
fn with_int_ops(
    words: &Tensor<1, Int>,
    absmax: &Tensor<1>,
    codebook: &Tensor<1>,
    shape: [usize; 2],
    block_size: usize,
    mark: &mut dyn FnMut(),
) -> Tensor<2> {
    let n = shape[0] * shape[1];
    let parts: Vec<Tensor<1, Int>> = (0..8)
        .map(|j| {
            words
                .clone()
                .bitwise_right_shift_scalar(shift(j))
                .bitwise_and_scalar(0x0f)
        })
        .collect(); // 16 dispatches, 8 × [n / 8]
    mark();
    let codes: Tensor<2, Int> = Tensor::stack(parts.clone(), 1); // [n / 8, 8], one dispatch
    mark();
    drop(parts);
    let flat = codes.reshape([n]);
    let values = codebook.clone().select(0, flat.clone()); // [n], one gather
    mark();
    drop(flat);
    let blocks = n / block_size;
    let w = values.clone().reshape([blocks, block_size]) * absmax.clone().reshape([blocks, 1]);
    mark();
    drop(values);
    w.reshape(shape)
}

fn median_seconds(device: &Device, runs: usize, mut once: impl FnMut()) -> f64 {
    once(); // warm-up: compilation, the pool's first slices
    let _ = device.sync();
    let times: Vec<f64> = (0..runs.max(1))
        .map(|_| {
            let start = Instant::now();
            once();
            let _ = device.sync();
            start.elapsed().as_secs_f64()
        })
        .collect();
    spread(&times).map_or(f64::NAN, |(median, _, _)| median)
}

/// Prints the table; returns whether both ways gave the same values (both read back, equal).
pub fn run(device: &Device, runs: usize, shape: [usize; 2]) -> Result<bool> {
    let n = shape[0] * shape[1];
    let values: Vec<f32> = (0..n)
        .map(|i| ((i * 7919 % 10_007) as f32 / 10_007.0 - 0.5) * 0.04)
        .collect();
    let plain = Nf4Config {
        block_size: 64,
        double_quant: false,
    };
    let q = Arc::new(Nf4Tensor::quantize(&values, &shape, &plain)?);
    let resident = ResidentNf4::upload(&q, device).expect("a GPU device");
    let Nf4Scales::Plain { absmax } = &q.scales else {
        unreachable!("quantized without double quantization")
    };
    let words: Vec<u32> = q
        .packed
        .chunks(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let words: Tensor<1, Int> =
        Tensor::from_data(TensorData::new(words, [n / 8]), (device, DType::U32));
    let absmax: Tensor<1> = Tensor::from_data(TensorData::new(absmax.clone(), [n / 64]), device);
    let codebook: Tensor<1> =
        Tensor::from_data(TensorData::new(NF4_CODEBOOK.to_vec(), [16]), device);

    // Same values both ways.
    let a = resident.dequantize(FloatDType::F32).into_data();
    let b = with_int_ops(&words, &absmax, &codebook, shape, 64, &mut || {}).into_data();
    // Equal only when both read back as f32 (two failed reads are not the same values).
    let same = matches!((a.as_slice::<f32>(), b.as_slice::<f32>()), (Ok(a), Ok(b)) if a == b);

    let mut meter = Meter::for_device(device)?;
    let mut transient = |f: &mut dyn FnMut(&mut dyn FnMut()) -> Tensor<2>| {
        let start = meter.start_peak();
        let mut mark = || {
            meter.live();
        };
        let w = f(&mut mark);
        meter.live();
        drop(w);
        meter.peak().saturating_sub(start)
    };
    let kernel_bytes = transient(&mut |_| resident.dequantize(FloatDType::F32));
    let ops_bytes =
        transient(&mut |mark| with_int_ops(&words, &absmax, &codebook, shape, 64, mark));
    let host_bytes = transient(&mut |_| host_dequantized(&q, device));

    let kernel = median_seconds(device, runs, || drop(resident.dequantize(FloatDType::F32)));
    let ops = median_seconds(device, runs, || {
        drop(with_int_ops(
            &words,
            &absmax,
            &codebook,
            shape,
            64,
            &mut || {},
        ))
    });
    let host = median_seconds(device, runs, || drop(host_dequantized(&q, device)));
    let f32_bytes = (4 * n) as f64;
    println!(
        "\nNF4 dequantization of one [{}×{}] weight (block 64) on the device, median of {runs}; values identical both ways: {same}",
        shape[0], shape[1]
    );
    println!(
        "  {:<44} {:>10} {:>12} {:>10}",
        "way", "dispatches", "device peak", "ms"
    );
    for (way, dispatches, bytes, seconds) in [
        (
            "napkin's cubecl kernel (resident codes)",
            "1",
            kernel_bytes,
            kernel,
        ),
        ("burn integer ops (resident codes)", "19", ops_bytes, ops),
        (
            "CPU dequantize + f32 upload (before)",
            "0 + copy",
            host_bytes,
            host,
        ),
    ] {
        println!(
            "  {way:<44} {dispatches:>10} {:>12} {:>10.2}",
            accelerate_units(bytes as f64),
            1e3 * seconds
        );
    }
    println!(
        "  (the f32 weight itself is {}; the host path also moves it over the link every product)",
        accelerate_units(f32_bytes)
    );
    Ok(same)
}
