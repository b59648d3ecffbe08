//! Reading a training file: JSON lines (`.jsonl`), a JSON array or JSON lines (`.json`), or
//! plain text (`.txt`, `.md`). Any other extension is refused rather than read as text (a
//! JSON file trained on as raw characters would look like a working run).

use std::path::Path;

use serde_json::Value;

use super::format::DataFormat;
use super::instruct::Conversation;
use crate::error::{Error, Result};

/// What a data file holds.
#[derive(Debug, Clone, PartialEq)]
pub enum DataContent {
    /// Records of one format.
    Records {
        /// The format, detected or given.
        format: DataFormat,
        /// One conversation per record, in file order.
        examples: Vec<Conversation>,
    },
    /// Plain text, cut into windows of the sequence length.
    PlainText(String),
}

/// Reads and parses a data file.
pub fn read_data(path: &Path, format: DataFormat) -> Result<DataContent> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    parse_data(&text, path, format)
}

/// Parses the contents of a data file; `path` chooses the reading by its extension and names
/// the file in errors.
pub fn parse_data(text: &str, path: &Path, format: DataFormat) -> Result<DataContent> {
    let extension = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let records = match extension.as_deref() {
        Some("jsonl") => json_lines(text, path)?,
        Some("json") if text.trim_start().starts_with('[') => json_array(text, path)?,
        Some("json") => json_lines(text, path)?,
        Some("txt" | "md" | "text") => {
            return match format {
                DataFormat::Auto | DataFormat::Text => Ok(DataContent::PlainText(text.to_string())),
                other => Err(Error::Data {
                    path: path.to_path_buf(),
                    line: 0,
                    message: format!(
                        "a plain-text file holds no {other} records; use a .jsonl or .json file, or --data-format text"
                    ),
                }),
            };
        }
        other => {
            return Err(Error::Data {
                path: path.to_path_buf(),
                line: 0,
                message: format!(
                    "{}: expected .jsonl (one record a line), .json (an array of records, or JSON lines) or .txt / .md (plain text)",
                    match other {
                        Some(e) => format!("unknown extension `.{e}`"),
                        None => "no extension".to_string(),
                    }
                ),
            });
        }
    };
    let (format, examples) = format.parse_all(&records, path)?;
    Ok(DataContent::Records { format, examples })
}

/// Parses JSONL text with the lines' formats (alpaca, messages or text) detected from the
/// first record.
pub fn parse_jsonl(text: &str, path: &Path) -> Result<Vec<Conversation>> {
    let records = json_lines(text, path)?;
    Ok(DataFormat::Auto.parse_all(&records, path)?.1)
}

/// The records of a `.jsonl` or `.json` file, each with its 1-based line; any other
/// extension is refused (preference pairs have no plain-text form).
pub fn json_records(text: &str, path: &Path) -> Result<Vec<(usize, Value)>> {
    let extension = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match extension.as_deref() {
        Some("jsonl") => json_lines(text, path),
        Some("json") if text.trim_start().starts_with('[') => json_array(text, path),
        Some("json") => json_lines(text, path),
        _ => Err(Error::Data {
            path: path.to_path_buf(),
            line: 0,
            message:
                "expected .jsonl (one record a line) or .json (an array of records, or JSON lines)"
                    .into(),
        }),
    }
}

/// One record a line; blank lines are skipped.
fn json_lines(text: &str, path: &Path) -> Result<Vec<(usize, Value)>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(line).map_err(|e| Error::Data {
            path: path.to_path_buf(),
            line: i + 1,
            message: format!("not valid JSON: {e}"),
        })?;
        out.push((i + 1, value));
    }
    Ok(out)
}

/// A top-level array, each element with the line it starts on.
fn json_array(text: &str, path: &Path) -> Result<Vec<(usize, Value)>> {
    let line_of = |offset: usize| text[..offset].bytes().filter(|&b| b == b'\n').count() + 1;
    let error = |offset: usize, message: String| Error::Data {
        path: path.to_path_buf(),
        line: line_of(offset.min(text.len())),
        message,
    };
    let skip_space = |mut at: usize| {
        while text[at..].starts_with(|c: char| c.is_ascii_whitespace()) {
            at += 1;
        }
        at
    };
    // The caller saw `[` as the first non-space character.
    let mut at = skip_space(0) + 1;
    let mut out = Vec::new();
    loop {
        at = skip_space(at);
        if out.is_empty() && text[at..].starts_with(']') {
            at += 1;
            break;
        }
        let mut values = serde_json::Deserializer::from_str(&text[at..]).into_iter::<Value>();
        let value = match values.next() {
            Some(Ok(v)) => v,
            Some(Err(e)) => return Err(error(at, format!("not valid JSON: {e}"))),
            None => return Err(error(at, "the array ends early: expected a record".into())),
        };
        out.push((line_of(at), value));
        at = skip_space(at + values.byte_offset());
        match text[at..].chars().next() {
            Some(',') => at += 1,
            Some(']') => {
                at += 1;
                break;
            }
            _ => {
                return Err(error(
                    at,
                    "not valid JSON: expected `,` or `]` after a record".into(),
                ));
            }
        }
    }
    if !text[at..].trim().is_empty() {
        return Err(error(at, "not valid JSON: text after the array".into()));
    }
    Ok(out)
}
