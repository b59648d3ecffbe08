//! The command line, as documented `clap` structs.

use std::path::PathBuf;

use clap::builder::{PossibleValue, PossibleValuesParser};
use clap::{Args, Parser, Subcommand};
use napkin_core::kernels::quantized::ActivationBits;

/// A flag's values, each with the other spellings it accepts: listed in `--help`, offered by
/// shell completion, and checked before anything runs.
fn one_of(values: &'static [(&'static str, &'static [&'static str])]) -> PossibleValuesParser {
    PossibleValuesParser::new(
        values
            .iter()
            .map(|&(name, aliases)| PossibleValue::new(name).aliases(aliases.iter().copied())),
    )
}

const DEVICES: &[(&str, &[&str])] = &[
    ("cpu", &[]),
    ("wgpu", &["gpu"]),
    ("cuda", &[]),
    ("flex", &[]),
    ("ndarray", &["openblas"]),
];
const OPTIMIZERS: &[(&str, &[&str])] = &[
    ("adamw", &[]),
    ("adamw8bit", &["adamw-8bit", "adamw_8bit"]),
    ("sgd", &[]),
];
const DTYPES: &[(&str, &[&str])] = &[
    ("f32", &["fp32", "float32"]),
    ("bf16", &["bfloat16"]),
    ("f16", &["fp16", "float16"]),
];
const WEIGHT_DTYPES: &[(&str, &[&str])] = &[
    ("f32", &["fp32", "float32"]),
    ("f16", &["fp16", "float16"]),
    ("bf16", &["bfloat16"]),
];
const ATTENTION: &[(&str, &[&str])] = &[("eager", &[]), ("efficient", &["flash"])];
const CHAT_FORMATS: &[(&str, &[&str])] = &[("chatml", &[]), ("llama2", &[]), ("zephyr", &[])];
const OFFLOAD: &[(&str, &[&str])] = &[("none", &[]), ("optimizer", &[])];

const TRAIN_EXAMPLES: &str = "\
Examples:
  # QLoRA of SmolLM2-135M on a CPU, a tenth held out, samples at each evaluation
  napkin train --model models/SmolLM2-135M-Instruct.Q4_1.gguf --data data/napkin-instruct.jsonl \\
      --out runs/smol --nf4 --double-quant --lora-r 16 --lr 1e-3 --checkpointing \\
      --val-fraction 0.1 --eval-every 10 --sample-prompt \"Compute 3 + 63.\"
  # the same settings from a file (examples/*.toml); flags win over its keys
  napkin train --config examples/qlora-smollm2-cpu.toml --steps 20
  # continue a killed run from its newest intact checkpoint
  napkin train --config examples/qlora-smollm2-cpu.toml --resume
  # look at a run
  napkin report runs/smol

Every flag is also a key of the TOML file (underscores for dashes); `--offload optimizer` is
`offload_optimizer = true`, `--no-pack` is `pack = false`, and `--sample-prompt` (repeatable) is
`sample_prompts = [...]`.";

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
    /// Write a model (with an adapter folded in) as a Hugging Face folder or a llama.cpp GGUF.
    #[command(after_help = EXPORT_EXAMPLES)]
    Export(ExportArgs),
    /// Napkin math: memory of training a model, from its configuration alone.
    Estimate(EstimateArgs),
    /// Course exercises: list them, show one, check an answer.
    Exercise(ExerciseArgs),
    /// Run real training steps and print predicted vs measured memory per block and per kind.
    Measure(MeasureArgs),
    /// Fine-tune a model (LoRA, QLoRA or full) on a data file, with checkpoints and resume.
    #[command(after_help = TRAIN_EXAMPLES)]
    Train(Box<TrainArgs>),
    /// Micro-benchmarks (printed figures, not tests).
    Bench(BenchArgs),
    /// A training run's curves, samples, settings and memory as one HTML page.
    Report(ReportArgs),
    /// A shell completion script on stdout, e.g. `napkin completions bash > ~/.local/share/bash-completion/completions/napkin`.
    Completions(CompletionsArgs),
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// A `napkin train` output folder (metrics.jsonl, run_config.toml).
    #[arg(value_name = "OUT_DIR")]
    pub run: PathBuf,
    /// Where to write the page (default OUT_DIR/report.html).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// Where the model comes from.
#[derive(Debug, Args)]
pub struct ModelArgs {
    /// A `.gguf` file, a Hugging Face model folder (config.json + model.safetensors or a sharded
    /// index; a Hugging Face cache folder `models--org--name` or one of its snapshots), or a
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
    /// Text to score (needs a tokenizer: the GGUF's own, tokenizer.json beside the model, or --tokenizer).
    #[arg(long)]
    pub text: Option<String>,
    /// A LoRA adapter folder (peft's adapter_config.json + adapter_model.safetensors, as
    /// `napkin train` writes them) applied to the model; a `napkin train` output folder also
    /// brings its NF4 base settings, so the model is the one that was trained.
    #[arg(long, value_name = "DIR")]
    pub adapter: Option<PathBuf>,
    /// A tokenizer.json to use instead of the model's own.
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// Compute device: cpu, wgpu or cuda (the latter two only when built with their feature).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Also write the logits, `[tokens, vocab]` f32, as a NumPy `.npy` file (to compare with
    /// another implementation: `numpy.load(FILE)`).
    #[arg(long, value_name = "FILE")]
    pub logits: Option<PathBuf>,
    /// Score with the engine `generate` runs on the CPU — a GGUF's blocks or an NF4 base's
    /// codes kept, each product's input quantized to these bits — instead of the float model
    /// (every weight dequantized to f32, the default): what the activations' bits cost.
    #[arg(long, value_enum, value_name = "BITS")]
    pub activation_bits: Option<ActivationBitsArg>,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// What to measure.
    #[arg(value_enum)]
    pub what: BenchCase,
    /// Timed runs per case (the median is reported; from 6 runs on, each ratio to a reference
    /// comes with a distribution-free 95 % interval of its median).
    #[arg(long, default_value_t = 15)]
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
    /// `suite`: a Python with torch, transformers, peft and bitsandbytes (scripts/bench.sh
    /// makes one in .venv); its runs alternate with napkin's.
    #[arg(long, value_name = "PYTHON")]
    pub reference: Option<PathBuf>,
    /// `suite`: the reference driver script.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "scripts/bench_reference.py"
    )]
    pub reference_script: PathBuf,
    /// `suite`: the reference's environment: `napkin` (its OpenMP threads pinned one per CPU and
    /// glibc's allocator thresholds raised and one arena, as napkin's own) or `plain` (neither).
    #[arg(long, value_enum, default_value = "napkin")]
    pub reference_env: ReferenceEnv,
    /// `suite`: the reference's AdamW with `fused=True` (PyTorch's one-kernel update, its
    /// strongest optimizer on the CPU) instead of the default for-each implementation.
    #[arg(long)]
    pub reference_fused_adamw: bool,
    /// `suite`: the reference's model under `torch.compile` (inductor, C++ kernels built with
    /// the system compiler) for the training and forward cases; each case's first run, the
    /// compilation, is reported apart and never timed.
    #[arg(long)]
    pub reference_compile: bool,
    /// `suite`: the napkin device (cpu, flex, ndarray, or wgpu/cuda when built with them);
    /// the reference always runs torch on the CPU.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// `suite`, `gpu`, `products`: only the cases (`products`: formats) whose name contains
    /// this text.
    #[arg(long, value_name = "TEXT")]
    pub only: Option<String>,
    /// `suite`, `gpu`, `matmul --page-shapes`: also write every figure as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// `matmul`: the shapes the browser sandbox times, on burn Flex on one thread (the page's
    /// backend and thread count), for `scripts/bench-page.sh` to compare with the page's own.
    #[arg(long)]
    pub page_shapes: bool,
    /// `gpu`: one small case only (a smoke test on a software GPU such as lavapipe).
    #[arg(long)]
    pub smoke: bool,
    /// `generate`: also a QLoRA base (the block linears as NF4, blocks of 64 with double
    /// quantization, as `train --nf4 --double-quant` makes it), kept as NF4 codes and as the
    /// float model that dequantizes them; replaces the f32 engine.
    #[arg(long)]
    pub nf4: bool,
    /// `gpu`: also report the fraction of this device preset's f32 peak (t4, rtx3090,
    /// rtx4090, a100-40gb, a100-80gb, h100, ...: the devices of `napkin estimate`'s roofline).
    #[arg(long, value_name = "ID")]
    pub gpu_preset: Option<String>,
    /// `gpu`: the products' precision: f32, or bf16/f16 autocast (bf16 where the device has
    /// it, else f16).
    #[arg(long, default_value = "f32")]
    pub dtype: String,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum BenchCase {
    /// f32 GEMM throughput on every CPU backend compiled in.
    Matmul,
    /// Generation speed (prompt and KV-cached decoding, tokens/s) on the default CPU device.
    Generate,
    /// The quantized products of generation alone: one [5632, 2048] weight per block format,
    /// 1 and 32 tokens, 8- and 16-bit activations, in cache and streamed from memory.
    Products,
    /// The performance suite (train steps, forward, generation, NF4), beside PyTorch with
    /// `--reference`.
    Suite,
    /// QLoRA (TinyLlama-1.1B shape) and LoRA (SmolLM2-135M) training steps on the first GPU
    /// found (`--device cuda|wgpu` to choose; `--smoke` for one small case).
    Gpu,
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

const EXPORT_EXAMPLES: &str = "\
Examples:
  # a QLoRA run's adapter folded into its base, as a Q8_0 GGUF for llama.cpp / Ollama
  napkin export --model models/SmolLM2-135M-Instruct.Q4_1.gguf --adapter runs/smol \\
      --format gguf --quant q8_0 --out smol-tuned.Q8_0.gguf
  # the same as a Hugging Face folder in bf16, in shards of at most 2 GB
  napkin export --model models/SmolLM2-135M-Instruct.Q4_1.gguf --adapter runs/smol \\
      --format hf --dtype bf16 --max-shard-size 2GB --out smol-tuned/";

const EXPORT_FORMATS: &[(&str, &[&str])] = &[("gguf", &[]), ("hf", &["safetensors"])];
const GGUF_QUANTS: &[(&str, &[&str])] = &[
    ("f32", &[]),
    ("f16", &[]),
    ("q8_0", &[]),
    ("q4_0", &[]),
    ("q4_k", &["q4_k_s"]),
];

#[derive(Debug, Args)]
pub struct ExportArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A LoRA adapter folder (peft's, or a `napkin train` output, which also brings its NF4
    /// base settings) folded into the weights.
    #[arg(long, value_name = "DIR")]
    pub adapter: Option<PathBuf>,
    /// `gguf` (one file, for llama.cpp) or `hf` (a folder: safetensors, config, tokenizer).
    #[arg(long, value_parser = one_of(EXPORT_FORMATS), ignore_case = true, default_value = "gguf")]
    pub format: String,
    /// The output file (gguf) or folder (hf).
    #[arg(long, value_name = "PATH")]
    pub out: PathBuf,
    /// gguf: the type of the 2-D weights (norms stay f32; a row that is not whole blocks
    /// falls back to q8_0, then f16).
    #[arg(long, value_parser = one_of(GGUF_QUANTS), ignore_case = true, default_value = "f16")]
    pub quant: String,
    /// hf: the weights' dtype. Default: the base's own (f16 for a quantized GGUF).
    #[arg(long, value_parser = one_of(WEIGHT_DTYPES), ignore_case = true)]
    pub dtype: Option<String>,
    /// hf: split the weights into shards of at most this size, with an index (`2GB`).
    #[arg(long, value_name = "SIZE", default_value = "5GB")]
    pub max_shard_size: String,
    /// A tokenizer.json instead of the model's own.
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt (with --chat: the user's message).
    #[arg(long)]
    pub prompt: String,
    /// A LoRA adapter folder (peft's adapter_config.json + adapter_model.safetensors, as
    /// `napkin train` writes them) applied to the model; a `napkin train` output folder also
    /// brings its NF4 base settings, so the model is the one that was trained.
    #[arg(long, value_name = "DIR")]
    pub adapter: Option<PathBuf>,
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
    /// Run the float model (every weight dequantized to f32) instead of keeping a GGUF's
    /// quantized blocks or an NF4 base's codes (the default on the CPU: ~4× faster decoding on
    /// SmolLM2, ~12× on a 1.1B NF4 base). An NF4 base (a napkin NF4 checkpoint, or the one an
    /// adapter was trained on) is the same either way: its codes kept, or dequantized.
    #[arg(long)]
    pub dequantize: bool,
    /// With a GGUF's blocks kept: the bits each product's input is quantized to. 16 keeps the
    /// logits within ~1e-4 of the float model's; 8 is llama.cpp's choice, ~10–25 % faster, but
    /// moves them by a few percent (SmolLM2's answer to "the capital of France" changes).
    #[arg(long, value_enum, default_value = "16")]
    pub activation_bits: ActivationBitsArg,
}

/// `bench suite --reference-env`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReferenceEnv {
    /// What napkin gets: pinned OpenMP threads, glibc's thresholds raised.
    Napkin,
    /// Neither.
    Plain,
}

/// `--activation-bits`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum ActivationBitsArg {
    /// 16-bit activations.
    #[value(name = "16")]
    Sixteen,
    /// 8-bit activations, as llama.cpp.
    #[value(name = "8")]
    Eight,
}

impl From<ActivationBitsArg> for ActivationBits {
    fn from(bits: ActivationBitsArg) -> Self {
        match bits {
            ActivationBitsArg::Sixteen => ActivationBits::Sixteen,
            ActivationBitsArg::Eight => ActivationBits::Eight,
        }
    }
}

/// Every flag overrides the same key of `--config FILE` (TOML), which overrides the defaults.
#[derive(Debug, Args)]
pub struct TrainArgs {
    /// A TOML file with the run's settings (keys as the flags, with underscores).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// A `.gguf` file, a HF folder or a napkin NF4 folder.
    #[arg(long, value_name = "PATH")]
    pub model: Option<PathBuf>,
    /// Instead of --model: a named configuration with random weights (tinyllama-1.1b, …), to
    /// see a run's memory and speed at that size without its weights; needs --tokenizer.
    #[arg(long, value_name = "NAME", conflicts_with = "model")]
    pub preset: Option<String>,
    /// `.jsonl` or `.json` records (alpaca, sharegpt, chat `messages`, prompt/completion,
    /// text), or plain `.txt` / `.md`.
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,
    /// The records' format (default auto: the first record's).
    #[arg(long, value_name = "FORMAT",
          value_parser = clap::builder::PossibleValuesParser::new(napkin_core::data::DataFormat::NAMES))]
    pub data_format: Option<String>,
    /// Learn the prompts too, not only the replies / completions.
    #[arg(long)]
    pub train_on_inputs: bool,
    /// Held-out data to evaluate on (any format --data takes).
    #[arg(long, value_name = "FILE", conflicts_with = "val_fraction")]
    pub eval_data: Option<PathBuf>,
    /// Hold out this fraction of --data for evaluation (seeded).
    #[arg(long, value_name = "F")]
    pub val_fraction: Option<f64>,
    /// Evaluate every N steps and after the last (0: only after the last). Default 50.
    #[arg(long, value_name = "N")]
    pub eval_every: Option<u64>,
    /// Stop after N evaluations without a lower held-out loss; the best step's weights are
    /// kept in OUT/best. Default 0 (never).
    #[arg(long, value_name = "N")]
    pub early_stopping: Option<usize>,
    /// A prompt answered greedily at each evaluation (through the chat template), logged to
    /// metrics.jsonl and printed; repeatable. With no held-out data, answered every
    /// --eval-every steps.
    #[arg(long = "sample-prompt", value_name = "TEXT")]
    pub sample_prompts: Vec<String>,
    /// Most tokens generated per sample prompt. Default 48.
    #[arg(long, value_name = "N")]
    pub sample_tokens: Option<usize>,
    /// Output folder: checkpoints, metrics.jsonl, run_config.toml, the final adapter.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Continue from the newest intact checkpoint in --out.
    #[arg(long)]
    pub resume: bool,
    /// Also write the merged model (base + adapters) to OUT/merged: a complete Hugging Face
    /// folder (weights, config, generation config, tokenizer and chat template).
    #[arg(long)]
    pub merge: bool,
    /// The merged weights' dtype. Default: the base's own (f16 for a quantized GGUF).
    #[arg(long, value_parser = one_of(WEIGHT_DTYPES), ignore_case = true)]
    pub merge_dtype: Option<String>,
    /// Split the merged weights into shards of at most this size, with an index
    /// (`500MB`, `2GiB`). Default 5GB.
    #[arg(long, value_name = "SIZE")]
    pub max_shard_size: Option<String>,
    /// A tokenizer.json, or a .gguf's vocabulary, instead of the model's own.
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// A chat format instead of the model's chat template.
    #[arg(long, value_parser = one_of(CHAT_FORMATS), ignore_case = true)]
    pub chat_format: Option<String>,
    /// Continue training this LoRA adapter (a peft folder: a finished run's OUT, say); its
    /// rank, alpha and targets become the run's.
    #[arg(long, value_name = "DIR")]
    pub adapter: Option<PathBuf>,
    /// LoRA rank (0: full fine-tuning). Default 16.
    #[arg(long)]
    pub lora_r: Option<usize>,
    /// LoRA alpha. Default 32.
    #[arg(long)]
    pub lora_alpha: Option<f64>,
    /// LoRA dropout. Default 0. With --checkpointing a block's recomputation drops what its
    /// first forward dropped (the masks are numbered draws of the step's seed).
    #[arg(long)]
    pub lora_dropout: Option<f64>,
    /// rsLoRA: scale the adapters by alpha/sqrt(r) instead of alpha/r (peft's use_rslora).
    #[arg(long)]
    pub rslora: bool,
    /// Adapted linears: all-linear (default) or a list such as q,v.
    #[arg(long)]
    pub targets: Option<String>,
    /// Quantize the frozen base to NF4 (QLoRA).
    #[arg(long)]
    pub nf4: bool,
    /// With --nf4: quantize the scales too.
    #[arg(long)]
    pub double_quant: bool,
    /// With --nf4: weights per absmax block. Default 64.
    #[arg(long, value_name = "N")]
    pub nf4_block_size: Option<usize>,
    /// Recompute decoder blocks in the backward (gradient checkpointing).
    #[arg(long)]
    pub checkpointing: bool,
    /// eager (default; keeps the T×T attention probabilities) or efficient (tiled online
    /// softmax: keeps none, recomputes them in the backward).
    #[arg(long, value_name = "KIND", value_parser = one_of(ATTENTION), ignore_case = true)]
    pub attention: Option<String>,
    /// Rows per micro-batch. Default 1.
    #[arg(long)]
    pub micro_batch: Option<usize>,
    /// Micro-batches per optimizer step (gradient accumulation). Default 1.
    #[arg(long)]
    pub accum: Option<usize>,
    /// Tokens per row. Default 256.
    #[arg(long)]
    pub seq_len: Option<usize>,
    /// One sample per row, padded, instead of packing.
    #[arg(long)]
    pub no_pack: bool,
    /// The optimizer. Default adamw.
    #[arg(long, value_parser = one_of(OPTIMIZERS), ignore_case = true)]
    pub optimizer: Option<String>,
    /// SGD momentum. Default 0.9.
    #[arg(long)]
    pub momentum: Option<f64>,
    /// Peak learning rate. Default 2e-4.
    #[arg(long)]
    pub lr: Option<f64>,
    /// Weight decay. Default 0.
    #[arg(long)]
    pub weight_decay: Option<f64>,
    /// Warm-up steps. Default 5.
    #[arg(long)]
    pub warmup_steps: Option<u64>,
    /// Warm-up as a fraction of the run's steps (wins over --warmup-steps).
    #[arg(long, value_name = "R")]
    pub warmup_ratio: Option<f64>,
    /// The decay after the warm-up. Default cosine.
    #[arg(long, value_name = "KIND",
          value_parser = clap::builder::PossibleValuesParser::new(napkin_core::train::ScheduleKind::NAMES))]
    pub lr_scheduler: Option<String>,
    /// Optimizer steps.
    #[arg(long)]
    pub steps: Option<u64>,
    /// Passes over the data (when --steps is not given). Default 1.
    #[arg(long)]
    pub epochs: Option<f64>,
    /// Clip the global gradient norm (0: off). Default 1.
    #[arg(long)]
    pub max_grad_norm: Option<f64>,
    /// Seed of the adapters, the data order and dropout. Default 42.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Compute precision: f32 (default), or bf16 / f16 mixed precision.
    #[arg(long, value_parser = one_of(DTYPES), ignore_case = true)]
    pub dtype: Option<String>,
    /// Where to train. Default cpu.
    #[arg(long, value_parser = one_of(DEVICES), ignore_case = true)]
    pub device: Option<String>,
    /// `optimizer`: keep the optimizer state and f32 master weights in host memory and
    /// update there (wgpu / cuda only); `none` (default).
    #[arg(long, value_name = "WHAT", value_parser = one_of(OFFLOAD), ignore_case = true)]
    pub offload: Option<String>,
    /// Checkpoint every N steps (0: only at the end). Default 50.
    #[arg(long)]
    pub save_every: Option<u64>,
    /// How many checkpoints to keep (the newest). Default 2.
    #[arg(long, value_name = "N")]
    pub keep_checkpoints: Option<usize>,
    /// Print one line per step instead of a progress bar (the default when stderr is not a
    /// terminal).
    #[arg(long)]
    pub plain: bool,
    /// Start even when the predicted peak memory is more than what is available.
    #[arg(long)]
    pub force: bool,
    /// The memory the run may use (e.g. `8GiB`; default on CPU devices: the machine's
    /// available memory; on GPU devices no check unless given).
    #[arg(long, value_name = "SIZE")]
    pub memory_limit: Option<String>,
}

#[derive(Debug, Args)]
pub struct EstimateArgs {
    /// A HF folder (config.json: llama or bert), a config.json file, or a .gguf file.
    #[arg(long, value_name = "PATH", conflicts_with_all = ["preset", "params"])]
    pub model: Option<PathBuf>,
    /// A named configuration (smollm2-135m, tinyllama-1.1b, llama-2-7b, llama-3-8b, ...).
    #[arg(long, conflicts_with = "params")]
    pub preset: Option<String>,
    /// A bare parameter count (for the rules and the ZeRO estimates).
    #[arg(long)]
    pub params: Option<u64>,
    /// Parameters of the largest layer (ZeRO-3), with --params.
    #[arg(long)]
    pub largest_layer: Option<u64>,
    /// Print the rows `accelerate estimate-memory` prints for this config.
    #[arg(long)]
    pub accelerate: bool,
    /// adamw (default), adamw8bit or sgd.
    #[arg(long, default_value = "adamw")]
    pub optimizer: String,
    /// f32, or bf16 / f16 mixed precision.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// GPUs per node (ZeRO estimates).
    #[arg(long, default_value_t = 1)]
    pub gpus: u64,
    /// Nodes (ZeRO estimates).
    #[arg(long, default_value_t = 1)]
    pub nodes: u64,
    /// zero2 or zero3: DeepSpeed's model-state estimate per GPU and per node's CPU.
    #[arg(long)]
    pub shard: Option<String>,
    /// What ZeRO offloads to the CPU: optimizer, or params,optimizer.
    #[arg(long)]
    pub offload: Option<String>,
    #[command(flatten)]
    pub scenario: ScenarioArgs,
    #[command(flatten)]
    pub pytorch: PyTorchArgs,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `napkin estimate --engine pytorch`: the step as transformers + peft + bitsandbytes spend it.
#[derive(Debug, Args)]
pub struct PyTorchArgs {
    /// napkin (napkin's own engine, default) or pytorch (a Hugging Face training step:
    /// transformers, peft, bitsandbytes; with --lora-r, --nf4, --micro-batch, --seq-len,
    /// --checkpointing, --attention eager|sdpa, --dtype).
    #[arg(long, default_value = "napkin")]
    pub engine: String,
    /// pytorch: cuda (default) or cpu (the kernels save different things).
    #[arg(long, value_name = "DEVICE", default_value = "cuda")]
    pub torch_device: String,
    /// pytorch: train (model.train()), eval, or as-loaded (no train() call: the model in
    /// from_pretrained's eval mode, so HF skips checkpointing, the new adapters in train mode).
    #[arg(long, value_name = "MODE", default_value = "train")]
    pub torch_mode: String,
    /// pytorch: current (torch 2.15, transformers 5, bitsandbytes 0.50) or spring-2024
    /// (transformers 4.40, bitsandbytes 0.43.1).
    #[arg(long, value_name = "RELEASES", default_value = "current")]
    pub torch_releases: String,
    /// pytorch with --nf4: bitsandbytes' 4-bit type, nf4 or fp4 (bitsandbytes' own default).
    #[arg(long, value_name = "TYPE", default_value = "nf4")]
    pub quant_type: String,
    /// pytorch: peft's lora_dropout.
    #[arg(long, default_value_t = 0.05)]
    pub lora_dropout: f64,
    /// pytorch with --checkpointing: use_reentrant=False.
    #[arg(long)]
    pub non_reentrant: bool,
    /// pytorch with --nf4: the model was not passed through `prepare_model_for_kbit_training`,
    /// so the other weights and the hidden states stay in --dtype (FSDP-QLoRA scripts).
    #[arg(long)]
    pub no_kbit_prepare: bool,
    /// pytorch on cuda: the workspace cuBLAS takes from the caching allocator per handle, in
    /// MiB (32 on Hopper, measured on an H200; NVIDIA recommends 4 before Hopper).
    #[arg(long, value_name = "MIB", default_value_t = 32)]
    pub cublas_workspace_mib: u64,
}

#[derive(Debug, Args)]
pub struct MeasureArgs {
    /// A model file or folder (as for `napkin train`).
    #[arg(long, value_name = "PATH", conflicts_with = "preset")]
    pub model: Option<PathBuf>,
    /// A named configuration with random weights (`napkin estimate --preset` lists them).
    #[arg(long, required_unless_present = "model")]
    pub preset: Option<String>,
    #[command(flatten)]
    pub scenario: ScenarioArgs,
    /// adamw, adamw8bit or sgd.
    #[arg(long, default_value = "adamw")]
    pub optimizer: String,
    /// Optimizer steps to run.
    #[arg(long, default_value_t = 3)]
    pub steps: usize,
    /// f32, or bf16 / f16 mixed precision (autocast: the linear layers in 16 bits; bf16 where
    /// the device has it, else f16).
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Compute device: cpu, flex, ndarray, wgpu or cuda.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// `optimizer`: run the optimizer offloaded (state and f32 master weights in host memory;
    /// wgpu / cuda only) and report device and host bytes apart; `none` (default).
    #[arg(long, value_name = "WHAT", default_value = "none")]
    pub offload: String,
    /// Print the report as JSON (the shape the browser app reads).
    #[arg(long)]
    pub json: bool,
    /// Also write the timeline as Chrome Trace Event JSON (open in Perfetto).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ExerciseArgs {
    #[command(subcommand)]
    pub action: ExerciseAction,
}

#[derive(Debug, Subcommand)]
pub enum ExerciseAction {
    /// Every exercise, in teaching order.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// One exercise's question (the seed draws its numbers).
    Show {
        /// The exercise id (`napkin exercise list`).
        id: String,
        /// Which variant.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Also print the hint.
        #[arg(long)]
        hint: bool,
        /// Print JSON (question, hint, sandbox settings; not the answer).
        #[arg(long)]
        json: bool,
    },
    /// Check an answer ("56 GB", "52.2 GiB", "5.6e10 bytes", "compute", ...).
    Check {
        /// The exercise id.
        id: String,
        /// The answer, with its unit.
        #[arg(long)]
        answer: String,
        /// The variant the question was drawn with.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// The training scenario `estimate` predicts and `measure` runs.
#[derive(Debug, Args)]
pub struct ScenarioArgs {
    /// LoRA rank on the linears of --lora-targets (0: full fine-tuning).
    #[arg(long, default_value_t = 0)]
    pub lora_r: usize,
    /// LoRA alpha (the adapters' scale is alpha / r). Default 2r, as `napkin train`'s 32 for
    /// r 16; it changes no byte or FLOP.
    #[arg(long)]
    pub lora_alpha: Option<f64>,
    /// With --lora-r: the adapted linears, all-linear (default) or a list such as q,v (peft's
    /// default for Llama), for both engines.
    #[arg(
        long,
        value_name = "LIST",
        default_value = "all-linear",
        alias = "targets"
    )]
    pub lora_targets: String,
    /// Quantize the block linears to NF4 (QLoRA with --lora-r).
    #[arg(long)]
    pub nf4: bool,
    /// With --nf4: double quantization of the scales.
    #[arg(long)]
    pub double_quant: bool,
    /// With --nf4: weights per absmax block.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub nf4_block_size: usize,
    /// B: rows per micro-batch.
    #[arg(long, default_value_t = 1)]
    pub micro_batch: usize,
    /// T: tokens per row.
    #[arg(long, default_value_t = 256)]
    pub seq_len: usize,
    /// Block-level gradient checkpointing.
    #[arg(long)]
    pub checkpointing: bool,
    /// Micro-batches per optimizer step (gradient accumulation).
    #[arg(long, default_value_t = 1)]
    pub accumulation: usize,
    /// eager (keeps the T×T attention probabilities; the default) or efficient (tiled: keeps
    /// none). With `--engine pytorch`: eager or sdpa, and sdpa by default (Hugging Face's
    /// default attention for Llama).
    #[arg(long, value_name = "KIND")]
    pub attention: Option<String>,
    /// The element-wise layers' implementation the prediction replays: fused-cpu (napkin's
    /// CPU kernels), fused-gpu (the GPU backends in f32: napkin's RMSNorm, RoPE, SwiGLU,
    /// softmax and loss kernels, burn's ops for the rest) or burn-ops (burn's ops alone, which keep more
    /// for the backward). `measure` takes it from its device.
    #[arg(long, value_name = "KIND", default_value = "fused-cpu")]
    pub kernels: String,
    /// How the device lays rows out: contiguous (the CPU backends, wgpu, Metal) or cuda (burn's
    /// CUDA backend pads each row to an aligned pitch: 576-wide f32 rows cost 11 % more).
    /// `measure` and `train` take it from their device.
    #[arg(long, value_name = "LAYOUT", default_value = "contiguous")]
    pub rows: String,
}
