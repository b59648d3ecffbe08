//! `napkin export`: a model, with an adapter folded in, as a llama.cpp GGUF file or a complete
//! Hugging Face folder — tensor by tensor, so the merged model is never held whole.

use std::io::IsTerminal;

use anyhow::{Context, Result};
use napkin_core::device::DeviceKind;
use napkin_core::export::{write_gguf_file, write_hf_folder};
use napkin_core::io::hf_writer::{WeightLayout, base_weight_dtype};
use napkin_core::tokenizer::tokenizer_for_model;

use crate::cli::{ExportArgs, ExportFormat};

pub fn run(args: &ExportArgs) -> Result<()> {
    let path = &args.model.model;
    let device = DeviceKind::Cpu.open()?;
    let plain = !std::io::stderr().is_terminal();
    let tokenizer = tokenizer_for_model(path, args.tokenizer.as_deref())?;
    let model = super::working(&format!("loading {}", path.display()), plain, || {
        super::load_with_adapter(path, args.adapter.as_deref(), &device)
    })?;
    let merge_lora = args.adapter.is_some();
    let out = &args.out;
    if args.format == ExportFormat::Gguf {
        let quant = args.quant;
        let summary = super::working(&format!("writing {}", out.display()), plain, || {
            write_gguf_file(&model, &tokenizer, out, quant, merge_lora)
        })
        .with_context(|| format!("writing {}", out.display()))?;
        let types: Vec<String> = summary
            .tensors_by_type
            .iter()
            .map(|(t, n)| format!("{n} {t:?}"))
            .collect();
        println!(
            "wrote {} ({:.1} MB; tensors: {})",
            out.display(),
            summary.file_bytes as f64 / 1e6,
            types.join(", ")
        );
    } else {
        let dtype = match args.dtype {
            Some(d) => d,
            None => base_weight_dtype(path)?,
        };
        let max_shard_bytes = super::shard_bytes(&args.max_shard_size)?;
        let layout = WeightLayout {
            dtype,
            max_shard_bytes,
            merge_lora,
        };
        let written = super::working(&format!("writing {}", out.display()), plain, || {
            write_hf_folder(&model, &tokenizer, out, layout)
        })
        .with_context(|| format!("writing {}", out.display()))?;
        println!(
            "wrote {} ({} files, weights in {dtype})",
            out.display(),
            written.len()
        );
    }
    Ok(())
}
