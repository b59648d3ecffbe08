//! `napkin generate`: text from a prompt, streamed token by token.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use napkin_core::chat::{ChatFormat, ChatTemplate, Message};
use napkin_core::device::DeviceKind;
use napkin_core::io::gguf::{GgufFile, load_gguf_quantized_with};
use napkin_core::io::peft::load_lora_quantized;
use napkin_core::io::quantized::is_quantized_checkpoint;
use napkin_core::io::{load_model_with, resolve_model_path};
use napkin_core::kernels::cpu::quantized::{ActivationBits, BlockFormat};
use napkin_core::model::generate::{NextToken, Sampling};
use napkin_core::model::quantized_llama::QuantizedLlama;
use napkin_core::tokenizer::{TextTokenizer, tokenizer_for_model};

use crate::cli::GenerateArgs;

pub fn run(args: &GenerateArgs) -> Result<()> {
    let path = &args.model.model;
    let tokenizer = tokenizer_for_model(path, args.tokenizer.as_deref())?;
    let prompt = if args.chat {
        let format = ChatFormat::from_template(ChatTemplate::of(&tokenizer))?;
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(Message::new("system", system));
        }
        messages.push(Message::new("user", &args.prompt));
        format.render(&messages, true)?
    } else {
        args.prompt.clone()
    };
    let prompt_ids = tokenizer.encode(&prompt)?;
    let sampling = Sampling {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed,
    };
    let kind = args.device;
    if kind == DeviceKind::Cpu && !args.dequantize {
        let bits = ActivationBits::from(args.activation_bits);
        if let Some(model) = block_engine(path, args.adapter.as_deref(), bits)? {
            return stream(&model, &prompt_ids, args, &sampling, &tokenizer);
        }
    }
    let model = super::load_with_adapter(path, args.adapter.as_deref(), &kind.open()?)?;
    stream(&model, &prompt_ids, args, &sampling, &tokenizer)
}

/// The CPU engine that keeps a model's quantized weights (`generate`'s default, and `eval
/// --activation-bits`): a GGUF's blocks, or an NF4 base's codes (a napkin NF4 checkpoint, or
/// the base `adapter` was trained on, quantized as training did), with `adapter` attached.
/// `None` for a model with neither (a float checkpoint without an NF4-trained adapter). Says
/// on stderr what it keeps.
pub(super) fn block_engine(
    path: &Path,
    adapter: Option<&Path>,
    bits: ActivationBits,
) -> Result<Option<QuantizedLlama>> {
    let resolved = resolve_model_path(path)?;
    let is_gguf = resolved
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    let nf4_base = match adapter {
        Some(dir) => super::trained_nf4_base(dir)?,
        None => None,
    };
    let nf4_checkpoint = !is_gguf && is_quantized_checkpoint(&resolved);
    if !(is_gguf || nf4_checkpoint || nf4_base.is_some()) {
        return Ok(None);
    }
    let as_trained = nf4_base.map(|nf4| {
        format!(
            "the block linears quantized to NF4 as the adapter was trained (block {}{})",
            nf4.block_size,
            if nf4.double_quant {
                ", double quantization"
            } else {
                ""
            }
        )
    });
    let base_as_trained = as_trained.is_some();
    let (model, how) = if is_gguf {
        let model = load_gguf_quantized_with(&GgufFile::open(&resolved)?, nf4_base.as_ref())?;
        let how = match as_trained {
            Some(nf4) => format!("{nf4}, the rest the file's blocks"),
            None => "the blocks read in place from the file".to_string(),
        };
        (model, how)
    } else {
        let float = load_model_with(path, &DeviceKind::Cpu.open()?, nf4_base.as_ref())?;
        let how = match as_trained {
            Some(nf4) => format!("{nf4}, the rest f32"),
            None => "the checkpoint's NF4 codes, the rest f32".to_string(),
        };
        (QuantizedLlama::from_llama(float)?, how)
    };
    let mut model = model.with_activation_bits(bits);
    let kept: Vec<String> = model
        .format_counts()
        .iter()
        .map(|(format, n)| format!("{format:?} ×{n}"))
        .collect();
    // The CPU's NF4 product reads rows and blocks in multiples of 64: a base linear of another
    // shape (the tiny fixtures') holds its dequantized NF4 values in f32, the values as trained
    // but not their 4-bit storage.
    let nf4_held = model
        .format_counts()
        .iter()
        .find(|(format, _)| *format == BlockFormat::Nf4)
        .map_or(0, |(_, n)| *n);
    let block_linears = 7 * model.config.num_hidden_layers;
    let how = if base_as_trained && nf4_held < block_linears {
        format!(
            "{how}; {} of the {block_linears} NF4 block linears held as their dequantized \
             values in f32: the CPU's NF4 product needs widths in multiples of 64",
            block_linears - nf4_held
        )
    } else {
        how
    };
    eprintln!(
        "weights kept quantized: {} ({:.1} MB; {how})",
        kept.join(", "),
        model.resident_bytes() as f64 / 1e6
    );
    if let Some(dir) = adapter {
        let lora = load_lora_quantized(&mut model, dir)
            .with_context(|| format!("loading the adapter in {}", dir.display()))?;
        eprintln!(
            "adapter {}: r {}, α {}, {} target(s){}, beside the {}",
            dir.display(),
            lora.r,
            lora.alpha,
            lora.targets.len(),
            if lora.use_dora { ", DoRA" } else { "" },
            if is_gguf && nf4_base.is_none() {
                "GGUF's blocks"
            } else {
                "NF4 base"
            }
        );
    }
    Ok(Some(model))
}

/// Generates and prints the text as it comes, then the speed on stderr.
fn stream(
    model: &impl NextToken,
    prompt_ids: &[u32],
    args: &GenerateArgs,
    sampling: &Sampling,
    tokenizer: &TextTokenizer,
) -> Result<()> {
    // Stream: decode everything generated so far and print what is new (a token can end in
    // the middle of a UTF-8 character; the full decode stays correct).
    let mut generated: Vec<u32> = Vec::new();
    let mut printed = 0usize;
    let mut stdout = std::io::stdout();
    let start = Instant::now();
    let ids = model.generate(
        prompt_ids,
        args.max_new_tokens,
        sampling,
        &tokenizer.eos_ids,
        |id| {
            if tokenizer.eos_ids.contains(&id) {
                return;
            }
            generated.push(id);
            if let Ok(text) = tokenizer.decode(&generated)
                && text.len() > printed
                && text.is_char_boundary(printed)
            {
                let _ = write!(stdout, "{}", &text[printed..]);
                let _ = stdout.flush();
                printed = text.len();
            }
        },
    )?;
    let seconds = start.elapsed().as_secs_f64();
    println!();
    eprintln!(
        "[{} prompt tokens, {} generated in {seconds:.2} s: {:.1} tokens/s]",
        prompt_ids.len(),
        ids.len(),
        ids.len() as f64 / seconds.max(1e-9)
    );
    Ok(())
}
