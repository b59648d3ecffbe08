//! The command line, as documented `clap` structs.

use std::path::PathBuf;

use clap::builder::PossibleValue;
use clap::{Args, Parser, Subcommand, ValueEnum};
use napkin_core::chat::BuiltInChat;
use napkin_core::config::{AttentionKind, Kernels, ObjectiveKind, OptimizerKind};
use napkin_core::data::DataFormat;
use napkin_core::device::DeviceKind;
use napkin_core::io::gguf::export::GgufQuant;
use napkin_core::io::hf_writer::WeightDtype;
use napkin_core::kernels::cpu::quantized::ActivationBits;
use napkin_core::predict::pytorch::{ModuleMode, Quant4bit, TorchDevice};
use napkin_core::predict::row_layout::RowLayout;
use napkin_core::predict::sharding::Strategy;
use napkin_core::train::{ComputeDtype, ScheduleKind, TrainConfig};

/// The defaults of `napkin train`, shown by `--help` (a `--config` file may change them; a
/// flag given on the command line wins over both).
fn train_defaults() -> TrainConfig {
    TrainConfig::default()
}

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
    /// Compute device (wgpu and cuda only when built with their feature).
    #[arg(long, value_enum, ignore_case = true, default_value_t = DeviceKind::Cpu)]
    pub device: DeviceKind,
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
    /// `suite`: a Python with torch, transformers, peft and bitsandbytes (scripts/bench/suite.sh
    /// makes one in .venv); its runs alternate with napkin's.
    #[arg(long, value_name = "PYTHON")]
    pub reference: Option<PathBuf>,
    /// `suite`: the reference driver script.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "scripts/reference/suite.py"
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
    /// `suite`, `gpu`: the napkin device (`gpu` picks the first GPU backend compiled in
    /// unless this names one); the reference always runs torch on the CPU.
    #[arg(long, value_enum, ignore_case = true, default_value_t = DeviceKind::Cpu)]
    pub device: DeviceKind,
    /// `suite`, `gpu`, `products`: only the cases (`products`: formats) whose name contains
    /// this text.
    #[arg(long, value_name = "TEXT")]
    pub only: Option<String>,
    /// `suite`, `gpu`, `matmul --page-shapes`: also write every figure as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// `matmul`: the shapes the browser sandbox times, on burn Flex on one thread (the page's
    /// backend and thread count), for `scripts/bench/page.sh` to compare with the page's own.
    #[arg(long)]
    pub page_shapes: bool,
    /// `gpu`: one small case only (a smoke test on a software GPU such as lavapipe).
    #[arg(long)]
    pub smoke: bool,
    /// `gpu`: time each case's steps op by op only, not also replayed from a device graph
    /// recorded once (as `napkin train` runs them).
    #[arg(long)]
    pub no_capture: bool,
    /// `generate`: also a QLoRA base (the block linears as NF4, blocks of 64 with double
    /// quantization, as `train --nf4 --double-quant` makes it), kept as NF4 codes and as the
    /// float model that dequantizes them; replaces the f32 engine.
    #[arg(long)]
    pub nf4: bool,
    /// `generate`: leave out the float engine (every weight dequantized to f32), which decodes a
    /// GGUF 5–6× slower than its blocks and dominates a long run's time.
    #[arg(long)]
    pub no_float: bool,
    /// `gpu`: also report the fraction of this device preset's f32 peak (t4, rtx3090,
    /// rtx4090, a100-40gb, a100-80gb, h100, ...: the devices of `napkin estimate`'s roofline).
    #[arg(long, value_name = "ID")]
    pub gpu_preset: Option<String>,
    /// `gpu`: the products' precision: f32, or bf16/f16 autocast (bf16 where the device has
    /// it, else f16).
    #[arg(long, value_enum, ignore_case = true, default_value_t = ComputeDtype::F32)]
    pub dtype: ComputeDtype,
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

/// `export --format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    /// One file, for llama.cpp and Ollama.
    Gguf,
    /// A Hugging Face folder: safetensors, config, tokenizer.
    #[value(alias = "safetensors")]
    Hf,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A LoRA adapter folder (peft's, or a `napkin train` output, which also brings its NF4
    /// base settings) folded into the weights.
    #[arg(long, value_name = "DIR")]
    pub adapter: Option<PathBuf>,
    /// What to write.
    #[arg(long, value_enum, ignore_case = true, default_value_t = ExportFormat::Gguf)]
    pub format: ExportFormat,
    /// The output file (gguf) or folder (hf).
    #[arg(long, value_name = "PATH")]
    pub out: PathBuf,
    /// gguf: llama.cpp's file type, each tensor typed as llama.cpp's quantizer types it (q4_k_m:
    /// the head and half the attn_v and ffn_down in q6_k; norms stay f32; a row that is not
    /// whole blocks falls back as llama.cpp's does, then to f16).
    #[arg(long, value_enum, ignore_case = true, default_value_t = GgufQuant::F16)]
    pub quant: GgufQuant,
    /// hf: the weights' dtype. Default: the base's own (f16 for a quantized GGUF).
    #[arg(long, value_enum, ignore_case = true)]
    pub dtype: Option<WeightDtype>,
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
    /// Compute device (wgpu and cuda only when built with their feature).
    #[arg(long, value_enum, ignore_case = true, default_value_t = DeviceKind::Cpu)]
    pub device: DeviceKind,
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

/// Every flag given on the command line overrides the same key of `--config FILE` (TOML),
/// which overrides the defaults `--help` shows (`commands/train/settings.rs`).
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
    /// The records' format (auto: the first record's).
    #[arg(long, value_name = "FORMAT", value_enum, ignore_case = true,
          default_value_t = train_defaults().data_format)]
    pub data_format: DataFormat,
    /// Learn the prompts too, not only the replies / completions.
    #[arg(long)]
    pub train_on_inputs: bool,
    /// What the run minimises: sft, or dpo / orpo on preference pairs (--data holds
    /// `prompt`, `chosen`, `rejected` records, as TRL's).
    #[arg(long, value_name = "OBJECTIVE", value_enum, ignore_case = true,
          default_value_t = train_defaults().objective)]
    pub objective: ObjectiveKind,
    /// DPO's beta (how far from the reference the policy may move) or ORPO's lambda (the
    /// odds-ratio term's weight).
    #[arg(long, value_name = "F", default_value_t = train_defaults().beta)]
    pub beta: f64,
    /// Held-out data to evaluate on (any format --data takes).
    #[arg(long, value_name = "FILE", conflicts_with = "val_fraction")]
    pub eval_data: Option<PathBuf>,
    /// Hold out this fraction of --data for evaluation (seeded).
    #[arg(long, value_name = "F", default_value_t = train_defaults().val_fraction)]
    pub val_fraction: f64,
    /// Evaluate every N steps and after the last (0: only after the last).
    #[arg(long, value_name = "N", default_value_t = train_defaults().eval_every)]
    pub eval_every: u64,
    /// Stop after N evaluations without a lower held-out loss; the best step's weights are
    /// kept in OUT/best (0: never).
    #[arg(long, value_name = "N", default_value_t = train_defaults().early_stopping)]
    pub early_stopping: usize,
    /// Data-parallel training over the ranks a launcher started: `mpirun -np N napkin train
    /// … --shard ddp` (Open MPI, CPU ranks). --micro-batch is per rank; each step trains on
    /// micro-batch × accumulation × ranks sequences. Only ddp trains (`napkin estimate
    /// --shard` predicts the others).
    #[arg(long, value_enum, ignore_case = true)]
    pub shard: Option<Strategy>,
    /// A prompt answered greedily at each evaluation (through the chat template), logged to
    /// metrics.jsonl and printed; repeatable. With no held-out data, answered every
    /// --eval-every steps.
    #[arg(long = "sample-prompt", value_name = "TEXT")]
    pub sample_prompts: Vec<String>,
    /// Most tokens generated per sample prompt.
    #[arg(long, value_name = "N", default_value_t = train_defaults().sample_tokens)]
    pub sample_tokens: usize,
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
    #[arg(long, value_enum, ignore_case = true)]
    pub merge_dtype: Option<WeightDtype>,
    /// Split the merged weights into shards of at most this size, with an index
    /// (`500MB`, `2GiB`).
    #[arg(long, value_name = "SIZE", default_value = "5GB")]
    pub max_shard_size: String,
    /// A tokenizer.json, or a .gguf's vocabulary, instead of the model's own.
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// A chat format instead of the model's chat template.
    #[arg(long, value_enum, ignore_case = true)]
    pub chat_format: Option<BuiltInChat>,
    /// Continue training this LoRA adapter (a peft folder: a finished run's OUT, say); its
    /// rank, alpha and targets become the run's. Under --objective dpo it is also the
    /// reference, frozen (alias --ref-from-adapter; TRL's ref_adapter_name with the adapter loaded
    /// twice); without it the reference is the base.
    #[arg(long, value_name = "DIR", alias = "ref-from-adapter")]
    pub adapter: Option<PathBuf>,
    /// LoRA rank (0: full fine-tuning).
    #[arg(long, default_value_t = train_defaults().lora_r)]
    pub lora_r: usize,
    /// LoRA alpha (the adapters' scale is alpha / r).
    #[arg(long, default_value_t = train_defaults().lora_alpha)]
    pub lora_alpha: f64,
    /// LoRA dropout. With --checkpointing a block's recomputation drops what its first
    /// forward dropped (the masks are numbered draws of the step's seed).
    #[arg(long, default_value_t = train_defaults().lora_dropout)]
    pub lora_dropout: f64,
    /// rsLoRA: scale the adapters by alpha/sqrt(r) instead of alpha/r (peft's use_rslora).
    #[arg(long)]
    pub rslora: bool,
    /// DoRA (peft's use_dora): a trainable magnitude per output row of each adapted linear,
    /// over the direction of the adapted weight; each forward reads the dense weight for its
    /// row norms.
    #[arg(long)]
    pub dora: bool,
    /// The adapted linears: all-linear or a list such as q,v (q, k, v, o, gate, up, down;
    /// Phi-3's qkv_proj and gate_up_proj name their parts), with embed_tokens and lm_head
    /// for adapters on the embedding and the head (an untied model).
    #[arg(long, value_name = "LIST", visible_alias = "targets",
          default_value_t = train_defaults().lora_targets)]
    pub lora_targets: String,
    /// Quantize the frozen base to NF4 (QLoRA).
    #[arg(long)]
    pub nf4: bool,
    /// With --nf4: quantize the scales too.
    #[arg(long)]
    pub double_quant: bool,
    /// With --nf4: weights per absmax block.
    #[arg(long, value_name = "N", default_value_t = train_defaults().nf4_block_size)]
    pub nf4_block_size: usize,
    /// Recompute decoder blocks in the backward (gradient checkpointing).
    #[arg(long)]
    pub checkpointing: bool,
    /// Run the LM head and the loss a chunk of rows at a time (16 MiB of f32 logits each), so
    /// the [B·T, V] logits are never whole. Needs a frozen head (LoRA without lm_head in
    /// --lora-targets).
    #[arg(long)]
    pub chunked_loss: bool,
    /// How the attention's softmax is computed.
    #[arg(long, value_name = "KIND", value_enum, ignore_case = true,
          default_value_t = train_defaults().attention)]
    pub attention: AttentionKind,
    /// B: rows per micro-batch.
    #[arg(long, default_value_t = train_defaults().micro_batch)]
    pub micro_batch: usize,
    /// Micro-batches per optimizer step (gradient accumulation).
    #[arg(long, visible_alias = "accum", default_value_t = train_defaults().accumulation)]
    pub accumulation: usize,
    /// T: tokens per row.
    #[arg(long, default_value_t = train_defaults().seq_len)]
    pub seq_len: usize,
    /// One sample per row, padded, instead of packing.
    #[arg(long)]
    pub no_pack: bool,
    /// On a GPU, launch every step op by op instead of capturing it once as a device graph
    /// and replaying it (the capture is skipped, and said, where the run cannot replay).
    #[arg(long)]
    pub no_capture: bool,
    /// The optimizer.
    #[arg(long, value_enum, ignore_case = true, default_value_t = train_defaults().optimizer)]
    pub optimizer: OptimizerKind,
    /// SGD momentum.
    #[arg(long, default_value_t = train_defaults().momentum)]
    pub momentum: f64,
    /// Peak learning rate.
    #[arg(long, default_value_t = train_defaults().lr)]
    pub lr: f64,
    /// Weight decay.
    #[arg(long, default_value_t = train_defaults().weight_decay)]
    pub weight_decay: f64,
    /// Warm-up steps.
    #[arg(long, default_value_t = train_defaults().warmup_steps)]
    pub warmup_steps: u64,
    /// Warm-up as a fraction of the run's steps (wins over --warmup-steps).
    #[arg(long, value_name = "R")]
    pub warmup_ratio: Option<f64>,
    /// The decay after the warm-up.
    #[arg(long, value_name = "KIND", value_enum, ignore_case = true,
          default_value_t = train_defaults().lr_scheduler)]
    pub lr_scheduler: ScheduleKind,
    /// Optimizer steps (default: --epochs passes over the data).
    #[arg(long)]
    pub steps: Option<u64>,
    /// Passes over the data when --steps is not given (default 1).
    #[arg(long)]
    pub epochs: Option<f64>,
    /// Clip the global gradient norm (0: off).
    #[arg(long, default_value_t = train_defaults().max_grad_norm)]
    pub max_grad_norm: f64,
    /// Seed of the adapters, the data order and dropout.
    #[arg(long, default_value_t = train_defaults().seed)]
    pub seed: u64,
    /// Compute precision: f32, or bf16 / f16 mixed precision.
    #[arg(long, value_enum, ignore_case = true, default_value_t = train_defaults().dtype)]
    pub dtype: ComputeDtype,
    /// Where to train.
    #[arg(long, value_enum, ignore_case = true, default_value_t = train_defaults().device)]
    pub device: DeviceKind,
    /// `optimizer`: keep the optimizer state and f32 master weights in host memory and
    /// update there (wgpu / cuda only).
    #[arg(long, value_name = "WHAT", value_enum, ignore_case = true,
          default_value_t = Offload::None)]
    pub offload: Offload,
    /// Checkpoint every N steps (0: only at the end).
    #[arg(long, default_value_t = train_defaults().save_every)]
    pub save_every: u64,
    /// How many checkpoints to keep (the newest).
    #[arg(long, value_name = "N", default_value_t = train_defaults().keep_checkpoints)]
    pub keep_checkpoints: usize,
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

/// `--offload`: what moves to host memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Offload {
    /// Nothing.
    None,
    /// The optimizer state and the f32 master weights (ZeRO-Offload).
    Optimizer,
    /// The parameters too (`napkin estimate` only: the engine offloads the optimizer).
    #[value(name = "params", alias = "parameters", alias = "params,optimizer")]
    Params,
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
    /// The optimizer.
    #[arg(long, value_enum, ignore_case = true, default_value_t = OptimizerKind::AdamW)]
    pub optimizer: OptimizerKind,
    /// f32, or bf16 / f16 mixed precision.
    #[arg(long, value_enum, ignore_case = true, default_value_t = ComputeDtype::F32)]
    pub dtype: ComputeDtype,
    /// GPUs per node (ZeRO estimates).
    #[arg(long, default_value_t = 1)]
    pub gpus: u64,
    /// Nodes (ZeRO estimates).
    #[arg(long, default_value_t = 1)]
    pub nodes: u64,
    /// How the model state is split over the GPUs (--gpus × --nodes); zero2 and zero3 also
    /// print DeepSpeed's model-state estimate per GPU and per node's CPU.
    #[arg(long, value_enum, ignore_case = true)]
    pub shard: Option<Strategy>,
    /// What goes to the host's memory.
    #[arg(long, value_enum, ignore_case = true)]
    pub offload: Option<Offload>,
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
    /// Whose training step to predict.
    #[arg(long, value_enum, ignore_case = true, default_value_t = Engine::Napkin)]
    pub engine: Engine,
    /// pytorch: where the step runs (the kernels save different things).
    #[arg(long, value_name = "DEVICE", value_enum, ignore_case = true,
          default_value_t = TorchDevice::Cuda)]
    pub torch_device: TorchDevice,
    /// pytorch: which modules are in training mode.
    #[arg(long, value_name = "MODE", value_enum, ignore_case = true,
          default_value_t = ModuleMode::Train)]
    pub torch_mode: ModuleMode,
    /// pytorch: the releases of the stack.
    #[arg(long, value_name = "RELEASES", value_enum, ignore_case = true,
          default_value_t = Releases::Current)]
    pub torch_releases: Releases,
    /// pytorch with --nf4: bitsandbytes' 4-bit type.
    #[arg(long, value_name = "TYPE", value_enum, ignore_case = true,
          default_value_t = Quant4bit::Nf4)]
    pub quant_type: Quant4bit,
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
    /// pytorch with --objective dpo: TRL's precompute_ref_log_probs (the step runs no
    /// reference forward).
    #[arg(long)]
    pub precompute_ref: bool,
    /// pytorch with --objective dpo on cuda: prompt positions per sequence, which TRL's fused
    /// head does not score (default 0: every position scored, the most it holds).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub prompt_tokens: usize,
}

/// `estimate --engine`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Engine {
    /// napkin's own engine.
    Napkin,
    /// A Hugging Face training step: transformers, peft, bitsandbytes (with --lora-r, --nf4,
    /// --micro-batch, --seq-len, --checkpointing, --attention eager|sdpa, --dtype).
    Pytorch,
}

/// `estimate --torch-releases`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Releases {
    /// torch 2.15, transformers 5, bitsandbytes 0.50.
    Current,
    /// transformers 4.40, bitsandbytes 0.43.1.
    #[value(name = "spring-2024")]
    Spring2024,
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
    /// The optimizer.
    #[arg(long, value_enum, ignore_case = true, default_value_t = OptimizerKind::AdamW)]
    pub optimizer: OptimizerKind,
    /// Optimizer steps to run.
    #[arg(long, default_value_t = 3)]
    pub steps: usize,
    /// f32, or bf16 / f16 mixed precision (autocast: the linear layers in 16 bits, and on a GPU
    /// the attention's products and softmax too; bf16 where the device has it, else f16).
    #[arg(long, value_enum, ignore_case = true, default_value_t = ComputeDtype::F32)]
    pub dtype: ComputeDtype,
    /// Compute device.
    #[arg(long, value_enum, ignore_case = true, default_value_t = DeviceKind::Cpu)]
    pub device: DeviceKind,
    /// `optimizer`: run the optimizer offloaded (state and f32 master weights in host memory;
    /// wgpu / cuda only) and report device and host bytes apart.
    #[arg(long, value_name = "WHAT", value_enum, ignore_case = true, default_value_t = Offload::None)]
    pub offload: Offload,
    /// Print the report as JSON (the shape the browser app reads).
    #[arg(long)]
    pub json: bool,
    /// Also write the timeline as Chrome Trace Event JSON (open in Perfetto).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// On a GPU, launch every step op by op instead of replaying the steps after the first
    /// from a device graph recorded once, as `napkin train` runs them (then the step time is
    /// the replays', and the bytes the replayed step holds are compared with the prediction;
    /// the first step, op by op, is the one metered either way).
    #[arg(long)]
    pub no_capture: bool,
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
    /// With --lora-r: DoRA (peft's use_dora), a trainable magnitude per output row of each
    /// adapted linear. napkin's engine only.
    #[arg(long)]
    pub dora: bool,
    /// With --lora-r: the adapted linears, all-linear or a list such as q,v (peft's default
    /// for Llama), for both engines.
    #[arg(
        long,
        value_name = "LIST",
        default_value = "all-linear",
        visible_alias = "targets"
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
    /// B: rows per micro-batch (with --objective dpo or orpo: pairs).
    #[arg(long, default_value_t = 1)]
    pub micro_batch: usize,
    /// T: tokens per row (with --objective dpo or orpo: per sequence; a pair's row holds its
    /// chosen and rejected sequences, up to 2T).
    #[arg(long, default_value_t = 256)]
    pub seq_len: usize,
    /// What the step minimises: sft, or dpo / orpo on preference pairs (DPO adds a reference
    /// forward, graph-free, of each micro-batch). `--engine pytorch` replays sft and dpo (TRL's
    /// DPOTrainer over an adapter); `measure` runs sft.
    #[arg(long, value_name = "OBJECTIVE", value_enum, ignore_case = true, default_value_t = ObjectiveKind::Sft)]
    pub objective: ObjectiveKind,
    /// Block-level gradient checkpointing.
    #[arg(long)]
    pub checkpointing: bool,
    /// The LM head and the loss a chunk of rows at a time (a frozen head): one chunk's
    /// logits instead of the whole [B·T, V].
    #[arg(long)]
    pub chunked_loss: bool,
    /// Micro-batches per optimizer step (gradient accumulation).
    #[arg(long, visible_alias = "accum", default_value_t = 1)]
    pub accumulation: usize,
    /// How the attention's softmax is computed (default eager; with `--engine pytorch`
    /// sdpa, Hugging Face's default for Llama).
    #[arg(long, value_name = "KIND", value_enum, ignore_case = true)]
    pub attention: Option<ScenarioAttention>,
    /// The element-wise layers' implementation the prediction replays: fused-cpu (napkin's
    /// CPU kernels), fused-gpu (the GPU backends in f32: napkin's RMSNorm, RoPE, SwiGLU,
    /// softmax and loss kernels, burn's ops for the rest) or burn-ops (burn's ops alone, which keep more
    /// for the backward). `measure` takes it from its device.
    #[arg(long, value_name = "KIND", value_enum, ignore_case = true, default_value_t = Kernels::FusedCpu)]
    pub kernels: Kernels,
    /// How the device lays rows out: contiguous (the CPU backends, wgpu, Metal) or cuda (burn's
    /// CUDA backend pads each row to an aligned pitch: 576-wide f32 rows cost 11 % more).
    /// `measure` and `train` take it from their device.
    #[arg(
        long,
        value_name = "LAYOUT",
        value_enum,
        ignore_case = true,
        default_value = "contiguous"
    )]
    pub rows: RowLayout,
}

/// `--attention` of `estimate` and `measure`: napkin's two, and PyTorch's sdpa for
/// `--engine pytorch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScenarioAttention {
    /// One of napkin's attentions (with `--engine pytorch`: eager, or efficient as sdpa).
    Napkin(AttentionKind),
    /// `--engine pytorch`: `scaled_dot_product_attention`.
    Sdpa,
}

impl ValueEnum for ScenarioAttention {
    fn value_variants<'a>() -> &'a [Self] {
        &[
            ScenarioAttention::Napkin(AttentionKind::Eager),
            ScenarioAttention::Napkin(AttentionKind::Efficient),
            ScenarioAttention::Sdpa,
        ]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        match self {
            ScenarioAttention::Napkin(kind) => kind.to_possible_value(),
            ScenarioAttention::Sdpa => Some(
                PossibleValue::new("sdpa")
                    .help("--engine pytorch: scaled_dot_product_attention, one fused kernel"),
            ),
        }
    }
}
