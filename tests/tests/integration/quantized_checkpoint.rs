//! napkin's NF4 checkpoint: writing and reading back gives the same codes, scales and logits,
//! and a damaged file is a typed error.

use napkin_core::config::Nf4Config;
use napkin_core::device::DeviceKind;
use napkin_core::io::quantized::{load_quantized, save_quantized};
use napkin_core::io::{load_hf_llama, load_model};
use napkin_core::kernels::values::to_f32_vec;
use napkin_core::model::TokenBatch;
use napkin_core::model::linear::BaseWeight;
use napkin_tests::model_dirs;

#[test]
fn quantized_checkpoint_round_trips_exactly() {
    let device = DeviceKind::Cpu.open().unwrap();
    let batch = TokenBatch::single(&[3, 1, 4, 1, 5, 9, 2, 6]).unwrap();
    for dir in model_dirs() {
        for double_quant in [false, true] {
            let nf4 = Nf4Config {
                block_size: 64,
                double_quant,
            };
            let model = load_hf_llama(&dir, &device)
                .unwrap()
                .quantize_nf4(&nf4)
                .unwrap();
            let out = std::env::temp_dir().join(format!(
                "napkin-q-{}-{double_quant}-{}",
                std::process::id(),
                dir.display().to_string().len()
            ));
            save_quantized(&model, &nf4, &out).unwrap();
            let (loaded, read_nf4) = load_quantized(&out, &device).unwrap();
            assert_eq!(read_nf4, nf4);
            for (a, b) in model.block_linears().iter().zip(loaded.block_linears()) {
                let (BaseWeight::Nf4(wa), BaseWeight::Nf4(wb)) = (&a.linear.base, &b.linear.base)
                else {
                    panic!("{}: not NF4 after loading", b.path);
                };
                assert_eq!(wa.quantized, wb.quantized, "{}", b.path);
            }
            assert_eq!(
                to_f32_vec(model.forward(&batch)),
                to_f32_vec(load_model(&out, &device).unwrap().forward(&batch))
            );

            // A truncated file is refused with a typed error.
            let file = out.join("model.safetensors");
            let bytes = std::fs::read(&file).unwrap();
            std::fs::write(&file, &bytes[..bytes.len() - 10]).unwrap();
            assert!(matches!(
                load_quantized(&out, &device),
                Err(napkin_core::Error::Checkpoint { .. })
            ));
            std::fs::remove_dir_all(&out).unwrap();
        }
    }
}

/// Quantizing each linear as it is read gives exactly the model that quantizing after a float
/// load gives (the loader never holds the float base whole).
#[test]
fn quantizing_while_loading_equals_quantizing_after() {
    let device = DeviceKind::Cpu.open().unwrap();
    let batch = TokenBatch::single(&[1, 2, 3, 4, 5]).unwrap();
    for dir in model_dirs() {
        for nf4 in [
            Nf4Config::default(),
            Nf4Config {
                block_size: 64,
                double_quant: true,
            },
        ] {
            let after = load_hf_llama(&dir, &device)
                .unwrap()
                .quantize_nf4(&nf4)
                .unwrap();
            let during = napkin_core::io::load_model_with(&dir, &device, Some(&nf4)).unwrap();
            assert!(
                during
                    .block_linears()
                    .iter()
                    .all(|n| matches!(n.linear.base, BaseWeight::Nf4(_)))
            );
            assert_eq!(
                to_f32_vec(during.forward(&batch)),
                to_f32_vec(after.forward(&batch)),
                "{}",
                dir.display()
            );
        }
    }
}

#[test]
fn an_nf4_model_as_a_quantized_llama_keeps_its_codes_and_its_logits() {
    // Generation's engine from a float model with an NF4 base: linears whose rows and blocks
    // are multiples of 64 keep their codes, the others (and the embedding, norms, head) are
    // f32; the logits are the float model's within the 16-bit activations' rounding and the
    // codes' i16 steps. Measured on these models: largest gap 1.5e-5–7.6e-5 of the largest logit.
    use napkin_core::kernels::cpu::quantized::BlockFormat;
    use napkin_core::model::generate::{KvCache, NextToken};
    use napkin_core::model::quantized_llama::{QuantizedKvCache, QuantizedLlama};
    let device = DeviceKind::Cpu.open().unwrap();
    for dir in model_dirs() {
        let nf4 = Nf4Config {
            block_size: 64,
            double_quant: true,
        };
        let float = load_hf_llama(&dir, &device)
            .unwrap()
            .quantize_nf4(&nf4)
            .unwrap();
        let expected_nf4 = float
            .block_linears()
            .iter()
            .filter(|l| {
                let BaseWeight::Nf4(w) = &l.linear.base else {
                    panic!("{}: not NF4", l.path)
                };
                w.dims()[1].is_multiple_of(64)
            })
            .count();
        let quantized = QuantizedLlama::from_llama(float.clone()).unwrap();
        let nf4_count = quantized
            .format_counts()
            .iter()
            .find(|(f, _)| *f == BlockFormat::Nf4)
            .map_or(0, |(_, n)| *n);
        assert_eq!(nf4_count, expected_nf4, "{}", dir.display());
        let (mut qc, mut fc) = (QuantizedKvCache::default(), KvCache::default());
        let mut worst = 0.0f32;
        let ids = [3u32, 1, 4, 1, 5, 9, 2, 6];
        let mut decoded = Vec::new();
        for id in ids {
            let q = NextToken::next_token_logits(&quantized, &[id], &mut qc).unwrap();
            let f = NextToken::next_token_logits(&float, &[id], &mut fc).unwrap();
            worst = worst.max(napkin_tests::relative_gap(&q, &f));
            decoded.extend(q);
        }
        // Scoring a text (`eval --activation-bits`) reads every position's logits from one
        // pass: the same bits as decoding the tokens one by one.
        let every = quantized
            .every_token_logits(&ids, &mut QuantizedKvCache::default())
            .unwrap();
        assert!(
            every.len() == decoded.len()
                && every
                    .iter()
                    .zip(&decoded)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{}: one pass's logits differ from those decoded one by one",
            dir.display()
        );
        eprintln!(
            "{}: {nf4_count} NF4 linears, gap {worst:.1e}",
            dir.display()
        );
        assert!(worst < 1e-3, "{}: logits off by {worst}", dir.display());
    }
}
