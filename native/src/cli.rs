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
    /// Generate text from a prompt, streaming tokens as they come.
    Generate(GenerateArgs),
    /// Quantize a model's block linears to NF4 and write a napkin quantized checkpoint.
    Quantize(QuantizeArgs),
    /// Micro-benchmarks (printed figures, not tests).
    Bench(BenchArgs),
}

/// Where the model comes from.
#[derive(Debug, Args)]
pub struct ModelArgs {
    /// A `.gguf` file, a Hugging Face model folder (config.json + model.safetensors or a sharded
    /// index), or a napkin quantized checkpoint folder.
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
    /// Text to score (needs a tokenizer: the GGUF's own, tokenizer.json beside the model, or --tokenizer).
    #[arg(long)]
    pub text: Option<String>,
    /// A tokenizer.json to use instead of the model's own.
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
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
    /// The model for `generate` (a .gguf file or a model folder).
    #[arg(
        long,
        value_name = "PATH",
        default_value = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
    )]
    pub model: PathBuf,
    /// New tokens per `generate` run (greedy, no early stop).
    #[arg(long, default_value_t = 64)]
    pub tokens: usize,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum BenchCase {
    /// f32 GEMM throughput on every CPU backend compiled in.
    Matmul,
    /// Generation speed (prompt and KV-cached decoding, tokens/s) on the default CPU device.
    Generate,
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

#[derive(Debug, Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt (with --chat: the user's message).
    #[arg(long)]
    pub prompt: String,
    /// Wrap the prompt in the model's chat template (ChatML, Llama-2 or Zephyr).
    #[arg(long)]
    pub chat: bool,
    /// A system message for --chat (default: the template's own, if any).
    #[arg(long)]
    pub system: Option<String>,
    /// Stop after this many new tokens.
    #[arg(long, default_value_t = 128)]
    pub max_new_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Sample only among the k most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Nucleus sampling: the smallest set of tokens with this much probability.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Random seed for sampling.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// A tokenizer.json to use instead of the model's own.
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// Compute device: cpu, wgpu or cuda.
    #[arg(long, default_value = "cpu")]
    pub device: String,
}
