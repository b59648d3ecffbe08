//! The command line, as documented `clap` structs.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// napkin: GPU-poor LLM fine-tuning, with the napkin math next to the measurement.
#[derive(Debug, Parser)]
#[command(name = "napkin", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show a model's configuration, parameter counts and bytes by dtype.
    Inspect(InspectArgs),
    /// Loss and perplexity of a text (or token ids) under a model.
    Eval(EvalArgs),
    /// Quantize a model's block linears to NF4 and write a napkin quantized checkpoint.
    Quantize(QuantizeArgs),
    /// Micro-benchmarks (printed figures, not tests).
    Bench(BenchArgs),
}

/// Where the model comes from.
#[derive(Debug, Args)]
pub struct ModelArgs {
    /// A Hugging Face model folder (config.json + model.safetensors or a sharded index), or a
    /// napkin quantized checkpoint folder.
    #[arg(long, value_name = "PATH")]
    pub model: PathBuf,
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct EvalArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Token ids, comma separated (e.g. `1,2,3`).
    #[arg(
        long,
        value_delimiter = ',',
        conflicts_with = "text",
        required_unless_present = "text"
    )]
    pub ids: Vec<u32>,
    /// Text to score (needs a tokenizer next to the model).
    #[arg(long)]
    pub text: Option<String>,
    /// Compute device: cpu, wgpu or cuda (the latter two only when built with their feature).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// What to measure.
    #[arg(value_enum)]
    pub what: BenchCase,
    /// Timed runs per case (the median is reported).
    #[arg(long, default_value_t = 10)]
    pub runs: usize,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum BenchCase {
    /// f32 GEMM throughput on every CPU backend compiled in.
    Matmul,
}

#[derive(Debug, Args)]
pub struct QuantizeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Output folder (config.json, napkin_quant.json, model.safetensors).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Weights per absmax scale.
    #[arg(long, default_value_t = 64)]
    pub block_size: usize,
    /// Also quantize the scales to 8 bits (QLoRA's double quantization).
    #[arg(long)]
    pub double_quant: bool,
}
