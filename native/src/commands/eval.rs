//! `napkin eval`: the loss and perplexity of a sequence under a model.

use anyhow::{Result, bail};
use napkin_core::device::DeviceKind;
use napkin_core::io::atomic::write_atomic;
use napkin_core::kernels::values::{scalar, to_f32_vec};
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
    let device_kind: DeviceKind = args.device.parse()?;
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
    let loss = scalar(loss.mean());
    let perplexity = (loss as f64).exp();

    if args.json {
        let report = json!({
            "model": dir.display().to_string(),
            "device": device_kind.backend_name(),
            "tokens": ids.len(),
            "scored_tokens": tokens,
            "loss": loss,
            "perplexity": perplexity,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("tokens      {} ({} scored)", ids.len(), tokens);
        println!("loss        {loss:.6} nats/token");
        println!("perplexity  {perplexity:.4}");
        println!("device      {}", device_kind.backend_name());
    }
    Ok(())
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
