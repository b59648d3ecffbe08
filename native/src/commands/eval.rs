//! `napkin eval`: the loss and perplexity of a sequence under a model.

use anyhow::{Result, bail};
use napkin_core::device::DeviceKind;
use napkin_core::io::atomic::write_atomic;
use napkin_core::kernels::cpu::quantized::ActivationBits;
use napkin_core::kernels::values::{scalar, to_f32_vec};
use napkin_core::model::quantized_llama::QuantizedKvCache;
use napkin_core::model::{TokenBatch, causal_lm_loss};
use napkin_core::tokenizer::tokenizer_for_model;
use serde_json::json;

use crate::cli::EvalArgs;

pub fn run(args: &EvalArgs) -> Result<()> {
    let dir = &args.model.model;
    let ids: Vec<u32> = match &args.text {
        Some(text) => tokenizer_for_model(dir, args.tokenizer.as_deref())?.encode(text)?,
        None => args.ids.clone(),
    };
    if ids.len() < 2 {
        bail!(
            "--ids: need at least 2 tokens to score (the first one is only context), got {}",
            ids.len()
        );
    }
    let device_kind = args.device;
    let (loss, tokens, engine) = match args.activation_bits {
        Some(bits) => {
            if device_kind != DeviceKind::Cpu {
                bail!(
                    "--activation-bits scores with generate's CPU engine; drop it to run the \
                     float model on --device {}",
                    args.device
                );
            }
            let bits = ActivationBits::from(bits);
            let Some(model) = super::generate::block_engine(dir, args.adapter.as_deref(), bits)?
            else {
                bail!(
                    "--activation-bits: {} has no quantized weights to keep (a GGUF, a napkin \
                     NF4 checkpoint, or an adapter trained with --nf4); the float model is the \
                     only engine for it (drop the flag)",
                    dir.display()
                );
            };
            let logits = model.every_token_logits(&ids, &mut QuantizedKvCache::default())?;
            let vocab = logits.len() / ids.len();
            if let Some(path) = &args.logits {
                write_atomic(path, &npy_f32(&logits, &[ids.len(), vocab]))?;
            }
            let (loss, tokens) = next_token_loss(&logits, &ids);
            let engine = match bits {
                ActivationBits::Sixteen => "quantized weights, 16-bit activations",
                ActivationBits::Eight => "quantized weights, 8-bit activations",
            };
            (loss, tokens, engine)
        }
        None => {
            let device = device_kind.open()?;
            let model = super::load_with_adapter(dir, args.adapter.as_deref(), &device)?;
            let batch = TokenBatch::single(&ids)?;
            batch.check_vocab(model.config.vocab_size)?;
            let labels: Vec<i64> = ids.iter().map(|&id| id as i64).collect();
            let logits = model.forward(&batch); // [1, T, V]
            if let Some(path) = &args.logits {
                let [_, t, v] = logits.dims();
                let values = to_f32_vec(logits.clone());
                write_atomic(path, &npy_f32(&values, &[t, v]))?;
            }
            let loss = causal_lm_loss(logits, &labels)?;
            let tokens = loss.tokens;
            (f64::from(scalar(loss.mean())), tokens, "float model")
        }
    };
    let perplexity = loss.exp();

    if args.json {
        let report = json!({
            "model": dir.display().to_string(),
            "device": device_kind.backend_name(),
            "tokens": ids.len(),
            "ids": ids,
            "scored_tokens": tokens,
            "engine": engine,
            "loss": loss,
            "perplexity": perplexity,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("tokens      {} ({} scored)", ids.len(), tokens);
        println!("loss        {loss:.6} nats/token");
        println!("perplexity  {perplexity:.4}");
        println!("device      {}", device_kind.backend_name());
        println!("engine      {engine}");
    }
    Ok(())
}

/// The mean negative log-likelihood (nats) of each id after the first under the logits of the
/// position before it, and how many ids that scores.
///
/// # Shapes
/// - `logits`: `[T, V]` row-major; `ids`: `[T]`
fn next_token_loss(logits: &[f32], ids: &[u32]) -> (f64, usize) {
    let vocab = logits.len() / ids.len();
    let scored = ids.len() - 1;
    let total: f64 = logits
        .chunks_exact(vocab)
        .zip(&ids[1..])
        .map(|(row, &next)| {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
            max + sum.ln() - row[next as usize] as f64
        })
        .sum();
    (total / scored as f64, scored)
}

/// A NumPy `.npy` (format 1.0) of little-endian f32 `values` with `shape`.
fn npy_f32(values: &[f32], shape: &[usize]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let mut header = format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': ({},), }}",
        dims.join(", ")
    );
    // Magic (6) + version (2) + length (2) + header, padded with spaces to 64 bytes, then '\n'.
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((header.len() as u16).to_le_bytes());
    out.extend(header.as_bytes());
    values.iter().for_each(|v| out.extend(v.to_le_bytes()));
    out
}
