//! AdamW on a GPU backend as one cubecl launch per parameter (`kernels/gpu/adamw.rs`) against the
//! CPU's AdamW (one pass on host values), over three steps from zero moments: the parameter and
//! both moments agree within a few f32 ulps (a GPU compiler may fuse a product and a sum). A
//! step's grouped launches (four parameters each) give the one-launch-each results bit for bit.

use burn::module::ParamId;
use burn::tensor::{Device, Tensor, TensorData};
use napkin_core::device::cpu;
use napkin_core::kernels::gpu::adamw::{AdamWScalars, launches, update};
use napkin_core::train::adamw::{AdamW, AdamWConfig};

use super::{ONE_AT_A_TIME, wgpu_device};

/// An odd length, so the last cube is partly idle.
const N: usize = 10_007;

/// Seeded values in [-scale, scale).
fn values(seed: u64, scale: f32) -> Vec<f32> {
    super::seeded_values(seed, N, scale)
}

fn tensor(v: &[f32], device: &Device) -> Tensor<1> {
    Tensor::from_data(TensorData::new(v.to_vec(), [v.len()]), device)
}

fn host(t: Tensor<1>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().unwrap()
}

/// (parameter, m, v) after three steps of `AdamW::update` on `device`.
fn three_steps(device: &Device) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut opt = AdamW::new(AdamWConfig::default());
    let id = ParamId::new();
    let mut p = tensor(&values(1, 0.5), device);
    for step in 0..3 {
        opt.begin_step();
        p = opt.update(id, p, tensor(&values(10 + step, 0.01), device), 1e-3);
    }
    let m = opt.moments(id).expect("moments after a step").clone();
    (host(p), host(m.exp_avg), host(m.exp_avg_sq))
}

/// Largest |a − b| over the largest |b|.
fn relative_gap(a: &[f32], b: &[f32]) -> f32 {
    let gap = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max);
    gap / b.iter().map(|y| y.abs()).fold(f32::MIN_POSITIVE, f32::max)
}

#[test]
fn adamw_on_the_gpu_equals_the_cpus_within_a_few_ulps() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let gpu = three_steps(&wgpu_device());
    let cpu = three_steps(&cpu());
    let start = values(1, 0.5);
    assert!(relative_gap(&cpu.0, &start) > 1e-4, "the parameter moved");
    for (what, g, c) in [
        ("p", &gpu.0, &cpu.0),
        ("m", &gpu.1, &cpu.1),
        ("v", &gpu.2, &cpu.2),
    ] {
        let gap = relative_gap(g, c);
        println!("{what}: relative gap {gap:.2e}");
        assert!(
            gap < 1e-6,
            "{what}: GPU and CPU AdamW differ by {gap:e} (relative)"
        );
    }
}

/// On a GPU `AdamW::update` launches the one-pass kernel once per parameter (counted at the
/// launch; none on the CPU) and returns its result bit for bit.
#[test]
fn adamw_update_on_a_gpu_is_the_kernels_result() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device();
    let p = tensor(&values(1, 0.5), &device);
    let g = tensor(&values(10, 0.01), &device);
    let mut opt = AdamW::new(AdamWConfig::default());
    opt.begin_step();
    let before = launches();
    let through_optimizer = host(opt.update(ParamId::new(), p.clone(), g.clone(), 1e-3));
    assert_eq!(
        launches() - before,
        1,
        "AdamW::update on a GPU launches the one-pass kernel once"
    );
    let on_cpu = AdamW::new(AdamWConfig::default()).update(
        ParamId::new(),
        tensor(&values(1, 0.5), &cpu()),
        tensor(&values(10, 0.01), &cpu()),
        1e-3,
    );
    drop(on_cpu);
    assert_eq!(launches() - before, 1, "the CPU backends do not launch it");

    let c = AdamWConfig::default();
    let lr = 1e-3;
    let scalars = AdamWScalars {
        decay: (1.0 - lr * c.weight_decay) as f32,
        one_minus_beta1: (1.0 - c.beta1) as f32,
        beta2: c.beta2 as f32,
        one_minus_beta2: (1.0 - c.beta2) as f32,
        step_size: (lr / (1.0 - c.beta1)) as f32,
        bias_correction2_sqrt: (1.0 - c.beta2).sqrt() as f32,
        eps: c.eps as f32,
        grad_factor: 1.0,
    };
    let cube = |t: Tensor<1>| t.try_into_primitive::<burn::backend::Cube>().unwrap();
    let (p_new, _, _) = update(cube(p), cube(g), None, &scalars);
    let direct = host(Tensor::from_primitive::<burn::backend::Cube>(p_new));
    assert_eq!(through_optimizer, direct);
}

/// A step of `AdamW::step` over nine parameters of odd lengths launches the grouped kernel three
/// times (four parameters a launch), and gives every parameter and moment of the one-launch-each
/// kernel bit for bit: on the first step (no moments) and on the next.
#[test]
fn grouped_updates_equal_one_launch_each_bit_for_bit() {
    use burn::module::{Module, Param};
    use napkin_core::kernels::gpu::adamw::GROUP;
    use napkin_core::train::grads::ParamGrads;

    #[derive(Module, Debug)]
    struct Nine {
        tensors: Vec<Param<Tensor<1>>>,
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device();
    let lengths = [1usize, 7, 64, 1000, 3, 10_007, 5, 129, 2];
    let model = Nine {
        tensors: lengths
            .iter()
            .enumerate()
            .map(|(i, &n)| Param::from_tensor(tensor(&values(i as u64, 0.5)[..n], &device)))
            .collect(),
    };
    let ids: Vec<ParamId> = model.tensors.iter().map(|p| p.id).collect();
    let grads_of = |step: u64| {
        let mut grads = ParamGrads::new();
        for (i, (&id, &n)) in ids.iter().zip(&lengths).enumerate() {
            let g = values(100 * step + i as u64, 0.01);
            grads.insert(id, tensor(&g[..n], &device));
        }
        grads
    };
    // One launch each: AdamW::update outside a grouped step.
    let mut single = AdamW::new(AdamWConfig::default());
    let mut separate: Vec<Tensor<1>> = model.tensors.iter().map(|p| p.val()).collect();
    let mut grouped_opt = AdamW::new(AdamWConfig::default());
    let mut grouped = model;
    for step in 1..=2u64 {
        let grads = grads_of(step);
        single.begin_step();
        for (i, id) in ids.iter().enumerate() {
            let g = grads.get(*id).expect("a gradient").clone();
            separate[i] = single.update(*id, separate[i].clone(), g, 1e-3);
        }
        let before = launches();
        grouped = grouped_opt.step(grouped, &grads, 1e-3);
        assert_eq!(
            launches() - before,
            lengths.len().div_ceil(GROUP) as u64,
            "step {step}: launches of the grouped kernel"
        );
        for (i, (p, id)) in grouped.tensors.iter().zip(&ids).enumerate() {
            assert_eq!(
                host(p.val()),
                host(separate[i].clone()),
                "step {step}, p{i}"
            );
            let (a, b) = (
                grouped_opt.moments(*id).unwrap(),
                single.moments(*id).unwrap(),
            );
            assert_eq!(
                host(a.exp_avg.clone()),
                host(b.exp_avg.clone()),
                "step {step}, m{i}"
            );
            let (va, vb) = (a.exp_avg_sq.clone(), b.exp_avg_sq.clone());
            assert_eq!(host(va), host(vb), "step {step}, v{i}");
        }
    }
}

/// With `set_in_place(true)` a step writes each update over the parameter's and moments' own
/// buffers (a tensor held from before the step reads the new values), with the values of the
/// grouped kernel's new buffers bit for bit, on the first step (moments from zeros) and the next.
#[test]
fn updates_written_in_place_equal_the_grouped_kernels_bit_for_bit() {
    use burn::module::{Module, Param};
    use napkin_core::train::grads::ParamGrads;

    #[derive(Module, Debug)]
    struct Five {
        tensors: Vec<Param<Tensor<1>>>,
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let device = wgpu_device();
    let lengths = [1usize, 10_007, 64, 3, 129];
    let make = || Five {
        tensors: lengths
            .iter()
            .enumerate()
            .map(|(i, &n)| Param::from_tensor(tensor(&values(i as u64, 0.5)[..n], &device)))
            .collect(),
    };
    let (mut fresh, mut in_place) = (make(), make());
    let grads_of = |model: &Five, step: u64| {
        let mut grads = ParamGrads::new();
        for (i, (p, &n)) in model.tensors.iter().zip(&lengths).enumerate() {
            grads.insert(
                p.id,
                tensor(&values(100 * step + i as u64, 0.01)[..n], &device),
            );
        }
        grads
    };
    let (mut a, mut b) = (
        AdamW::new(AdamWConfig::default()),
        AdamW::new(AdamWConfig::default()),
    );
    b.set_in_place(true);
    for step in 1..=2u64 {
        let held: Vec<Tensor<1>> = in_place.tensors.iter().map(|p| p.val()).collect();
        let (ga, gb) = (grads_of(&fresh, step), grads_of(&in_place, step));
        fresh = a.step(fresh, &ga, 1e-3);
        in_place = b.step(in_place, &gb, 1e-3);
        for (i, ((p, q), before)) in fresh
            .tensors
            .iter()
            .zip(&in_place.tensors)
            .zip(held)
            .enumerate()
        {
            let updated = host(q.val());
            assert_eq!(host(p.val()), updated, "step {step}, p{i}");
            assert_eq!(
                host(before),
                updated,
                "step {step}, p{i}: the tensor held from before the step was not written over"
            );
            let (ma, mb) = (a.moments(p.id).unwrap(), b.moments(q.id).unwrap());
            assert_eq!(host(ma.exp_avg.clone()), host(mb.exp_avg.clone()), "m{i}");
            assert_eq!(
                host(ma.exp_avg_sq.clone()),
                host(mb.exp_avg_sq.clone()),
                "v{i}"
            );
        }
    }
}
