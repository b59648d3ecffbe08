//! The suite's cases: what each one runs, how its speed is counted, and how the PyTorch
//! reference (`scripts/reference/suite.py`) is told to run the same thing.

use napkin_core::config::{AttentionKind, LlamaConfig, LoraConfig, Nf4Config};
use napkin_core::predict::inventory::Scenario;
use napkin_core::predict::time::step_work;
use napkin_core::train::OptimizerConfig;
use serde_json::{Value, json};

/// What one timed run does.
#[derive(Debug, Clone)]
pub enum Work {
    /// One optimizer step (forward, backward, AdamW) of the scenario on synthetic tokens.
    Train(Scenario),
    /// One forward without gradients (f32, no tricks).
    Forward(Scenario),
    /// Greedy generation with a KV cache: a `prompt`-token prefill, then `new_tokens` tokens.
    Generate {
        config: LlamaConfig,
        prompt: usize,
        new_tokens: usize,
    },
    /// NF4-quantize an f32 `[rows, cols]` matrix (block 64, double quantization).
    Nf4Quantize { rows: usize, cols: usize },
    /// Dequantize it back to f32.
    Nf4Dequantize { rows: usize, cols: usize },
    /// `x · Wᵀ` with `x` `[tokens, cols]` and W NF4 `[rows, cols]` (inference).
    Nf4Matmul {
        tokens: usize,
        rows: usize,
        cols: usize,
    },
    /// A square f32 GEMM `[n, n] × [n, n]`: the machine's attainable FLOP/s.
    Matmul { n: usize },
}

/// What a case counts per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Tokens,
    MegaWeights,
    Gflop,
}

impl Unit {
    pub fn label(self) -> &'static str {
        match self {
            Unit::Tokens => "tok/s",
            Unit::MegaWeights => "Mweight/s",
            Unit::Gflop => "GFLOP/s",
        }
    }
}

/// One benchmark case.
#[derive(Debug, Clone)]
pub struct Case {
    pub name: String,
    pub work: Work,
}

/// Weights an NF4 quantize or dequantize run handles at least ([`Case::repeats`]).
const WEIGHTS_PER_RUN: usize = 1 << 26;

/// FLOPs an NF4 matmul run does at least ([`Case::repeats`]).
const FLOPS_PER_RUN: f64 = 4e9;

/// The NF4 settings of every quantized case (QLoRA's: block 64, double quantization).
pub const NF4: Nf4Config = Nf4Config {
    block_size: 64,
    double_quant: true,
};

/// The train cases' learning rate (both sides).
pub const LEARNING_RATE: f64 = 1e-5;

impl Case {
    /// The hyper-parameters both sides must share, as napkin runs them; the reference answers
    /// its own, read back from the objects it built, and the suite refuses a comparison when
    /// they differ.
    pub fn settings(&self, threads: usize) -> Value {
        let mut settings = json!({ "threads": threads });
        if let Work::Train(s) = &self.work {
            let adamw = OptimizerConfig::default().adamw;
            settings["optimizer"] = json!({
                "name": "AdamW",
                "lr": LEARNING_RATE,
                "betas": [adamw.beta1, adamw.beta2],
                "eps": adamw.eps,
                "weight_decay": adamw.weight_decay,
            });
            if let Some(lora) = &s.lora {
                let mut targets: Vec<&str> = lora.targets.iter().map(|t| t.module_name()).collect();
                targets.sort_unstable();
                settings["lora"] = json!({
                    "r": lora.r,
                    "alpha": lora.alpha,
                    "dropout": lora.dropout,
                    "targets": targets,
                });
            }
            if let Some(nf4) = &s.nf4 {
                settings["nf4"] = json!({
                    "block_size": nf4.block_size,
                    "double_quant": nf4.double_quant,
                });
            }
            settings["checkpointing"] = json!(s.checkpointing);
        }
        settings
    }

    fn new(name: impl Into<String>, work: Work) -> Self {
        Case {
            name: name.into(),
            work,
        }
    }

    pub fn unit(&self) -> Unit {
        match self.work {
            Work::Train(_) | Work::Forward(_) | Work::Generate { .. } => Unit::Tokens,
            Work::Nf4Quantize { .. } | Work::Nf4Dequantize { .. } => Unit::MegaWeights,
            Work::Nf4Matmul { .. } | Work::Matmul { .. } => Unit::Gflop,
        }
    }

    /// How many times one run repeats the operation: the NF4 operations take milliseconds, and
    /// one call after the pause between runs measures waking threads and cold caches more than
    /// the kernel, so a run repeats them up to [`WEIGHTS_PER_RUN`] weights or
    /// [`FLOPS_PER_RUN`] (both sides alike). Everything else runs once.
    pub fn repeats(&self) -> usize {
        match &self.work {
            Work::Nf4Quantize { rows, cols } | Work::Nf4Dequantize { rows, cols } => {
                WEIGHTS_PER_RUN.div_ceil(rows * cols).max(1)
            }
            Work::Nf4Matmul { tokens, rows, cols } => (FLOPS_PER_RUN
                / (2.0 * (tokens * rows * cols) as f64))
                .ceil()
                .max(1.0) as usize,
            _ => 1,
        }
    }

    /// Units of work in one run (tokens, millions of weights, GFLOP): speed = amount / seconds.
    pub fn amount(&self) -> f64 {
        match &self.work {
            Work::Train(s) | Work::Forward(s) => s.tokens() as f64,
            Work::Generate { new_tokens, .. } => *new_tokens as f64,
            Work::Nf4Quantize { rows, cols } | Work::Nf4Dequantize { rows, cols } => {
                (rows * cols * self.repeats()) as f64 / 1e6
            }
            Work::Nf4Matmul { .. } | Work::Matmul { .. } => self.flops() / 1e9,
        }
    }

    /// Floating-point operations of one run (0 where FLOPs say nothing, e.g. quantization).
    /// Generation counts each token's forward as if without a cache: an upper bound.
    pub fn flops(&self) -> f64 {
        let repeats = self.repeats() as f64;
        repeats
            * match &self.work {
                Work::Train(s) => step_work(s).flops(),
                Work::Forward(s) => step_work(s).forward_flops,
                Work::Generate {
                    config, new_tokens, ..
                } => {
                    let per_token = step_work(&Scenario::new(config.clone(), 1, 1)).forward_flops;
                    per_token * *new_tokens as f64
                }
                Work::Nf4Quantize { .. } | Work::Nf4Dequantize { .. } => 0.0,
                Work::Nf4Matmul { tokens, rows, cols } => 2.0 * (tokens * rows * cols) as f64,
                Work::Matmul { n } => 2.0 * (n * n * n) as f64,
            }
    }

    /// The case as the reference script reads it.
    pub fn reference_request(&self) -> Value {
        match &self.work {
            Work::Train(s) => json!({
                "kind": "train",
                "config": s.config.to_hf_json(),
                "method": match (&s.lora, &s.nf4) {
                    (None, _) => "full",
                    (Some(_), None) => "lora",
                    (Some(_), Some(_)) => "qlora",
                },
                "lora_r": s.lora.as_ref().map_or(0, |l| l.r),
                "lora_alpha": s.lora.as_ref().map_or(0.0, |l| l.alpha),
                "checkpointing": s.checkpointing,
                "settings": self.settings(0),
                "batch": s.micro_batch,
                "seq": s.seq_len,
            }),
            Work::Forward(s) => json!({
                "kind": "forward",
                "config": s.config.to_hf_json(),
                "batch": s.micro_batch,
                "seq": s.seq_len,
            }),
            Work::Generate {
                config,
                prompt,
                new_tokens,
            } => json!({
                "kind": "generate",
                "config": config.to_hf_json(),
                "prompt": prompt,
                "new_tokens": new_tokens,
            }),
            Work::Nf4Quantize { rows, cols } => {
                nf4_request("nf4_quantize", *rows, *cols, 0, self.repeats())
            }
            Work::Nf4Dequantize { rows, cols } => {
                nf4_request("nf4_dequantize", *rows, *cols, 0, self.repeats())
            }
            Work::Nf4Matmul { tokens, rows, cols } => {
                nf4_request("nf4_matmul", *rows, *cols, *tokens, self.repeats())
            }
            Work::Matmul { n } => json!({ "kind": "matmul", "n": n }),
        }
    }
}

fn nf4_request(kind: &str, rows: usize, cols: usize, tokens: usize, repeats: usize) -> Value {
    json!({
        "kind": kind,
        "rows": rows,
        "cols": cols,
        "tokens": tokens,
        "repeats": repeats,
        "block_size": NF4.block_size,
        "double_quant": NF4.double_quant,
    })
}

/// The attention of the model cases. The reference runs transformers' SDPA attention (its
/// default, a fused memory-efficient kernel on the CPU), so napkin runs its own
/// memory-efficient one: the like-for-like choice.
const ATTENTION: AttentionKind = AttentionKind::Efficient;

/// Every case of the suite, the attainable-GEMM case first.
pub fn suite() -> Vec<Case> {
    let mut cases = vec![Case::new("f32 GEMM 2048³", Work::Matmul { n: 2048 })];
    let models = [
        ("SmolLM2-135M 1×256", LlamaConfig::smollm2_135m(), 1, 256),
        ("small 4×128", LlamaConfig::small(), 4, 128),
    ];
    for (model, config, batch, seq) in &models {
        for method in ["full FT", "LoRA r16", "QLoRA r16"] {
            for checkpointing in [false, true] {
                let mut s = Scenario::new(config.clone(), *batch, *seq);
                if method != "full FT" {
                    s.lora = Some(LoraConfig::default());
                }
                if method == "QLoRA r16" {
                    s.nf4 = Some(NF4);
                }
                s.checkpointing = checkpointing;
                s.attention = ATTENTION;
                let ckpt = if checkpointing { " +ckpt" } else { "" };
                cases.push(Case::new(
                    format!("train {model} {method}{ckpt}"),
                    Work::Train(s),
                ));
            }
        }
        cases.push(Case::new(
            format!("forward {model}"),
            Work::Forward(Scenario {
                attention: ATTENTION,
                ..Scenario::new(config.clone(), *batch, *seq)
            }),
        ));
    }
    cases.push(Case::new(
        "generate SmolLM2-135M 32+64",
        Work::Generate {
            config: LlamaConfig::smollm2_135m(),
            prompt: 32,
            new_tokens: 64,
        },
    ));
    for (rows, cols) in [(1536, 576), (4096, 4096)] {
        cases.push(Case::new(
            format!("NF4 quantize {rows}×{cols}"),
            Work::Nf4Quantize { rows, cols },
        ));
        cases.push(Case::new(
            format!("NF4 dequantize {rows}×{cols}"),
            Work::Nf4Dequantize { rows, cols },
        ));
        cases.push(Case::new(
            format!("NF4 matmul 256×{cols} · ({rows}×{cols})ᵀ"),
            Work::Nf4Matmul {
                tokens: 256,
                rows,
                cols,
            },
        ));
    }
    cases
}
