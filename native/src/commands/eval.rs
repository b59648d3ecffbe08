//! `napkin eval`: the loss and perplexity of a sequence under a model.

use anyhow::{Result, bail};
use napkin_core::device::DeviceKind;
use napkin_core::model::{TokenBatch, causal_lm_loss};
use napkin_core::tokenizer::tokenizer_for_model;
use napkin_core::values::scalar;
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
    let loss = causal_lm_loss(model.forward(&batch), &labels)?;
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
