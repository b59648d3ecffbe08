//! `napkin quantize`: a float checkpoint (HF folder or GGUF, dequantized) → napkin NF4
//! checkpoint (block linears in NF4, embeddings, norms and LM head in float, as bitsandbytes
//! does). The block linears are quantized one by one as they are read, as `train --nf4` loads
//! them, so the float linears never exist all at once.

use std::io::IsTerminal;

use anyhow::{Context, Result, bail};
use napkin_core::config::Nf4Config;
use napkin_core::device::DeviceKind;
use napkin_core::io::atomic::write_atomic;
use napkin_core::io::load_model_with;
use napkin_core::io::quantized::{is_quantized_checkpoint, model_bytes, save_quantized};
use napkin_core::predict::weights::WeightBytes;
use napkin_core::tokenizer::tokenizer_for_model;

use crate::cli::QuantizeArgs;
use crate::commands::inspect::group;

pub fn run(args: &QuantizeArgs) -> Result<()> {
    let nf4 = Nf4Config {
        block_size: args.block_size,
        double_quant: args.double_quant,
    };
    nf4.validate()?;
    let device = DeviceKind::Cpu.open()?;
    let plain = !std::io::stderr().is_terminal();
    let path = napkin_core::io::resolve_model_path(&args.model.model)?;
    if is_quantized_checkpoint(&path) {
        bail!(
            "{} is a napkin NF4 checkpoint already; quantize its float source instead",
            path.display()
        );
    }
    let model = super::working(
        &format!("loading {} and quantizing to NF4", path.display()),
        plain,
        || load_model_with(&path, &device, Some(&nf4)),
    )?;
    // Before: every weight in f32, as a float checkpoint loads.
    let before = WeightBytes {
        float: 4 * model.config.num_parameters(),
        ..Default::default()
    };
    let after = model_bytes(&model);
    super::working(&format!("writing {}", args.out.display()), plain, || {
        save_quantized(&model, &nf4, &args.out)
    })
    .with_context(|| format!("writing {}", args.out.display()))?;
    println!("wrote {}", args.out.display());
    // The source's tokenizer beside the weights (a GGUF's from its metadata), so that the
    // checkpoint generates and evaluates without --tokenizer.
    match tokenizer_for_model(&path, None) {
        Ok(tokenizer) => {
            for (name, bytes) in tokenizer.hf_files()? {
                write_atomic(&args.out.join(&name), &bytes)?;
                println!("wrote {}", args.out.join(&name).display());
            }
        }
        Err(_) => println!(
            "no tokenizer beside {}: give --tokenizer FILE when using the checkpoint",
            path.display()
        ),
    }

    println!("{:<16}{:>16}{:>16}", "bytes", "before", "after");
    println!(
        "{:<16}{:>16}{:>16}",
        "float",
        group(before.float),
        group(after.float)
    );
    println!(
        "{:<16}{:>16}{:>16}",
        "NF4 codes",
        group(before.codes),
        group(after.codes)
    );
    println!(
        "{:<16}{:>16}{:>16}",
        "NF4 scales",
        group(before.scales),
        group(after.scales)
    );
    println!(
        "{:<16}{:>16}{:>16}",
        "total",
        group(before.total()),
        group(after.total())
    );
    let quantized = model.config.num_parameters() - after.float / 4;
    println!(
        "block linears: {:.4} bytes per weight ({:.3} bits)",
        (after.codes + after.scales) as f64 / quantized as f64,
        8.0 * (after.codes + after.scales) as f64 / quantized as f64
    );
    Ok(())
}
