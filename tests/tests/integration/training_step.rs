//! The step's tricks against the fixtures: token-weighted gradient accumulation equals the
//! big-batch gradient (and the naive mean of means does not), and block-level gradient
//! checkpointing and the memory-efficient attention leave every gradient unchanged.

use napkin_core::config::AttentionKind;
use napkin_core::data::MicroBatch;
use napkin_core::device::DeviceKind;
use napkin_core::io::load_hf_llama;
use napkin_core::io::peft::PEFT_PREFIX;
use napkin_core::kernels::values::to_f32_vec;
use napkin_core::model::{Llama, TokenBatch};
use napkin_core::train::{Accumulation, ParamGrads, StepOptions, forward_backward, held_out_loss};
use napkin_tests::{Reference, assert_close, max_errors, model_dirs};

/// The fixture's two rows as two micro-batches of one row, with the masked labels.
fn masked_micro_batches(reference: &Reference) -> (Vec<MicroBatch>, MicroBatch) {
    let (shape, ids) = reference.i64("input_ids");
    let (_, labels) = reference.i64("accum_masked.labels");
    let t = shape[1];
    let row = |b: usize| {
        ids[b * t..(b + 1) * t]
            .iter()
            .map(|&i| i as u32)
            .collect::<Vec<u32>>()
    };
    let micro = (0..shape[0])
        .map(|b| MicroBatch {
            batch: TokenBatch::single(&row(b)).unwrap(),
            labels: labels[b * t..(b + 1) * t].to_vec(),
        })
        .collect();
    let rows: Vec<Vec<u32>> = (0..shape[0]).map(row).collect();
    let big = MicroBatch {
        batch: TokenBatch::from_rows(&rows).unwrap(),
        labels,
    };
    (micro, big)
}

fn lora_model(dir: &std::path::Path) -> Llama {
    let device = DeviceKind::Cpu.open().unwrap().autodiff();
    load_hf_llama(dir, &device)
        .unwrap()
        .load_lora(&dir.join("lora"))
        .unwrap()
        .0
}

/// Each adapter's gradient, with its peft name.
fn adapter_grads(model: &Llama, grads: &ParamGrads) -> Vec<(String, Vec<f32>)> {
    let mut out = Vec::new();
    for (path, _, a) in model.lora_adapters() {
        for (name, p) in [("lora_A", &a.lora_a), ("lora_B", &a.lora_b)] {
            let g = grads
                .get(p.id)
                .unwrap_or_else(|| panic!("no gradient for {path}.{name}"));
            out.push((
                format!("{PEFT_PREFIX}{path}.{name}.weight"),
                to_f32_vec(g.clone()),
            ));
        }
    }
    out
}

#[test]
fn token_weighted_accumulation_equals_the_big_batch_and_naive_does_not() {
    for dir in model_dirs() {
        let reference = Reference::open(&dir);
        let model = lora_model(&dir);
        let (micro, big) = masked_micro_batches(&reference);
        // The fixture masks the second row's labels from position 6: with 6 positions or
        // fewer nothing is masked, the micro-batches count the same tokens, and the naive mean
        // of means then IS the batch gradient (the negative case turns into an equality).
        let counts: Vec<usize> = micro.iter().map(MicroBatch::label_tokens).collect();
        let unequal = counts.iter().any(|&c| c != counts[0]);

        let batch = forward_backward(&model, &[big], &StepOptions::default())
            .unwrap()
            .read();
        let accum = forward_backward(&model, &micro, &StepOptions::default())
            .unwrap()
            .read();
        let naive = forward_backward(
            &model,
            &micro,
            &StepOptions::default().with_accumulation(Accumulation::MeanOfMeans),
        )
        .unwrap()
        .read();
        assert!((batch.loss - reference.scalar("accum_masked.batch_loss")).abs() <= 1e-5);
        assert!(
            (accum.loss - batch.loss).abs() <= 1e-6,
            "{}: {} vs {}",
            reference.name,
            accum.loss,
            batch.loss
        );

        let mut naive_gap = 0.0f32;
        for (((name, a), (_, b)), (_, n)) in adapter_grads(&model, &accum.grads)
            .iter()
            .zip(adapter_grads(&model, &batch.grads))
            .zip(adapter_grads(&model, &naive.grads))
        {
            let what = |t: &str| format!("{}: {t} {name}", reference.name);
            assert_close(
                &what("batch"),
                &b,
                &reference.f32(&format!("accum_masked.batch_grad.{name}")).1,
                1e-5,
                1e-4,
            );
            assert_close(
                &what("accumulated"),
                a,
                &reference.f32(&format!("accum_masked.accum_grad.{name}")).1,
                1e-5,
                1e-4,
            );
            assert_close(
                &what("naive"),
                &n,
                &reference.f32(&format!("accum_masked.naive_grad.{name}")).1,
                1e-5,
                1e-4,
            );
            naive_gap = naive_gap.max(max_errors(&n, &b).0);
        }
        // The negative case: averaging per-micro-batch means is NOT the batch gradient when
        // the micro-batches count different tokens, and is when they count the same.
        if unequal {
            assert!(
                naive_gap > 1e-3,
                "{}: the naive accumulation should differ, max gap {naive_gap}",
                reference.name
            );
        } else {
            assert!(
                naive_gap <= 1e-5,
                "{}: equal token counts {counts:?}, yet the naive accumulation differs by {naive_gap}",
                reference.name
            );
        }
        eprintln!(
            "{}: label tokens {counts:?}, the naive accumulation off the batch gradient by up to \
             {naive_gap:.3}",
            reference.name
        );
    }
}

/// Checkpointing, the efficient attention, and both together, each against the plain step
/// with the eager attention.
#[test]
fn block_checkpointing_leaves_every_gradient_unchanged() {
    for dir in model_dirs() {
        let reference = Reference::open(&dir);
        let (micro, _) = masked_micro_batches(&reference);
        // LoRA (frozen base) and full fine-tuning (every parameter, tied embeddings included).
        let full = load_hf_llama(&dir, &DeviceKind::Cpu.open().unwrap().autodiff()).unwrap();
        let variants = [
            (AttentionKind::Eager, true),
            (AttentionKind::Efficient, false),
            (AttentionKind::Efficient, true),
        ];
        for ((what, model), (attention, checkpointing)) in
            [("lora", lora_model(&dir)), ("full", full)]
                .into_iter()
                .flat_map(|m| variants.map(|v| (m.clone(), v)))
        {
            let what = format!("{what}, {attention} attention, checkpointing {checkpointing}");
            let plain = forward_backward(&model, &micro, &StepOptions::default())
                .unwrap()
                .read();
            let mut variant = model.clone();
            variant.attention = attention;
            let ckpt = forward_backward(
                &variant,
                &micro,
                &StepOptions::default().with_checkpointing(checkpointing),
            )
            .unwrap()
            .read();
            assert_eq!(
                plain.grads.len(),
                ckpt.grads.len(),
                "{}: {what}",
                reference.name
            );
            assert!((plain.loss - ckpt.loss).abs() <= 1e-6);
            let worst = worst_gradient_gap(
                &format!("{}: {what}", reference.name),
                &model,
                &ckpt.grads,
                &plain.grads,
            );
            eprintln!(
                "{} {what}: vs the plain eager step, max gradient diff {worst:.2e}",
                reference.name
            );
        }
    }
}

/// The head and loss a chunk of rows at a time (`--chunked-loss`) give the whole-logits step's
/// loss and adapter gradients, on the fixtures' two masked rows as one micro-batch, with chunks
/// of 1 row, of odd sizes that straddle the rows' boundary, of all rows but one and of more
/// rows than there are, with and without checkpointing, and the graph-free held-out loss
/// chunked the same way (within 1e-6 relative); a head that trains is refused.
#[test]
fn the_chunked_loss_gives_the_whole_logits_step() {
    for dir in model_dirs() {
        let reference = Reference::open(&dir);
        let (_, big) = masked_micro_batches(&reference);
        let micro = vec![big];
        let rows = micro[0].labels.len();
        let model = lora_model(&dir);
        for checkpointing in [false, true] {
            let options = StepOptions::default().with_checkpointing(checkpointing);
            let whole = forward_backward(&model, &micro, &options).unwrap().read();
            for chunk in [1, 3, 7, rows - 1, 4 * rows] {
                let what = format!(
                    "{}: chunks of {chunk} of {rows} rows, checkpointing {checkpointing}",
                    reference.name
                );
                let chunked =
                    forward_backward(&model, &micro, &options.with_loss_chunk_rows(Some(chunk)))
                        .unwrap()
                        .read();
                assert!(
                    (chunked.loss - whole.loss).abs() <= 1e-6 * whole.loss.abs(),
                    "{what}: loss {} against {}",
                    chunked.loss,
                    whole.loss
                );
                assert_eq!(chunked.grads.len(), whole.grads.len(), "{what}");
                let worst = worst_gradient_gap(&what, &model, &chunked.grads, &whole.grads);
                eprintln!("{what}: max gradient diff {worst:.2e}");
                // The held-out evaluation, graph-free, chunked the same way.
                let held = held_out_loss(&model, &micro, Some(chunk)).unwrap();
                let held_whole = held_out_loss(&model, &micro, None).unwrap();
                assert_eq!(held.tokens, held_whole.tokens, "{what}");
                assert!(
                    (held.loss - held_whole.loss).abs() <= 1e-6 * held_whole.loss.abs(),
                    "{what}: held-out loss {} against {}",
                    held.loss,
                    held_whole.loss
                );
            }
        }
        let full = load_hf_llama(&dir, &DeviceKind::Cpu.open().unwrap().autodiff()).unwrap();
        let refused = forward_backward(
            &full,
            &micro,
            &StepOptions::default().with_loss_chunk_rows(Some(8)),
        );
        let message = refused.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            message.contains("--chunked-loss needs a frozen LM head"),
            "{}: full fine-tuning with the chunked loss: {message:?}",
            reference.name
        );
    }
}

/// A model with a sliding window (Mistral v0.1's `sliding_window`) of a third of the sequence:
/// the efficient attention, with and without checkpointing, gives the eager step's loss and
/// LoRA gradients (the eager mask is checked against transformers in `sliding_window.rs`), and
/// the window changes the loss (it bites).
#[test]
fn the_efficient_attention_windows_as_the_eager_one_does() {
    for dir in model_dirs() {
        let reference = Reference::open(&dir);
        let (micro, _) = masked_micro_batches(&reference);
        let t = micro[0].batch.seq;
        let mut model = lora_model(&dir);
        let unwindowed = forward_backward(&model, &micro, &StepOptions::default())
            .unwrap()
            .read();
        model.config.sliding_window = Some((t / 3).max(1));
        let eager = forward_backward(&model, &micro, &StepOptions::default())
            .unwrap()
            .read();
        assert!(
            (eager.loss - unwindowed.loss).abs() > 1e-4,
            "{}: the window of {} changes nothing",
            reference.name,
            t / 3
        );
        for checkpointing in [false, true] {
            let mut efficient = model.clone();
            efficient.attention = AttentionKind::Efficient;
            let options = StepOptions::default().with_checkpointing(checkpointing);
            let step = forward_backward(&efficient, &micro, &options)
                .unwrap()
                .read();
            assert!((step.loss - eager.loss).abs() <= 1e-6, "{}", reference.name);
            let worst = worst_gradient_gap(
                &format!(
                    "{}: windowed, checkpointing {checkpointing},",
                    reference.name
                ),
                &model,
                &step.grads,
                &eager.grads,
            );
            eprintln!(
                "{}: window {} of {t}, efficient attention, checkpointing {checkpointing}: \
                 max gradient diff {worst:.2e} vs eager",
                reference.name,
                t / 3
            );
        }
    }
}

/// `model` with LoRA dropout `p` on every adapter.
fn with_dropout(mut model: Llama, p: f64) -> Llama {
    for named in model.block_linears_mut() {
        if let Some(adapter) = &mut named.linear.lora {
            adapter.dropout = burn::nn::DropoutConfig::new(p).init();
        }
    }
    model
}

/// LoRA dropout 0.1 under checkpointing (peft's and the QLoRA paper's recipe): each block's
/// recomputation drops what its graph-free forward dropped, so every adapter gradient equals
/// the plain step's with the same dropout stream, with the eager and the efficient attention.
/// The masks are real: another stream, or no dropout, moves the gradients by far more than
/// the tolerance.
#[test]
fn checkpointing_with_lora_dropout_recomputes_the_first_forwards_masks() {
    for dir in model_dirs() {
        let reference = Reference::open(&dir);
        let (micro, _) = masked_micro_batches(&reference);
        let model = with_dropout(lora_model(&dir), 0.1);
        let step = |model: &Llama, checkpointing: bool, key: u64| {
            forward_backward(
                model,
                &micro,
                &StepOptions::default()
                    .with_checkpointing(checkpointing)
                    .with_dropout_key(key),
            )
            .unwrap()
            .read()
        };
        let largest_difference = |a: &ParamGrads, b: &ParamGrads| -> f32 {
            adapter_grads(&model, a)
                .into_iter()
                .zip(adapter_grads(&model, b))
                .flat_map(|((_, x), (_, y))| x.into_iter().zip(y).map(|(x, y)| (x - y).abs()))
                .fold(0.0, f32::max)
        };
        let plain = step(&model, false, 5);
        for attention in [AttentionKind::Eager, AttentionKind::Efficient] {
            let mut variant = model.clone();
            variant.attention = attention;
            let ckpt = step(&variant, true, 5);
            assert!(
                (plain.loss - ckpt.loss).abs() <= 1e-6,
                "{}: {} vs {}",
                reference.name,
                plain.loss,
                ckpt.loss
            );
            let worst = worst_gradient_gap(
                &format!("{}: dropout 0.1, {attention} checkpointed", reference.name),
                &model,
                &ckpt.grads,
                &plain.grads,
            );
            eprintln!(
                "{} dropout 0.1, {attention} attention, checkpointing: max gradient diff {worst:.2e}",
                reference.name
            );
        }
        let other_stream = largest_difference(&plain.grads, &step(&model, false, 6).grads);
        let no_dropout = largest_difference(
            &plain.grads,
            &step(&with_dropout(model.clone(), 0.0), false, 5).grads,
        );
        eprintln!(
            "{}: another stream moves a gradient by {other_stream:.2e}, no dropout by {no_dropout:.2e}",
            reference.name
        );
        assert!(
            other_stream > 1e-3 && no_dropout > 1e-3,
            "{}",
            reference.name
        );
    }
}

/// The largest gap between two steps' gradients of `model` (its adapters', else every
/// parameter's; `got` against `want`, matched by name), each parameter held to 1e-5 absolute
/// or 1e-4 relative; `label` begins a failure's message.
fn worst_gradient_gap(label: &str, model: &Llama, got: &ParamGrads, want: &ParamGrads) -> f32 {
    let got = adapter_or_all(model, got);
    let mut worst = 0.0f32;
    for (name, w) in adapter_or_all(model, want) {
        let (_, g) = got.iter().find(|(n, _)| *n == name).unwrap();
        worst = worst.max(assert_close(&format!("{label} {name}"), g, &w, 1e-5, 1e-4));
    }
    worst
}

/// Gradients of the adapters if any, else of every base parameter (by HF name).
fn adapter_or_all(model: &Llama, grads: &ParamGrads) -> Vec<(String, Vec<f32>)> {
    if !model.lora_adapters().is_empty() {
        return adapter_grads(model, grads);
    }
    let mut out = Vec::new();
    let mut visit = |name: String, id: burn::module::ParamId| {
        let g = grads
            .get(id)
            .unwrap_or_else(|| panic!("no gradient for {name}"));
        out.push((name, to_f32_vec(g.clone())));
    };
    visit("embed".into(), model.embed_tokens.id);
    for (i, block) in model.layers.iter().enumerate() {
        visit(
            format!("{i}.input_layernorm"),
            block.input_layernorm.weight.id,
        );
        visit(
            format!("{i}.post_attention_layernorm"),
            block.post_attention_layernorm.weight.id,
        );
    }
    for named in model.block_linears() {
        if let napkin_core::model::linear::BaseWeight::Dense(w) = &named.linear.base {
            visit(named.path.clone(), w.id);
        }
    }
    visit("norm".into(), model.norm.weight.id);
    out
}
