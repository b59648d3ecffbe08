//! One module per subcommand.

pub mod bench;
pub mod estimate;
pub mod eval;
pub mod exercise;
pub mod generate;
pub mod inspect;
pub mod measure;
pub mod quantize;
pub mod train;

use std::path::Path;

use anyhow::{Context, Result};
use napkin_core::config::LlamaConfig;
use napkin_core::io::gguf::{GgufFile, gguf_config};

/// A model's configuration without reading its weights: GGUF metadata or config.json.
pub fn model_config(path: &Path) -> Result<LlamaConfig> {
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        return Ok(gguf_config(&GgufFile::open(path)?)?);
    }
    let file = path.join("config.json");
    LlamaConfig::from_hf_file(&file).with_context(|| format!("reading {}", file.display()))
}
