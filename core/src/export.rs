//! Using what was trained elsewhere: a model (adapters folded in) written as a complete
//! Hugging Face folder or as a llama.cpp GGUF file, each with its tokenizer and chat template.
//! The writers themselves are `io::hf_writer` and `io::gguf::export`; this floor joins them to
//! the tokenizer.

use std::path::{Path, PathBuf};

use crate::error::Result;
use crate::io::atomic::write_atomic;
use crate::io::gguf::export::{ExportSummary, GgufQuant, export_gguf};
use crate::io::hf_writer::{WeightLayout, generation_config_json, write_hf_weights};
use crate::model::Llama;
use crate::tokenizer::TextTokenizer;

/// A complete Hugging Face folder in `dir`: the weights tensor by tensor (`layout`), the
/// config, `generation_config.json`, `tokenizer.json` and `tokenizer_config.json` (with the
/// chat template). Returns the files written.
pub fn write_hf_folder(
    model: &Llama,
    tokenizer: &TextTokenizer,
    dir: &Path,
    layout: WeightLayout,
) -> Result<Vec<PathBuf>> {
    let mut written = write_hf_weights(model, dir, layout)?;
    let mut files = tokenizer.hf_files()?;
    files.push((
        "generation_config.json".into(),
        generation_config_json(tokenizer.bos_id, &tokenizer.eos_ids),
    ));
    for (name, bytes) in files {
        let path = dir.join(&name);
        write_atomic(&path, &bytes)?;
        written.push(path);
    }
    Ok(written)
}

/// A llama.cpp GGUF file at `path` with the tokenizer and chat template in its metadata.
pub fn write_gguf_file(
    model: &Llama,
    tokenizer: &TextTokenizer,
    path: &Path,
    quant: GgufQuant,
    merge_lora: bool,
) -> Result<ExportSummary> {
    let name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "napkin".into());
    export_gguf(
        model,
        tokenizer.gguf_metadata()?,
        path,
        quant,
        merge_lora,
        &name,
    )
}
