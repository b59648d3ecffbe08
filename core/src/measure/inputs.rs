//! What a measurement runs: a random model of the scenario with its tricks applied, and
//! synthetic micro-batches (memory and time do not depend on the text).

use burn::tensor::Device;

use crate::data::MicroBatch;
use crate::error::Result;
use crate::model::autocast::half_dtype;
use crate::model::{Llama, TokenBatch};
use crate::predict::inventory::Scenario;

/// A randomly initialised model of `s` with its tricks applied as training sees them (the NF4
/// base, then the LoRA adapters), on the autodiff `device`: what the sandbox trains and what
/// `napkin measure --preset` measures.
pub fn random_model(s: &Scenario, device: &Device) -> Result<Llama> {
    // An NF4 base is quantized block by block as it is made: no f32 copy of the whole model.
    let mut model = match &s.nf4 {
        Some(nf4) => Llama::init_nf4(&s.config, device, nf4)?,
        None => Llama::init(&s.config, device),
    };
    model.attention = s.attention;
    if let Some(lora) = &s.lora {
        model = model.with_lora(lora)?;
    }
    if s.half_base() {
        model = model.cast_frozen_base(half_dtype(device));
    }
    Ok(model)
}

/// Deterministic token rows for `micro` (ids spread over the vocabulary; memory and time do
/// not depend on the text).
pub fn synthetic_micro_batches(s: &Scenario) -> Result<Vec<MicroBatch>> {
    let v = s.config.vocab_size;
    micro_batches_of(s, |m, r, i| ((i * 31 + r * 101 + m * 7 + 1) % v) as u32)
}

/// The scenario's micro-batches (accumulation × B × T) with `token(micro, row, position)`.
pub fn micro_batches_of(
    s: &Scenario,
    token: impl Fn(usize, usize, usize) -> u32,
) -> Result<Vec<MicroBatch>> {
    (0..s.accumulation.max(1))
        .map(|m| {
            let rows: Vec<Vec<u32>> = (0..s.micro_batch)
                .map(|r| (0..s.seq_len).map(|i| token(m, r, i)).collect())
                .collect();
            Ok(MicroBatch::causal(TokenBatch::from_rows(&rows)?))
        })
        .collect()
}
