//! AdamW's update as cubecl kernels, for the GPU backends: one parameter a launch
//! ([`update`]), or [`GROUP`] parameters a launch ([`update_group`], what a training step uses
//! where the device binds its 29 buffers: not a browser's WebGPU).
//!
//! As burn tensor ops ([`crate::train::adamw`]'s `update_with_tensor_ops`) the update is about
//! thirteen kernels per parameter — burn's cubecl backend launches one per op — and on a GPU
//! each launch costs host time whatever its size: measured on an H200 (wgpu/Vulkan), SmolLM2's
//! 420 LoRA tensors took 0.75–0.80 s of AdamW per step, ~150 µs a launch. Here each value's
//! `p, g, m, v` are read once and the new three written, in 420 launches, or 105 grouped.
//!
//! Per value, in the order and precision (f32) of the tensor-op version, with the gradient taken
//! as `g·c` (gradient clipping's factor `c`, folded in instead of a pass over every gradient):
//! `m ← m + (1−β1)(g − m); v ← β2·v + (1−β2)·g²; p ← p·decay − (m / (√v / √(1−β2ᵗ) + ε))·step_size`.
//! Each intermediate is stored in a variable of its own, as the tensor ops store each in a
//! buffer; a GPU compiler may still contract a product and a sum into one fused multiply-add,
//! so values can differ from the CPU's in the last bit (the test bounds the difference).

use std::sync::atomic::{AtomicU64, Ordering};

use burn_backend::DType;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

/// The scalars of one step (see `train::adamw::StepScalars`), in f32.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWScalars {
    /// `1 − lr·wd`.
    pub decay: f32,
    /// `1 − β1`.
    pub one_minus_beta1: f32,
    /// β2.
    pub beta2: f32,
    /// `1 − β2`.
    pub one_minus_beta2: f32,
    /// `lr / (1 − β1ᵗ)`.
    pub step_size: f32,
    /// `√(1 − β2ᵗ)`.
    pub bias_correction2_sqrt: f32,
    /// ε.
    pub eps: f32,
    /// The gradient is taken as `g · grad_factor` (gradient clipping's factor; 1 for none).
    pub grad_factor: f32,
}

/// The new first moment: `m + (1−β1)(g − m)`.
#[cube]
fn moved_m(grad: f32, m_old: f32, one_minus_beta1: f32) -> f32 {
    let toward = grad - m_old;
    let moved = toward * one_minus_beta1;
    m_old + moved
}

/// The new second moment: `β2·v + (1−β2)·g²`.
#[cube]
fn moved_v(grad: f32, v_old: f32, beta2: f32, one_minus_beta2: f32) -> f32 {
    let v_kept = v_old * beta2;
    let squared = grad * grad;
    let v_added = squared * one_minus_beta2;
    v_kept + v_added
}

/// The new parameter: `p·decay − (m / (√v / √(1−β2ᵗ) + ε))·step_size`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn moved_p(
    p_old: f32,
    m_new: f32,
    v_new: f32,
    decay: f32,
    step_size: f32,
    bias_correction2_sqrt: f32,
    eps: f32,
) -> f32 {
    let root = f32::sqrt(v_new);
    let corrected = root / bias_correction2_sqrt;
    let denom = corrected + eps;
    let decayed = p_old * decay;
    let ratio = m_new / denom;
    let step = ratio * step_size;
    decayed - step
}

/// Value `i`'s update: reads `p`, `g`, `m`, `v` at `i` and writes the new three at `i`. With
/// `first` the moments are zero: `m` and `v` are stand-ins (any tensor of `i`'s length) whose
/// values are unused.
#[cube]
#[allow(clippy::too_many_arguments)]
fn adamw_at(
    p: &Tensor<f32>,
    g: &Tensor<f32>,
    m: &Tensor<f32>,
    v: &Tensor<f32>,
    p_out: &mut Tensor<f32>,
    m_out: &mut Tensor<f32>,
    v_out: &mut Tensor<f32>,
    i: usize,
    decay: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    step_size: f32,
    bias_correction2_sqrt: f32,
    eps: f32,
    grad_factor: f32,
    #[comptime] first: bool,
) {
    // As `g * factor` on the tensor would (exact when the factor is 1).
    let grad = g[i] * grad_factor;
    let mut m_old = 0.0f32;
    let mut v_old = 0.0f32;
    if !first {
        m_old = m[i];
        v_old = v[i];
    }
    let m_new = moved_m(grad, m_old, one_minus_beta1);
    let v_new = moved_v(grad, v_old, beta2, one_minus_beta2);
    p_out[i] = moved_p(
        p[i],
        m_new,
        v_new,
        decay,
        step_size,
        bias_correction2_sqrt,
        eps,
    );
    m_out[i] = m_new;
    v_out[i] = v_new;
}

/// Value `i`'s update written over `p`, `m` and `v` themselves (each thread reads its own
/// index, then writes it): the buffers a captured step's graph recorded stay the parameter's and
/// moments' buffers. The scalars come from the device tensor `s` ([`DEVICE_SCALARS`]).
#[cube]
fn adamw_in_place_at(
    p: &mut Tensor<f32>,
    g: &Tensor<f32>,
    m: &mut Tensor<f32>,
    v: &mut Tensor<f32>,
    s: &Tensor<f32>,
    i: usize,
) {
    let grad = g[i] * s[7];
    let m_new = moved_m(grad, m[i], s[1]);
    let v_new = moved_v(grad, v[i], s[2], s[3]);
    p[i] = moved_p(p[i], m_new, v_new, s[0], s[4], s[5], s[6]);
    m[i] = m_new;
    v[i] = v_new;
}

/// One thread per value. With `first`, the moments are zero and `m`, `v` are not read.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn adamw_values(
    p: &Tensor<f32>,
    g: &Tensor<f32>,
    m: &Tensor<f32>,
    v: &Tensor<f32>,
    p_out: &mut Tensor<f32>,
    m_out: &mut Tensor<f32>,
    v_out: &mut Tensor<f32>,
    decay: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    step_size: f32,
    bias_correction2_sqrt: f32,
    eps: f32,
    grad_factor: f32,
    #[comptime] first: bool,
) {
    let i = ABSOLUTE_POS;
    if i >= p.len() {
        terminate!();
    }
    adamw_at(
        p,
        g,
        m,
        v,
        p_out,
        m_out,
        v_out,
        i,
        decay,
        one_minus_beta1,
        beta2,
        one_minus_beta2,
        step_size,
        bias_correction2_sqrt,
        eps,
        grad_factor,
        first,
    );
}

/// Tensors one launch of [`update_group`] updates.
pub const GROUP: usize = 4;

/// Bindings a group's launch needs: seven tensors a slot and the launch's metadata.
const GROUP_BINDINGS: u32 = 7 * GROUP as u32 + 1;

/// One thread per value of four tensors laid end to end: thread `i` belongs to the first slot
/// whose end (`end0` ≤ `end1` ≤ `end2` ≤ `end3`, running totals of the slots' lengths) exceeds
/// it. An empty slot has its end equal to the one before and is never chosen.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn adamw_group(
    p0: &Tensor<f32>,
    g0: &Tensor<f32>,
    m0: &Tensor<f32>,
    v0: &Tensor<f32>,
    po0: &mut Tensor<f32>,
    mo0: &mut Tensor<f32>,
    vo0: &mut Tensor<f32>,
    p1: &Tensor<f32>,
    g1: &Tensor<f32>,
    m1: &Tensor<f32>,
    v1: &Tensor<f32>,
    po1: &mut Tensor<f32>,
    mo1: &mut Tensor<f32>,
    vo1: &mut Tensor<f32>,
    p2: &Tensor<f32>,
    g2: &Tensor<f32>,
    m2: &Tensor<f32>,
    v2: &Tensor<f32>,
    po2: &mut Tensor<f32>,
    mo2: &mut Tensor<f32>,
    vo2: &mut Tensor<f32>,
    p3: &Tensor<f32>,
    g3: &Tensor<f32>,
    m3: &Tensor<f32>,
    v3: &Tensor<f32>,
    po3: &mut Tensor<f32>,
    mo3: &mut Tensor<f32>,
    vo3: &mut Tensor<f32>,
    end0: usize,
    end1: usize,
    end2: usize,
    end3: usize,
    decay: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    step_size: f32,
    bias_correction2_sqrt: f32,
    eps: f32,
    grad_factor: f32,
    #[comptime] first: bool,
) {
    let at = ABSOLUTE_POS;
    if at >= end3 {
        terminate!();
    }
    if at < end0 {
        adamw_at(
            p0,
            g0,
            m0,
            v0,
            po0,
            mo0,
            vo0,
            at,
            decay,
            one_minus_beta1,
            beta2,
            one_minus_beta2,
            step_size,
            bias_correction2_sqrt,
            eps,
            grad_factor,
            first,
        );
    } else if at < end1 {
        adamw_at(
            p1,
            g1,
            m1,
            v1,
            po1,
            mo1,
            vo1,
            at - end0,
            decay,
            one_minus_beta1,
            beta2,
            one_minus_beta2,
            step_size,
            bias_correction2_sqrt,
            eps,
            grad_factor,
            first,
        );
    } else if at < end2 {
        adamw_at(
            p2,
            g2,
            m2,
            v2,
            po2,
            mo2,
            vo2,
            at - end1,
            decay,
            one_minus_beta1,
            beta2,
            one_minus_beta2,
            step_size,
            bias_correction2_sqrt,
            eps,
            grad_factor,
            first,
        );
    } else {
        adamw_at(
            p3,
            g3,
            m3,
            v3,
            po3,
            mo3,
            vo3,
            at - end2,
            decay,
            one_minus_beta1,
            beta2,
            one_minus_beta2,
            step_size,
            bias_correction2_sqrt,
            eps,
            grad_factor,
            first,
        );
    }
}

/// [`adamw_group`] written over each slot's own `p`, `m` and `v` ([`adamw_in_place_at`]),
/// its scalars read from the device tensor `s`; nothing is written when `s[8]` (apply) is 0.
/// The moments are always read (a captured step starts them at zeros).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn adamw_group_in_place(
    p0: &mut Tensor<f32>,
    g0: &Tensor<f32>,
    m0: &mut Tensor<f32>,
    v0: &mut Tensor<f32>,
    p1: &mut Tensor<f32>,
    g1: &Tensor<f32>,
    m1: &mut Tensor<f32>,
    v1: &mut Tensor<f32>,
    p2: &mut Tensor<f32>,
    g2: &Tensor<f32>,
    m2: &mut Tensor<f32>,
    v2: &mut Tensor<f32>,
    p3: &mut Tensor<f32>,
    g3: &Tensor<f32>,
    m3: &mut Tensor<f32>,
    v3: &mut Tensor<f32>,
    s: &Tensor<f32>,
    end0: usize,
    end1: usize,
    end2: usize,
    end3: usize,
) {
    let at = ABSOLUTE_POS;
    if at >= end3 || s[8] == 0.0 {
        terminate!();
    }
    if at < end0 {
        adamw_in_place_at(p0, g0, m0, v0, s, at);
    } else if at < end1 {
        adamw_in_place_at(p1, g1, m1, v1, s, at - end0);
    } else if at < end2 {
        adamw_in_place_at(p2, g2, m2, v2, s, at - end1);
    } else {
        adamw_in_place_at(p3, g3, m3, v3, s, at - end2);
    }
}

/// Launches of the update kernel since the program started, counted at each launch.
static LAUNCHES: AtomicU64 = AtomicU64::new(0);

/// How many times the update kernel has been launched (all devices, all threads).
pub fn launches() -> u64 {
    LAUNCHES.load(Ordering::Relaxed)
}

/// The updated parameter and moments `(p, m, v)`, three new `[n]` f32 tensors on the
/// parameter's device; `moments` is None on a parameter's first step.
///
/// # Shapes
/// - `p`, `g`, `moments`: `[n]`, f32, contiguous
pub fn update(
    p: CubeTensor,
    g: CubeTensor,
    moments: Option<(CubeTensor, CubeTensor)>,
    s: &AdamWScalars,
) -> (CubeTensor, CubeTensor, CubeTensor) {
    let client = p.client.clone();
    let device = p.device.clone();
    let n = p.meta.shape().num_elements();
    let new =
        || empty_device_contiguous_dtype(client.clone(), device.clone(), [n].into(), DType::F32);
    let (p_out, m_out, v_out) = (new(), new(), new());
    let first = moments.is_none();
    // Unread when `first`: any f32 tensor of the launch stands in.
    let (m, v) = moments.unwrap_or_else(|| (g.clone(), g.clone()));
    let (cube_count, cube_dim) = super::one_thread_each(&client, n);
    // Safety: one thread per value; thread i reads index i of four tensors of n values and
    // writes index i of three new ones of n values; threads past n return first.
    unsafe {
        adamw_values::launch_unchecked(
            &client,
            cube_count,
            cube_dim,
            p.into_tensor_arg(),
            g.into_tensor_arg(),
            m.into_tensor_arg(),
            v.into_tensor_arg(),
            p_out.clone().into_tensor_arg(),
            m_out.clone().into_tensor_arg(),
            v_out.clone().into_tensor_arg(),
            s.decay,
            s.one_minus_beta1,
            s.beta2,
            s.one_minus_beta2,
            s.step_size,
            s.bias_correction2_sqrt,
            s.eps,
            s.grad_factor,
            first,
        );
    }
    LAUNCHES.fetch_add(1, Ordering::Relaxed);
    (p_out, m_out, v_out)
}

/// One parameter's update as [`update_group`] takes it: the parameter, its gradient and its
/// moments (None on its first step), all `[n]` f32, contiguous, on one device, and the three
/// new `[n]` tensors the launch writes ([`new_outputs`]).
#[derive(Clone)]
pub struct GroupMember {
    pub p: CubeTensor,
    pub g: CubeTensor,
    pub moments: Option<(CubeTensor, CubeTensor)>,
    pub out: (CubeTensor, CubeTensor, CubeTensor),
}

/// Three new `[n]` f32 tensors on `p`'s device, for its updated `(p, m, v)`.
pub fn new_outputs(p: &CubeTensor) -> (CubeTensor, CubeTensor, CubeTensor) {
    let n = p.meta.shape().num_elements();
    let new = || {
        empty_device_contiguous_dtype(p.client.clone(), p.device.clone(), [n].into(), DType::F32)
    };
    (new(), new(), new())
}

/// Whether `p`'s device binds enough buffers for one launch of [`update_group`] (a browser's
/// WebGPU gives 8 to 10: there each parameter takes its own launch).
pub fn groups_fit(p: &CubeTensor) -> bool {
    p.client.properties().hardware.max_bindings >= GROUP_BINDINGS
}

/// Whether `device` binds enough buffers for one launch of [`update_group`] or
/// [`update_group_in_place`] (a GPU device; false elsewhere).
pub fn groups_fit_on(device: &burn::tensor::Device) -> bool {
    burn::tensor::Tensor::<1>::zeros([1], device)
        .try_into_primitive::<burn::backend::Cube>()
        .is_ok_and(|probe| groups_fit(&probe))
}

/// The updates of up to [`GROUP`] parameters in one launch, written into each member's
/// outputs as [`update`] writes its own. The members all have moments or none has (one
/// compiled kernel each way).
///
/// # Panics
/// With no member, more than [`GROUP`], or members with and without moments mixed: the
/// caller's grouping is wrong.
pub fn update_group(members: Vec<GroupMember>, s: &AdamWScalars) {
    assert!((1..=GROUP).contains(&members.len()), "1 to {GROUP} members");
    let first = members[0].moments.is_none();
    assert!(
        members.iter().all(|m| m.moments.is_none() == first),
        "a group's members all have moments or none has"
    );
    let client = members[0].p.client.clone();
    let slots = members.into_iter().map(|member| {
        // Unread when `first`: the gradient stands in for the moments.
        let (m, v) = member
            .moments
            .unwrap_or_else(|| (member.g.clone(), member.g.clone()));
        let (po, mo, vo) = member.out;
        [member.p, member.g, m, v, po, mo, vo]
    });
    let (ends, total, mut a) = super::laid_end_to_end::<7, GROUP>(slots.collect());
    let mut next = || a.next().expect("seven tensors a slot");
    let (cube_count, cube_dim) = super::one_thread_each(&client, total.max(1));
    // Safety: thread `at` < Σn belongs to the one slot with end_{k−1} ≤ at < end_k and reads
    // index at − end_{k−1} < n_k of that slot's four inputs and writes the same index of its
    // three outputs (n_k values each); threads past Σn return first; empty slots are never
    // chosen.
    unsafe {
        adamw_group::launch_unchecked(
            &client,
            cube_count,
            cube_dim,
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            ends[0],
            ends[1],
            ends[2],
            ends[3],
            s.decay,
            s.one_minus_beta1,
            s.beta2,
            s.one_minus_beta2,
            s.step_size,
            s.bias_correction2_sqrt,
            s.eps,
            s.grad_factor,
            first,
        );
    }
    LAUNCHES.fetch_add(1, Ordering::Relaxed);
}

/// One parameter's update as [`update_group_in_place`] takes it: the parameter, its gradient and
/// its moments, all `[n]` f32, contiguous, on one device; the launch writes over `p`, `m`, `v`.
#[derive(Clone)]
pub struct InPlaceMember {
    pub p: CubeTensor,
    pub g: CubeTensor,
    pub m: CubeTensor,
    pub v: CubeTensor,
}

/// The scalars [`update_group_in_place`] reads from the device, in this order: `1 − lr·wd`,
/// `1 − β1`, β2, `1 − β2`, `lr / (1 − β1ᵗ)`, `√(1 − β2ᵗ)`, ε, the gradient's factor, and
/// apply (1: update; 0: write nothing, a step whose loss was not finite).
pub const DEVICE_SCALARS: usize = 9;

impl AdamWScalars {
    /// The [`DEVICE_SCALARS`] values, applied.
    pub fn device_values(&self) -> [f32; DEVICE_SCALARS] {
        [
            self.decay,
            self.one_minus_beta1,
            self.beta2,
            self.one_minus_beta2,
            self.step_size,
            self.bias_correction2_sqrt,
            self.eps,
            self.grad_factor,
            1.0,
        ]
    }
}

/// The updates of up to [`GROUP`] parameters in one launch, each written over its own
/// parameter and moments (no new buffer), the scalars read from `scalars` (`[DEVICE_SCALARS]`
/// f32 on their device): what a step whose graph is replayed needs, since the replay reads the
/// buffers it recorded, and its scalars change each step.
///
/// # Panics
/// With no member or more than [`GROUP`]: the caller's grouping is wrong.
pub fn update_group_in_place(members: Vec<InPlaceMember>, scalars: &CubeTensor) {
    assert!((1..=GROUP).contains(&members.len()), "1 to {GROUP} members");
    let client = members[0].p.client.clone();
    let slots = members
        .into_iter()
        .map(|member| [member.p, member.g, member.m, member.v]);
    let (ends, total, mut a) = super::laid_end_to_end::<4, GROUP>(slots.collect());
    let mut next = || a.next().expect("four tensors a slot");
    let (cube_count, cube_dim) = super::one_thread_each(&client, total.max(1));
    // Safety: thread `at` < Σn belongs to the one slot with end_{k−1} ≤ at < end_k and reads
    // and writes index at − end_{k−1} < n_k of that slot's tensors (n_k values each), no other
    // thread touching that index; threads past Σn return first; empty slots (the last member
    // repeated) are never chosen; `scalars` holds DEVICE_SCALARS values, indexed below it.
    unsafe {
        adamw_group_in_place::launch_unchecked(
            &client,
            cube_count,
            cube_dim,
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            scalars.clone().into_tensor_arg(),
            ends[0],
            ends[1],
            ends[2],
            ends[3],
        );
    }
    LAUNCHES.fetch_add(1, Ordering::Relaxed);
}
