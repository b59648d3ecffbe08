//! Memory measured with the counting allocator, against napkin's predictions.
//!
//! One binary with its own global allocator; the counters are process-wide, so every test
//! holds `ONE_AT_A_TIME` while it measures.

use std::sync::Mutex;

use napkin_core::config::{LlamaConfig, LoraConfig, Nf4Config};
use napkin_core::data::MicroBatch;
use napkin_core::device::DeviceKind;
use napkin_core::memory::CountingAllocator;
use napkin_core::memory::counting_alloc::{is_installed, live_bytes, peak_bytes, reset_peak};
use napkin_core::model::linear::BaseWeight;
use napkin_core::model::{Llama, TokenBatch, causal_lm_loss};
use napkin_core::predict::inventory::{Kind, Scenario, inventory, totals_by_kind};
use napkin_core::predict::weights::weight_bytes;
use napkin_core::predict::workspace::parameter_bytes;
use napkin_core::train::{StepGradients, StepOptions, forward_backward};

#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator;

mod attention;
mod chunked_loss;
mod cuda_pool;
mod dora;
mod dropout;
mod flex_products;
mod gguf_blocks;
mod grid;
mod held_out;
mod lora_case;
mod outer_lora;
mod preference;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn build(config: &LlamaConfig, nf4: Option<&Nf4Config>, autodiff: bool) -> Llama {
    build_on(DeviceKind::Cpu, config, nf4, autodiff)
}

/// [`build`] on another CPU backend.
fn build_on(
    kind: DeviceKind,
    config: &LlamaConfig,
    nf4: Option<&Nf4Config>,
    autodiff: bool,
) -> Llama {
    let device = kind.open().unwrap();
    let device = if autodiff { device.autodiff() } else { device };
    device.seed(7);
    let model = Llama::init(config, &device);
    match nf4 {
        Some(nf4) => model.quantize_nf4(nf4).unwrap(),
        None => model,
    }
}

/// One step's forward and backward with its loss read back: what these tests measure.
fn one_step(model: &Llama, micro: &[MicroBatch], checkpointing: bool) -> StepGradients {
    forward_backward(
        model,
        micro,
        &StepOptions::default().with_checkpointing(checkpointing),
    )
    .unwrap()
    .read()
}

/// The predictor's bytes by kind for `config` with these tricks and AdamW.
fn predicted_by_kind(
    config: &LlamaConfig,
    lora: Option<LoraConfig>,
    nf4: Option<Nf4Config>,
) -> std::collections::BTreeMap<Kind, u64> {
    totals_by_kind(&inventory(&Scenario {
        lora,
        nf4,
        ..Scenario::new(config.clone(), 1, 2)
    }))
}

fn mib(bytes: f64) -> String {
    format!("{:.3} MiB", bytes / (1024.0 * 1024.0))
}

#[test]
fn counting_allocator_is_installed() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    assert!(is_installed());
    // Large next to anything another thread (a pool still freeing an earlier test's tensors)
    // could release meanwhile; black_box keeps the optimiser from eliding it.
    let size = 256 << 20;
    let before = live_bytes();
    let v = std::hint::black_box(vec![1u8; size]);
    let during = live_bytes();
    drop(std::hint::black_box(v));
    assert!(during >= before + size / 2, "{during} vs {before}");
}

#[test]
fn resident_model_memory_is_within_3_percent_of_the_prediction() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let config = LlamaConfig::small();
    drop(build(&config, None, true)); // warm up the backend's one-time allocations
    for nf4 in [
        None,
        Some(Nf4Config::default()),
        Some(Nf4Config {
            block_size: 64,
            double_quant: true,
        }),
    ] {
        let before = live_bytes();
        let model = build(&config, nf4.as_ref(), true);
        let measured = (live_bytes() - before) as f64;
        // The predictor's inventory: the values of the resident arithmetic, tensor by tensor,
        // and burn's bookkeeping of each parameter tensor.
        let totals = predicted_by_kind(&config, None, nf4);
        let resident: u64 = [Kind::Weights, Kind::QuantCodes, Kind::QuantScales]
            .iter()
            .filter_map(|k| totals.get(k))
            .sum();
        let values = weight_bytes(&config, 4, nf4.as_ref()).total();
        let parameters = (config.num_hidden_layers * 2 + 3) as u64
            + if nf4.is_some() {
                0
            } else {
                7 * config.num_hidden_layers as u64
            };
        assert_eq!(resident, values + parameter_bytes() * parameters);
        let predicted = resident as f64;
        let ratio = measured / predicted;
        eprintln!(
            "resident, nf4={nf4:?}: measured {} predicted {} ratio {ratio:.4}",
            mib(measured),
            mib(predicted)
        );
        assert!(
            (ratio - 1.0).abs() <= 0.03,
            "nf4={nf4:?}: measured/predicted = {ratio:.4}"
        );
        drop(model);
    }
}

/// Extra bytes a LoRA forward + backward needs above the resident model, and the bytes the
/// gradients hold afterwards.
fn step_bytes(model: &Llama, batch: &TokenBatch, labels: &[i64]) -> (usize, usize) {
    let start = reset_peak();
    let grads = causal_lm_loss(model.forward(batch), labels)
        .unwrap()
        .mean()
        .backward();
    let peak = peak_bytes() - start;
    let held = live_bytes().saturating_sub(start);
    drop(grads);
    (peak, held)
}

#[test]
fn qlora_step_keeps_no_float_copy_of_the_base_weights() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let config = LlamaConfig::small();
    // A large rank, so that adapter gradients dwarf the bookkeeping of the step.
    let lora = LoraConfig {
        r: 64,
        ..Default::default()
    };
    let rows: Vec<Vec<u32>> = (0..2)
        .map(|b| {
            (0..64)
                .map(|t| ((b * 131 + t * 17) % 4096) as u32)
                .collect()
        })
        .collect();
    let batch = TokenBatch::from_rows(&rows).unwrap();
    let labels: Vec<i64> = batch.input_ids.iter().map(|&i| i as i64).collect();

    let dense = build(&config, None, true).with_lora(&lora).unwrap();
    let qlora = build(&config, Some(&Nf4Config::default()), true)
        .with_lora(&lora)
        .unwrap();
    assert!(
        qlora
            .block_linears()
            .iter()
            .all(|n| matches!(n.linear.base, BaseWeight::Nf4(_)))
    );
    step_bytes(&dense, &batch, &labels); // warm-up
    let (dense_peak, dense_held) = step_bytes(&dense, &batch, &labels);
    let (qlora_peak, qlora_held) = step_bytes(&qlora, &batch, &labels);

    let linear_f32: usize = config
        .block_linears()
        .iter()
        .map(|&(_, o, i)| 4 * o * i)
        .sum::<usize>()
        * config.num_hidden_layers;
    let largest_f32 = config
        .block_linears()
        .iter()
        .map(|&(_, o, i)| 4 * o * i)
        .max()
        .unwrap_or(0);
    let adapter_bytes = 4 * lora.trainable_parameters(&config) as usize;
    let predicted_grads = predicted_by_kind(&config, Some(lora.clone()), Some(Nf4Config::default()))
        [&Kind::Gradients] as f64;
    eprintln!(
        "step extra: dense-LoRA {} QLoRA {} (all block weights in f32: {}, largest one: {}); gradients held: {} / {} (adapters: {})",
        mib(dense_peak as f64),
        mib(qlora_peak as f64),
        mib(linear_f32 as f64),
        mib(largest_f32 as f64),
        mib(dense_held as f64),
        mib(qlora_held as f64),
        mib(adapter_bytes as f64),
    );
    // Saving the dequantized weights for backward would add all of them; on-the-fly
    // dequantization adds at most a couple of transient ones.
    assert!(
        qlora_peak <= dense_peak + 2 * largest_f32,
        "QLoRA step peak {qlora_peak} vs dense-LoRA {dense_peak}: more than two transient weights"
    );
    // Gradients exist for the adapters only (A and B of 7 linears per block, and the map that
    // holds them): no weight-shaped gradient.
    let adapter_tensors = 2 * 7 * config.num_hidden_layers as u64;
    let map = napkin_core::predict::workspace::gradient_map_bytes(adapter_tensors);
    assert_eq!(
        predicted_grads,
        (adapter_bytes as u64 + map) as f64,
        "the inventory's gradients"
    );
    for held in [dense_held, qlora_held] {
        let ratio = held as f64 / predicted_grads;
        assert!(
            (ratio - 1.0).abs() <= 0.03,
            "gradients hold {held} bytes, the inventory predicts {predicted_grads}"
        );
    }
}

#[test]
fn nf4_custom_backward_saves_the_dequantized_weights_that_plain_autodiff_keeps() {
    use napkin_core::model::nf4_matmul::{nf4_matmul, nf4_matmul_saving_weight};
    use napkin_core::model::nf4_weight::Nf4Weight;
    use napkin_core::quant::nf4::Nf4Tensor;
    use std::sync::Arc;

    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (out, inp, layers, tokens) = (688, 256, 8, 32);
    let values: Vec<f32> = (0..out * inp)
        .map(|i| ((i * 7919 % 2003) as f32 / 2003.0 - 0.5) * 0.04)
        .collect();
    let device = DeviceKind::Cpu.open().unwrap().autodiff();
    let weights: Vec<Nf4Weight> = (0..layers)
        .map(|_| {
            let q = Nf4Tensor::quantize(&values, &[out, inp], &Nf4Config::default()).unwrap();
            Nf4Weight::new(Arc::new(q), &device)
        })
        .collect();
    let x = burn::tensor::Tensor::<2>::ones([tokens, inp], &device).require_grad();

    // Peak extra bytes of a forward through every weight and its backward.
    let measure = |op: &dyn Fn(burn::tensor::Tensor<2>, &Nf4Weight) -> burn::tensor::Tensor<2>| {
        let start = reset_peak();
        let y = weights
            .iter()
            .map(|w| op(x.clone(), w))
            .reduce(|a, b| a + b)
            .unwrap();
        let grads = y.sum().backward();
        let peak = peak_bytes() - start;
        drop(grads);
        peak
    };
    measure(&|x, w| nf4_matmul(x, w)); // warm-up
    let custom = measure(&|x, w| nf4_matmul(x, w));
    let naive = measure(&|x, w| nf4_matmul_saving_weight(x, w));
    let weight_f32 = 4 * out * inp;
    eprintln!(
        "{layers} NF4 matmuls [{tokens}x{inp}]·[{inp}x{out}]: peak extra custom backward {}, plain autodiff {} (one weight in f32: {})",
        mib(custom as f64),
        mib(naive as f64),
        mib(weight_f32 as f64)
    );
    // Plain autodiff keeps all eight float weights; the custom op at most a couple of transients.
    assert!(
        naive >= custom + (layers - 2) * weight_f32,
        "naive {naive} vs custom {custom}"
    );
    assert!(custom <= 3 * weight_f32, "custom backward peak {custom}");
}

#[test]
fn adamw_state_of_a_lora_step_is_two_moments_per_adapter_value() {
    use napkin_core::train::{AdamW, AdamWConfig};
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let config = LlamaConfig::small();
    let lora = LoraConfig {
        r: 64,
        ..Default::default()
    };
    let batch =
        TokenBatch::from_rows(&[(0..64).map(|t| (t * 37 % 4096) as u32).collect()]).unwrap();
    let labels: Vec<i64> = batch.input_ids.iter().map(|&i| i as i64).collect();
    let mut model = build(&config, Some(&Nf4Config::default()), true)
        .with_lora(&lora)
        .unwrap();
    let mut adamw = AdamW::new(AdamWConfig::default());
    let adapter_bytes = 4 * lora.trainable_parameters(&config) as usize;
    let predicted_state = predicted_by_kind(&config, Some(lora.clone()), Some(Nf4Config::default()))
        [&Kind::OptimizerState] as f64;
    // A forward and backward of the same shapes first, so that buffers the thread pool's GEMMs
    // keep per thread (allocated on a thread's first product of a size, kept after) exist
    // before anything is measured (a guess at why this test once failed in a full run of this
    // binary with a later step's growth; not reproduced in 20 runs alone).
    drop(
        causal_lm_loss(model.forward(&batch), &labels)
            .unwrap()
            .mean()
            .backward(),
    );
    for step in 0..3 {
        let before = live_bytes();
        let mut backward = causal_lm_loss(model.forward(&batch), &labels)
            .unwrap()
            .mean()
            .backward();
        let grads = napkin_core::train::ParamGrads::from_backward(&model, &mut backward);
        drop(backward);
        model = adamw.step(model, &grads, 1e-3);
        drop(grads);
        // What the step leaves behind: the first allocates the two moments, later ones nothing.
        let grown = live_bytes() as f64 - before as f64;
        let expected = if step == 0 { predicted_state } else { 0.0 };
        eprintln!(
            "AdamW step {step}: live bytes grew by {} (expected {})",
            mib(grown),
            mib(expected)
        );
        assert!(
            (grown - expected).abs() <= 0.03 * adapter_bytes as f64,
            "step {step}: {grown} vs {expected}"
        );
    }
    assert_eq!(adamw.state_bytes() as usize, 2 * adapter_bytes);
}

#[test]
fn our_lora_forms_no_weight_shaped_tensor_where_burns_apply_lora_does() {
    use burn::module::{Lora, Module};
    use burn::nn::LinearConfig;
    use burn::tensor::{Distribution, Tensor};
    use napkin_core::model::linear::Linear;
    use napkin_core::model::lora::LoraAdapter;

    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (out, inp, layers, tokens, r) = (688, 256, 8, 32, 8);
    let device = DeviceKind::Cpu.open().unwrap().autodiff();
    device.seed(3);
    let x = Tensor::<3>::random([1, tokens, inp], Distribution::Normal(0.0, 1.0), &device);

    // Ours: frozen dense W, adapters A [r, in], B [out, r] (B ≠ 0 so every path is exercised).
    let ours: Vec<Linear> = (0..layers)
        .map(|_| {
            let mut l = Linear::init(out, inp, &device);
            l.base = match l.base {
                napkin_core::model::linear::BaseWeight::Dense(w) => {
                    napkin_core::model::linear::BaseWeight::Dense(w.set_require_grad(false))
                }
                other => other,
            };
            let a = Tensor::random([r, inp], Distribution::Normal(0.0, 0.05), &device);
            let b = Tensor::random([out, r], Distribution::Normal(0.0, 0.05), &device);
            l.lora = Some(LoraAdapter::from_weights(a, b, 2.0, 0.0));
            l
        })
        .collect();
    // burn's: the same shapes through `Module::apply_lora` (a reparameterised weight W + s·AB).
    let burns = (0..layers)
        .map(|_| LinearConfig::new(inp, out).with_bias(false).init(&device))
        .collect::<Vec<_>>()
        .apply_lora(Lora::new(r, 16.0));

    let peak_of = |forward: &dyn Fn() -> Tensor<3>| {
        let start = reset_peak();
        let grads = forward().sum().backward();
        let peak = peak_bytes() - start;
        drop(grads);
        peak
    };
    let ours_fwd = || {
        ours.iter()
            .map(|l| l.forward(x.clone()))
            .reduce(|a, b| a + b)
            .unwrap()
    };
    let burn_fwd = || {
        burns
            .iter()
            .map(|l| l.forward(x.clone()))
            .reduce(|a, b| a + b)
            .unwrap()
    };
    peak_of(&ours_fwd);
    peak_of(&burn_fwd); // warm-ups
    let ours_peak = peak_of(&ours_fwd);
    let burn_peak = peak_of(&burn_fwd);
    let weight = 4 * out * inp;
    eprintln!(
        "{layers} LoRA linears [{tokens}x{inp}]->{out}, r={r}: peak extra ours {}, burn apply_lora {} (one weight: {})",
        mib(ours_peak as f64),
        mib(burn_peak as f64),
        mib(weight as f64)
    );
    // burn keeps a merged W + s·AB per layer for the backward; ours keeps none (its peak is
    // the layer outputs and the adapter gradients, far below one weight per layer).
    assert!(
        ours_peak < layers * weight / 2,
        "our LoRA step peak {ours_peak}"
    );
    assert!(
        burn_peak >= ours_peak + (layers - 2) * weight,
        "burn {burn_peak} vs ours {ours_peak}"
    );
}

#[test]
fn block_checkpointing_cuts_the_step_peak() {
    use napkin_core::data::MicroBatch;
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let config = LlamaConfig::small();
    let lora = LoraConfig {
        r: 8,
        ..Default::default()
    };
    let model = build(&config, Some(&Nf4Config::default()), true)
        .with_lora(&lora)
        .unwrap();
    let (b, t) = (1, 256);
    let batch =
        TokenBatch::from_rows(&[(0..t).map(|i| (i * 31 % 4096) as u32).collect::<Vec<_>>()])
            .unwrap();
    let micro = [MicroBatch::causal(batch)];
    let peak = |checkpointing: bool| {
        let start = reset_peak();
        let out = one_step(&model, &micro, checkpointing);
        let peak = peak_bytes() - start;
        drop(out);
        peak
    };
    peak(false); // warm-up
    let (plain, ckpt) = (peak(false), peak(true));
    let block_input = 4 * b * t * config.hidden_size;
    eprintln!(
        "QLoRA step peak above the model, T={t}: plain {} checkpointed {} (one block input: {})",
        mib(plain as f64),
        mib(ckpt as f64),
        mib(block_input as f64)
    );
    // Plain keeps every block's working set; checkpointing keeps block inputs plus one block's.
    assert!(
        ckpt * 2 < plain,
        "checkpointing should at least halve the peak: {ckpt} vs {plain}"
    );
}

#[test]
fn half_precision_halves_the_frozen_base() {
    use burn::tensor::FloatDType;
    use napkin_core::data::MicroBatch;
    use napkin_core::model::autocast::autocast;
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let config = LlamaConfig::small();
    let device = DeviceKind::Flex.open().unwrap().autodiff();
    device.seed(7);
    let lora = LoraConfig {
        r: 8,
        ..Default::default()
    };
    let model = Llama::init(&config, &device).with_lora(&lora).unwrap();
    let block_linear_values: usize = config
        .block_linears()
        .iter()
        .map(|&(_, out, inp)| out * inp)
        .sum::<usize>()
        * config.num_hidden_layers;

    // Resident: the frozen block linears go from 4 to 2 bytes a value.
    let before = live_bytes();
    let half = model.clone().cast_frozen_base(FloatDType::BF16);
    let added = live_bytes() - before;
    let saved_predicted = 2 * block_linear_values;
    eprintln!(
        "bf16 frozen base: {} for {} values (predicted {})",
        mib(added as f64),
        block_linear_values,
        mib(saved_predicted as f64)
    );
    let ratio = added as f64 / saved_predicted as f64;
    assert!(
        (0.99..1.03).contains(&ratio),
        "bf16 copy {added} vs {saved_predicted} bytes"
    );

    // A LoRA step's peak above the models: f32 vs bf16 (base stored and computed in bf16).
    let t = 256;
    let batch =
        TokenBatch::from_rows(&[(0..t).map(|i| (i * 31 % 4096) as u32).collect::<Vec<_>>()])
            .unwrap();
    let micro = [MicroBatch::causal(batch)];
    let peak = |model: &Llama, dtype: Option<FloatDType>| {
        let _precision = autocast(dtype);
        let start = reset_peak();
        let out = one_step(model, &micro, false);
        let peak = peak_bytes() - start;
        drop(out);
        peak
    };
    peak(&model, None); // warm-up
    let (f32_peak, bf16_peak) = (peak(&model, None), peak(&half, Some(FloatDType::BF16)));
    eprintln!(
        "LoRA step peak above the model, T={t}: f32 compute {} bf16 autocast {}",
        mib(f32_peak as f64),
        mib(bf16_peak as f64)
    );
    // Reported, not asserted. Measured 57.2 vs 60.9 MiB: on Flex the step peak does not fall. Norms, softmax and the
    // loss stay f32 (as under torch.autocast), the bf16 casts of each matmul's input are
    // saved beside the f32 tensors other ops keep, and Flex's bf16 GEMM widens its operands to
    // f32 internally. What half precision saves here is the resident base, asserted above.
}

/// Writing a merged QLoRA model holds one tensor at a time: the heap peak above the quantized
/// model is a few times its largest tensor, not the merged model (measured against the
/// in-memory merge, which holds the dense model and then its serialized bytes).
#[test]
fn writing_a_merged_model_holds_one_tensor_at_a_time() {
    use napkin_core::io::hf::hf_files;
    use napkin_core::io::hf_writer::{WeightDtype, WeightLayout, write_hf_weights};
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let config = LlamaConfig {
        num_hidden_layers: 8,
        ..LlamaConfig::small()
    };
    let nf4 = Nf4Config {
        block_size: 64,
        double_quant: true,
    };
    let lora = LoraConfig {
        r: 8,
        ..LoraConfig::default()
    };
    let model = build(&config, Some(&nf4), false).with_lora(&lora).unwrap();
    let dense_bytes = 4 * config.num_parameters() as usize;
    let largest = 4 * config
        .hf_parameter_shapes()
        .iter()
        .map(|(_, s)| s.iter().product::<usize>())
        .max()
        .unwrap();
    let out = std::env::temp_dir().join(format!("napkin-merged-mem-{}", std::process::id()));
    let layout = WeightLayout {
        dtype: WeightDtype::Bf16,
        max_shard_bytes: 1 << 20,
        merge_lora: true,
    };
    write_hf_weights(&model, &out, layout).unwrap(); // warm-up

    let before = live_bytes();
    reset_peak();
    write_hf_weights(&model, &out, layout).unwrap();
    let streamed = peak_bytes().saturating_sub(before);

    reset_peak();
    let (merged, _) = model.clone().merge_lora();
    let files = hf_files(&merged).unwrap();
    let in_memory = peak_bytes().saturating_sub(before);
    drop((merged, files));
    std::fs::remove_dir_all(&out).ok();
    eprintln!(
        "merged {} (dense f32 {}, largest tensor {}): streamed write peak +{}, in-memory merge + serialize +{}",
        config.num_parameters(),
        mib(dense_bytes as f64),
        mib(largest as f64),
        mib(streamed as f64),
        mib(in_memory as f64)
    );
    assert!(
        streamed <= 4 * largest,
        "streamed write peak {streamed} B vs largest tensor {largest} B"
    );
    assert!(
        in_memory >= dense_bytes,
        "the in-memory path holds the dense model: {in_memory} vs {dense_bytes}"
    );
}

/// The packed NF4 codes of every block linear, in module order.
fn nf4_codes(model: &Llama) -> Vec<Vec<u8>> {
    model
        .block_linears()
        .iter()
        .map(|n| match &n.linear.base {
            BaseWeight::Nf4(w) => w.quantized.packed.clone(),
            BaseWeight::Dense(_) => panic!("{} is not NF4", n.path),
        })
        .collect()
}

/// A random NF4 model is quantized block by block as it is made (`Llama::init_nf4`, used by
/// `napkin measure --preset` and the sandbox): the same codes as initialising in f32 and then
/// quantizing, with a heap peak of about one f32 block above the quantized model instead of
/// the whole f32 model.
#[test]
fn a_random_nf4_model_never_holds_its_f32_weights() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let config = LlamaConfig {
        num_hidden_layers: 8,
        ..LlamaConfig::small()
    };
    let nf4 = Nf4Config {
        block_size: 64,
        double_quant: true,
    };
    let device = DeviceKind::Cpu.open().unwrap();
    drop(build(&config, Some(&nf4), false)); // warm-up

    let before = live_bytes();
    reset_peak();
    device.seed(7);
    let whole = Llama::init(&config, &device).quantize_nf4(&nf4).unwrap();
    let whole_peak = peak_bytes().saturating_sub(before);
    let whole_codes = nf4_codes(&whole);
    drop(whole);

    let before = live_bytes();
    reset_peak();
    device.seed(7);
    let streamed = Llama::init_nf4(&config, &device, &nf4).unwrap();
    let streamed_peak = peak_bytes().saturating_sub(before);
    let streamed_codes = nf4_codes(&streamed);
    assert!(
        streamed_codes == whole_codes,
        "the same random draws, the same codes"
    );

    let block_f32 = 4 * config.block_parameters() as usize;
    eprintln!(
        "random NF4 model, 8 blocks: heap peak +{} block by block, +{} f32 first (one f32 block {})",
        mib(streamed_peak as f64),
        mib(whole_peak as f64),
        mib(block_f32 as f64)
    );
    assert!(
        whole_peak.saturating_sub(streamed_peak) >= 6 * block_f32,
        "block by block {streamed_peak} B vs f32 first {whole_peak} B"
    );
}

/// The predictor's `parameter_bytes()`, counted where it happens: a hundred one-value parameters
/// made on each CPU backend's autodiff device cost their values plus this much each, within 5 %.
#[test]
fn a_parameter_costs_the_predicted_bookkeeping() {
    use burn::module::Param;
    use burn::tensor::Tensor;
    use napkin_core::predict::workspace::parameter_bytes;
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for kind in DeviceKind::cpu_backends() {
        let device = kind.open().unwrap().autodiff();
        let make = || Param::from_tensor(Tensor::<1>::zeros([1], &device));
        let warm: Vec<Param<Tensor<1>>> = (0..4).map(|_| make()).collect();
        let before = live_bytes();
        let params: Vec<Param<Tensor<1>>> = (0..100).map(|_| make()).collect();
        let each = (live_bytes() - before) as f64 / 100.0;
        drop((params, warm));
        let ratio = each / parameter_bytes() as f64;
        eprintln!(
            "{kind}: {each:.0} bytes a parameter, {ratio:.3} of the prediction (tensor handles of {} bytes)",
            napkin_core::predict::workspace::tensor_handle_bytes()
        );
        assert!((ratio - 1.0).abs() <= 0.05, "{kind}: {each} bytes");
    }
}
