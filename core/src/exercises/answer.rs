//! Reading a learner's answer ("56 GB", "56GiB", "5.6e10 bytes", "14,000 MB", "4.5 bits",
//! "0.8 s", "compute") and judging it against the predictor's value.
//!
//! GB and GiB are different units and both are accepted as written: 1 GB = 10⁹ bytes,
//! 1 GiB = 2³⁰ bytes. A number that is right in the other unit is called out by name, because
//! that 7 % (or 2.4 % for KB/KiB) is exactly the mistake the lesson is about.

use serde::Serialize;

/// What an answer measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Dimension {
    /// Bytes: B, KB, MB, GB, TB (10³ steps) or KiB, MiB, GiB, TiB (2¹⁰ steps).
    Bytes,
    /// A count (parameters, tokens): a plain number, or with K / M / B (billion).
    Count,
    /// Seconds: s, ms, µs / us, min.
    Seconds,
    /// Floating-point operations: FLOP(s), GFLOP, TFLOP, PFLOP.
    Flops,
    /// Bits per weight.
    Bits,
    /// A percentage (with `%`).
    Percent,
    /// A plain ratio (optionally with `x` or `×`).
    Ratio,
    /// One of a few words.
    Choice,
}

impl Dimension {
    fn example(self) -> &'static str {
        match self {
            Dimension::Bytes => "`56 GB`, `52.2 GiB` or `5.6e10 bytes`",
            Dimension::Count => "`4884480`, `4.88M` or `7B`",
            Dimension::Seconds => "`0.8 s` or `800 ms`",
            Dimension::Flops => "`2.1 TFLOP` or `2.1e12 FLOP`",
            Dimension::Bits => "`4.5 bits`",
            Dimension::Percent => "`3.6 %`",
            Dimension::Ratio => "`2.5` or `2.5x`",
            Dimension::Choice => "one of the words in the question",
        }
    }
}

/// A parsed answer: its value in base units (bytes, seconds, FLOP, …) and how it was written.
#[derive(Debug, Clone, PartialEq)]
pub struct Quantity {
    /// Value in the dimension's base unit.
    pub value: f64,
    /// The unit as written (lower-cased; empty when none).
    pub unit: String,
}

/// Why an answer could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    /// Nothing was given.
    #[error("the answer is empty: give a number with a unit, e.g. {0}")]
    Empty(&'static str),
    /// The number part is not a number.
    #[error("`{0}` is not a number; write e.g. {1}")]
    NotANumber(String, &'static str),
    /// A unit is needed.
    #[error("`{0}` has no unit: bytes, seconds and FLOPs need one, e.g. {1}")]
    MissingUnit(String, &'static str),
    /// The unit belongs to another dimension or is unknown.
    #[error("`{unit}` is not a unit of {expected:?}; write e.g. {example}")]
    WrongUnit {
        /// The unit as written.
        unit: String,
        /// What the question asks for.
        expected: Dimension,
        /// A well-formed answer.
        example: &'static str,
    },
    /// A word answer that is none of the choices.
    #[error("`{0}` is not one of: {1}")]
    NotAChoice(String, String),
}

/// The multiplier of a unit within `dimension`, or None when it is not one of its units.
fn unit_factor(dimension: Dimension, unit: &str) -> Option<f64> {
    let u = unit.trim();
    let ki = 1024f64;
    Some(match dimension {
        Dimension::Bytes => match u {
            "b" | "byte" | "bytes" => 1.0,
            "kb" => 1e3,
            "mb" => 1e6,
            "gb" => 1e9,
            "tb" => 1e12,
            "kib" => ki,
            "mib" => ki * ki,
            "gib" => ki * ki * ki,
            "tib" => ki * ki * ki * ki,
            _ => return None,
        },
        Dimension::Count => match u {
            "" | "params" | "parameters" | "tokens" | "values" => 1.0,
            "k" | "thousand" => 1e3,
            "m" | "million" | "m params" | "m parameters" => 1e6,
            "b" | "bn" | "billion" | "b params" | "b parameters" => 1e9,
            _ => return None,
        },
        Dimension::Seconds => match u {
            "s" | "sec" | "secs" | "second" | "seconds" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" | "μs" => 1e-6,
            "min" | "minutes" => 60.0,
            _ => return None,
        },
        Dimension::Flops => match u {
            "flop" | "flops" => 1.0,
            "gflop" | "gflops" => 1e9,
            "tflop" | "tflops" => 1e12,
            "pflop" | "pflops" => 1e15,
            _ => return None,
        },
        Dimension::Bits => match u {
            "bit" | "bits" | "bits/weight" | "bits per weight" | "bits/param" => 1.0,
            _ => return None,
        },
        Dimension::Percent => match u {
            "%" | "percent" => 1.0,
            _ => return None,
        },
        Dimension::Ratio => match u {
            "" | "x" | "×" | "times" => 1.0,
            _ => return None,
        },
        Dimension::Choice => return None,
    })
}

/// Parses `text` as a quantity of `dimension`.
pub fn parse_quantity(text: &str, dimension: Dimension) -> Result<Quantity, AnswerError> {
    let example = dimension.example();
    let text = text.trim();
    if text.is_empty() {
        return Err(AnswerError::Empty(example));
    }
    // The number: digits, sign, decimal point, exponent, thousands separators.
    let split = text
        .char_indices()
        .find(|&(i, c)| {
            !(c.is_ascii_digit()
                || c == '.'
                || c == ','
                || c == '_'
                || ((c == '-' || c == '+') && (i == 0 || text[..i].ends_with(['e', 'E'])))
                || ((c == 'e' || c == 'E')
                    && i > 0
                    && text[i + c.len_utf8()..]
                        .chars()
                        .next()
                        .is_some_and(|n| n.is_ascii_digit() || n == '-' || n == '+')))
        })
        .map_or(text.len(), |(i, _)| i);
    let (number, unit) = text.split_at(split);
    let digits: String = number.chars().filter(|&c| c != ',' && c != '_').collect();
    let value: f64 = digits
        .parse()
        .map_err(|_| AnswerError::NotANumber(text.to_string(), example))?;
    if !value.is_finite() {
        return Err(AnswerError::NotANumber(text.to_string(), example));
    }
    let unit = unit.trim().to_lowercase();
    let factor = match unit_factor(dimension, &unit) {
        Some(f) => f,
        None if unit.is_empty() => return Err(AnswerError::MissingUnit(text.into(), example)),
        None => {
            return Err(AnswerError::WrongUnit {
                unit,
                expected: dimension,
                example,
            });
        }
    };
    Ok(Quantity {
        value: value * factor,
        unit,
    })
}

/// The predictor's answer to one exercise instance.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Expected {
    /// What is measured.
    pub dimension: Dimension,
    /// The value in base units (for choices: the index into `choices`).
    pub value: f64,
    /// How the reference answer is written (`"52.2 GB"`).
    pub display: String,
    /// Accepted relative error.
    pub tolerance: f64,
    /// For choices: the accepted words.
    pub choices: Vec<String>,
    /// Known wrong answers and what each means (`"forgot the gradients"`).
    pub mistakes: Vec<(String, f64)>,
    /// A unit the answer must be written in (lower case, e.g. `gib`), when the question asks
    /// for one.
    pub unit: Option<String>,
}

/// The verdict on an answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// Right within the tolerance.
    pub correct: bool,
    /// What to tell the learner.
    pub message: String,
}

/// Judges `text` against `expected`. Unreadable answers are an error (with a helpful message),
/// not a wrong verdict.
pub fn check(text: &str, expected: &Expected) -> Result<Verdict, AnswerError> {
    if expected.dimension == Dimension::Choice {
        let word = text.trim().to_lowercase();
        let chosen = expected
            .choices
            .iter()
            .position(|c| word == *c || (word.len() >= 3 && c.starts_with(&word)));
        return match chosen {
            Some(i) if i as f64 == expected.value => Ok(Verdict {
                correct: true,
                message: format!("Right: {}.", expected.display),
            }),
            Some(_) => Ok(Verdict {
                correct: false,
                message: "Not this one: redo the comparison in the hint.".into(),
            }),
            None => Err(AnswerError::NotAChoice(
                text.trim().to_string(),
                expected.choices.join(", "),
            )),
        };
    }
    let q = parse_quantity(text, expected.dimension)?;
    if let Some(unit) = &expected.unit
        && q.unit != *unit
    {
        return Ok(Verdict {
            correct: false,
            message: format!(
                "The question asks for {}; you wrote `{}`.",
                unit_display(unit),
                unit_display(&q.unit)
            ),
        });
    }
    let close = |value: f64| {
        let denom = expected.value.abs().max(f64::MIN_POSITIVE);
        (q.value - value).abs() / denom <= expected.tolerance
    };
    if close(expected.value) {
        return Ok(Verdict {
            correct: true,
            message: format!("Right: {}.", expected.display),
        });
    }
    // GB written, GiB meant (or the other way round): the same number in the other system.
    if expected.dimension == Dimension::Bytes {
        let swapped = swap_unit_system(&q.unit);
        let number = q.value / unit_factor(Dimension::Bytes, &q.unit).unwrap_or(1.0);
        if let Some((other, factor)) = swapped
            && ((number * factor) - expected.value).abs() / expected.value.abs()
                <= expected.tolerance
        {
            return Ok(Verdict {
                correct: false,
                message: format!(
                    "Your number is right in {other}, but you wrote {}: 1 GiB = 2^30 = 1,073,741,824 bytes, 1 GB = 10^9 bytes. Write the unit you computed in.",
                    unit_display(&q.unit)
                ),
            });
        }
    }
    for (mistake, value) in &expected.mistakes {
        if close(*value) {
            return Ok(Verdict {
                correct: false,
                message: format!("Not quite: that is what you get if you {mistake}."),
            });
        }
    }
    let ratio = q.value / expected.value;
    let direction = if ratio > 1.0 { "high" } else { "low" };
    Ok(Verdict {
        correct: false,
        message: format!(
            "Not within {:.0} %: your answer is {:.2}× the expected one (too {direction}). Check the hint.",
            100.0 * expected.tolerance,
            ratio
        ),
    })
}

/// `gib` → `GiB`, `gb` → `GB`.
fn unit_display(unit: &str) -> String {
    unit.to_uppercase().replace('I', "i")
}

/// The same prefix in the other unit system: `gb` → (`GiB`, 2³⁰), `mib` → (`MB`, 10⁶).
fn swap_unit_system(unit: &str) -> Option<(&'static str, f64)> {
    let ki = 1024f64;
    Some(match unit {
        "kb" => ("KiB", ki),
        "mb" => ("MiB", ki * ki),
        "gb" => ("GiB", ki * ki * ki),
        "tb" => ("TiB", ki * ki * ki * ki),
        "kib" => ("KB", 1e3),
        "mib" => ("MB", 1e6),
        "gib" => ("GB", 1e9),
        "tib" => ("TB", 1e12),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(value: f64) -> Expected {
        Expected {
            dimension: Dimension::Bytes,
            value,
            display: String::new(),
            tolerance: 0.01,
            choices: vec![],
            mistakes: vec![("forgot the gradients".into(), value / 2.0)],
            unit: None,
        }
    }

    #[test]
    fn units_are_read_as_written() {
        let q = |t: &str| parse_quantity(t, Dimension::Bytes).unwrap().value;
        assert_eq!(q("56 GB"), 56e9);
        assert_eq!(q("56GiB"), 56.0 * 1024f64.powi(3));
        assert_eq!(q("5.6e10 bytes"), 5.6e10);
        assert_eq!(q("14,000 MB"), 14e9);
        assert_eq!(q("1_000 KiB"), 1_024_000.0);
        let s = |t: &str| parse_quantity(t, Dimension::Seconds).unwrap().value;
        assert_eq!(s("800 ms"), 0.8);
        let c = |t: &str| parse_quantity(t, Dimension::Count).unwrap().value;
        assert_eq!(c("7B"), 7e9);
        assert_eq!(c("4,884,480"), 4_884_480.0);
        assert_eq!(c("-1.5e-3"), -1.5e-3);
    }

    #[test]
    fn malformed_answers_get_a_message_not_a_crash() {
        let e = |t: &str| parse_quantity(t, Dimension::Bytes).unwrap_err().to_string();
        assert!(e("").contains("empty"));
        assert!(e("lots").contains("not a number"));
        assert!(e("56").contains("no unit"));
        assert!(e("56 s").contains("not a unit of Bytes"), "{}", e("56 s"));
        assert!(e("1e999 GB").contains("not a number"));
        assert!(e("GB 56").contains("not a number"));
        assert!(e("5..6 GB").contains("not a number"));
    }

    #[test]
    fn gb_and_gib_are_different_and_the_mix_up_is_named() {
        let expected = bytes(16e9); // 16 GB = 14.90 GiB
        assert!(check("16 GB", &expected).unwrap().correct);
        assert!(check("14.9 GiB", &expected).unwrap().correct);
        let v = check("16 GiB", &expected).unwrap();
        assert!(!v.correct);
        let v2 = check("14.9 GB", &expected).unwrap();
        assert!(
            !v2.correct && v2.message.contains("right in GiB"),
            "{}",
            v2.message
        );
        let v3 = check("8 GB", &expected).unwrap();
        assert!(!v3.correct && v3.message.contains("forgot the gradients"));
        let v4 = check("16.5 GB", &expected).unwrap();
        assert!(!v4.correct && v4.message.contains("too high"));
    }
}
