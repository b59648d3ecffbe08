//! The gradients' global norm on a GPU (cubecl): `√(Σ over every tensor of Σ g²)`, the norm that
//! gradient clipping and the progress line use, in a launch per [`MEMBERS`] tensors and one
//! read. As burn's ops it was a square and a sum per tensor, and a read of each sum (a wait for
//! the device): SmolLM2's 420 LoRA tensors took 840 launches and 420 waits a step.
//!
//! The tensors of a launch are laid end to end (as `adamw.rs` groups them); each cube takes
//! chunks of [`CHUNK`] consecutive values of that range, every [`MAX_CUBES`]-th chunk when there
//! are more, and writes its sum of squares to a slot of its own in `partials`; burn's sum adds
//! the partials, which are then read once. f32 throughout (burn's per-tensor sums were f32
//! too; their total was taken in f64 on the host).
//!
//! # Shapes
//! - each gradient: `[n]` f32 → one f64

use burn::tensor::Tensor;

/// Tensors a launch: with the partials and cubecl's metadata, eight bindings, what a browser's
/// WebGPU offers at least.
pub const MEMBERS: usize = 6;

/// `√(Σ Σ g²)` over `grads`, when every one is an f32 tensor on one GPU device; `None`
/// otherwise (the caller sums on the host or with burn's ops).
pub fn global_norm(grads: &[&Tensor<1>]) -> Option<f64> {
    let total = sum_of_squares(grads)?;
    Some(f64::from(crate::kernels::values::scalar(total)).sqrt())
}

/// `[1]`: `Σ Σ g²` over `grads` on their GPU device, not read (a captured step reads it with its
/// loss); `None` where [`global_norm`] is.
pub fn sum_of_squares(grads: &[&Tensor<1>]) -> Option<Tensor<1>> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        let first = grads.first()?;
        if !crate::device::is_gpu(&first.device()) {
            return None;
        }
        let tensors = grads
            .iter()
            .map(|g| {
                (*g).clone()
                    .try_into_primitive::<burn::backend::Cube>()
                    .ok()
                    .filter(|c| c.dtype == burn::tensor::DType::F32)
            })
            .collect::<Option<Vec<_>>>()?;
        if tensors.iter().any(|t| t.device != tensors[0].device) {
            return None;
        }
        let partials = device::partial_sums(tensors);
        Some(Tensor::<1>::from_primitive::<burn::backend::Cube>(partials).sum())
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        let _ = grads;
        None
    }
}

/// Launches of the kernel since the program started (all devices, all threads).
pub fn launches() -> u64 {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        device::LAUNCHES.load(std::sync::atomic::Ordering::Relaxed)
    }
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    {
        0
    }
}

/// Consecutive values a cube sums before moving on: 64 units × 16.
pub const CHUNK: usize = 1024;

/// The most cubes a launch uses (more chunks are taken every `MAX_CUBES`-th by each cube).
pub const MAX_CUBES: usize = 1024;

#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod device {
    use std::sync::atomic::{AtomicU64, Ordering};

    use burn_backend::DType;
    use burn_cubecl::kernel::into_contiguous;
    use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
    use burn_cubecl::tensor::CubeTensor;
    use cubecl::prelude::*;

    use super::{CHUNK, MAX_CUBES, MEMBERS};
    use crate::kernels::gpu::reduce::{UNITS, halve_to_two};

    pub(super) static LAUNCHES: AtomicU64 = AtomicU64::new(0);

    /// Value `at` of the six tensors laid end to end: the first slot whose end (running totals
    /// `end0` ≤ … ≤ `end4`) exceeds it; the caller keeps `at` below the last end.
    #[cube]
    #[allow(clippy::too_many_arguments, unused_assignments)] // every branch writes `value`
    fn value_at(
        t0: &Tensor<f32>,
        t1: &Tensor<f32>,
        t2: &Tensor<f32>,
        t3: &Tensor<f32>,
        t4: &Tensor<f32>,
        t5: &Tensor<f32>,
        end0: usize,
        end1: usize,
        end2: usize,
        end3: usize,
        end4: usize,
        at: usize,
    ) -> f32 {
        let mut value = 0.0f32;
        if at < end0 {
            value = t0[at];
        } else if at < end1 {
            value = t1[at - end0];
        } else if at < end2 {
            value = t2[at - end1];
        } else if at < end3 {
            value = t3[at - end2];
        } else if at < end4 {
            value = t4[at - end3];
        } else {
            value = t5[at - end4];
        }
        value
    }

    /// Cube `c` sums the squares of chunks `c`, `c + cubes`, … (each `CHUNK` values: unit `u`
    /// takes values `u`, `u + 64`, … of it) and writes the sum to `partials[first + c]`.
    #[cube(launch_unchecked)]
    #[allow(clippy::too_many_arguments)]
    fn sum_of_squares_group(
        t0: &Tensor<f32>,
        t1: &Tensor<f32>,
        t2: &Tensor<f32>,
        t3: &Tensor<f32>,
        t4: &Tensor<f32>,
        t5: &Tensor<f32>,
        partials: &mut Tensor<f32>,
        end0: usize,
        end1: usize,
        end2: usize,
        end3: usize,
        end4: usize,
        end5: usize,
        chunks: usize,
        cubes: usize,
        first: usize,
    ) {
        let unit = UNIT_POS_X as usize;
        let cube = CUBE_POS_X as usize;
        let mut sum = 0.0f32;
        let mut chunk = cube;
        while chunk < chunks {
            let mut at = chunk * CHUNK + unit;
            let end = chunk * CHUNK + CHUNK;
            while at < end {
                if at < end5 {
                    let value = value_at(t0, t1, t2, t3, t4, t5, end0, end1, end2, end3, end4, at);
                    sum += value * value;
                }
                at += 64;
            }
            chunk += cubes;
        }
        let mut partial = Shared::<[f32]>::new_slice(64usize);
        partial[unit] = sum;
        sync_cube();
        halve_to_two(&mut partial, unit, false);
        sync_cube();
        if unit == 0 {
            partials[first + cube] = partial[0] + partial[1];
        }
    }

    /// Each launch's arguments (six tensors end to end), their ends and its cubes.
    struct Launch {
        args: Vec<TensorArg>,
        ends: [usize; MEMBERS],
        cubes: usize,
    }

    /// The partial sums of squares of `tensors` (f32, one device; any layout), a `[P]` f32
    /// tensor on their device whose sum is the sum of every value squared.
    pub(super) fn partial_sums(tensors: Vec<CubeTensor>) -> CubeTensor {
        let mut launches = Vec::new();
        let mut rest = tensors.into_iter().map(into_contiguous).peekable();
        let client = rest.peek().map(|t| (t.client.clone(), t.device.clone()));
        while rest.peek().is_some() {
            let group = rest.by_ref().take(MEMBERS).map(|t| [t]).collect();
            let (ends, total, args) = crate::kernels::gpu::laid_end_to_end::<1, MEMBERS>(group);
            launches.push(Launch {
                args: args.collect(),
                ends,
                cubes: total.div_ceil(CHUNK).clamp(1, MAX_CUBES),
            });
        }
        let Some((client, device)) = client else {
            unreachable!("global_norm passes at least one gradient")
        };
        let slots: usize = launches.iter().map(|l| l.cubes).sum();
        let partials =
            empty_device_contiguous_dtype(client.clone(), device, [slots].into(), DType::F32);
        let mut first = 0;
        for Launch { args, ends, cubes } in launches {
            let mut args = args.into_iter();
            let mut next = || args.next().expect("six tensors a launch");
            let chunks = ends[MEMBERS - 1].div_ceil(CHUNK);
            // Safety: every index read is below its slot's length (`at − end_{k−1} < n_k` for
            // the one slot with end_{k−1} ≤ at < end_k, and `at < end5`, the last end); each
            // cube writes only `partials[first + cube]`, `first + cube < slots`; the shared
            // slice is 64 values, indexed below 64.
            unsafe {
                sum_of_squares_group::launch_unchecked(
                    &client,
                    CubeCount::Static(cubes as u32, 1, 1),
                    CubeDim::new_1d(UNITS as u32),
                    next(),
                    next(),
                    next(),
                    next(),
                    next(),
                    next(),
                    partials.clone().into_tensor_arg(),
                    ends[0],
                    ends[1],
                    ends[2],
                    ends[3],
                    ends[4],
                    ends[5],
                    chunks,
                    cubes,
                    first,
                );
            }
            LAUNCHES.fetch_add(1, Ordering::Relaxed);
            first += cubes;
        }
        partials
    }
}
