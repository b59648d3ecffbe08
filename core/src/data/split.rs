//! The held-out split: a seeded, reproducible fraction of the samples kept out of training to
//! measure the loss on text the model did not fit.

use super::loader::seeded_order;
use crate::error::{Error, Result};

/// Splits `samples` (or pairs) into (train, held out): `round(fraction · n)` samples (at least one) chosen
/// by a generator seeded with `seed`, each side in the original order. The same samples and
/// seed give the same split, so a resumed run evaluates on the same text.
pub fn hold_out<T>(samples: Vec<T>, fraction: f64, seed: u64) -> Result<(Vec<T>, Vec<T>)> {
    if !(fraction > 0.0 && fraction < 1.0) {
        return Err(Error::config(
            "--val-fraction",
            format!("must be between 0 and 1 (exclusive), found {fraction}"),
        ));
    }
    let n = samples.len();
    let held = ((fraction * n as f64).round() as usize).max(1);
    if held >= n {
        return Err(Error::config(
            "--val-fraction",
            format!("{fraction} of {n} samples leaves none to train on"),
        ));
    }
    // The first `held` of a seeded shuffle are held out.
    let order = seeded_order(n, seed ^ 0x005E_ED0F_E7A1_0000);
    let mut is_held = vec![false; n];
    for &i in &order[..held] {
        is_held[i] = true;
    }
    let (mut train, mut eval) = (Vec::with_capacity(n - held), Vec::with_capacity(held));
    for (sample, held) in samples.into_iter().zip(is_held) {
        if held {
            eval.push(sample)
        } else {
            train.push(sample)
        }
    }
    Ok((train, eval))
}
