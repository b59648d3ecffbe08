//! Course exercises with checked answers: a catalog of seeded questions whose answers come
//! from the predictor, and a checker that reads answers with their units.
//!
//! - `answer`: parsing "56 GB" / "52.2 GiB" / "5.6e10 bytes", judging against the expected
//!   value with a tolerance, naming GB/GiB mix-ups and known mistakes.
//! - `catalog/`: the exercises, one file per topic in teaching order.

pub mod answer;
pub mod catalog;

pub use answer::{AnswerError, Dimension, Expected, Verdict, check};
pub use catalog::{Exercise, Instance, SandboxSettings, catalog, instance};

#[cfg(test)]
mod tests {
    use super::*;

    const SEEDS: [u64; 6] = [0, 1, 2, 7, 42, 2026];

    /// The reference answer written in base units with an explicit unit.
    fn reference(e: &Expected) -> String {
        let unit = match (e.dimension, e.unit.as_deref()) {
            (Dimension::Bytes, Some("gib")) => {
                return format!("{} GiB", e.value / (1u64 << 30) as f64);
            }
            (Dimension::Bytes, _) => "bytes",
            (Dimension::Count, _) | (Dimension::Ratio, _) => "",
            (Dimension::Seconds, _) => "s",
            (Dimension::Flops, _) => "FLOP",
            (Dimension::Bits, _) => "bits",
            (Dimension::Percent, _) => "%",
            (Dimension::Choice, _) => return e.choices[e.value as usize].clone(),
        };
        format!("{} {unit}", e.value)
    }

    fn scaled(e: &Expected, factor: f64) -> String {
        let r = reference(e);
        let (number, unit) = r.split_once(' ').unwrap_or((&r, ""));
        let v: f64 = number.parse().unwrap();
        format!("{} {unit}", v * factor)
    }

    #[test]
    fn the_catalog_covers_the_subject() {
        let all = catalog();
        assert!(all.len() >= 24, "{} exercises", all.len());
        let mut ids: Vec<_> = all.iter().map(|e| e.id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), all.len(), "ids are unique");
    }

    /// Two-way check: every reference answer is accepted for several seeds, and the usual
    /// wrong answers — off by 2, 1000 vs 1024, the listed mistakes (forgotten gradients,
    /// forgotten optimizer state, …) — are rejected.
    #[test]
    fn reference_answers_pass_and_wrong_answers_fail() {
        for exercise in catalog() {
            let mut questions = std::collections::BTreeSet::new();
            for seed in SEEDS {
                let inst = instance(exercise.id, seed).unwrap();
                questions.insert(inst.question.clone());
                let e = &inst.expected;
                let verdict = check(&reference(e), e).unwrap();
                assert!(
                    verdict.correct,
                    "{} seed {seed}: {} → {}",
                    inst.id,
                    reference(e),
                    verdict.message
                );
                if e.dimension == Dimension::Choice {
                    let other = &e.choices[1 - e.value as usize];
                    assert!(!check(other, e).unwrap().correct, "{}", inst.id);
                    continue;
                }
                for factor in [2.0, 0.5, 1.024, 1.0 / 1.024] {
                    let wrong = scaled(e, factor);
                    let v = check(&wrong, e).unwrap();
                    assert!(
                        !v.correct,
                        "{} seed {seed}: {wrong} accepted for {}",
                        inst.id, e.display
                    );
                }
                for (mistake, value) in &e.mistakes {
                    if (value / e.value - 1.0).abs() <= e.tolerance {
                        continue; // a mistake that happens to give the right number here
                    }
                    let wrong = scaled(e, value / e.value);
                    let v = check(&wrong, e).unwrap();
                    assert!(!v.correct, "{} seed {seed}: `{mistake}` accepted", inst.id);
                }
                if e.dimension == Dimension::Bytes && e.unit.is_none() {
                    // The right number of GB written as GiB.
                    let in_gb = e.value / 1e9;
                    let v = check(&format!("{in_gb} GiB"), e).unwrap();
                    assert!(
                        !v.correct && v.message.contains("right in GB"),
                        "{}: {}",
                        inst.id,
                        v.message
                    );
                }
            }
            // Seeded variants: different seeds give different questions (most exercises).
            assert!(
                questions.len() >= 2,
                "{}: one question for every seed",
                exercise.id
            );
        }
    }

    #[test]
    fn every_instance_explains_itself() {
        for exercise in catalog() {
            let inst = instance(exercise.id, 3).unwrap();
            assert!(
                !inst.hint.is_empty() && !inst.explanation.is_empty(),
                "{}",
                inst.id
            );
            assert!(inst.expected.value.is_finite(), "{}", inst.id);
        }
        assert!(instance("no-such-exercise", 0).is_none());
    }
}
