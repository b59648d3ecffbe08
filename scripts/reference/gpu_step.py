"""The PyTorch column of `napkin bench gpu`: the same training steps on a CUDA GPU with torch +
transformers + peft + bitsandbytes, as a practitioner runs them.

Cases (as native/src/commands/bench/gpu.rs builds them; random weights, seed 0, nothing
downloaded):
- TinyLlama-1.1B-shaped QLoRA: NF4 + double quantization (bitsandbytes, compute dtype bf16),
  `prepare_model_for_kbit_training` with gradient checkpointing, LoRA r 16 / alpha 32 on every
  linear of the blocks, no dropout; B = 1, T = 512 and 2048;
- SmolLM2-135M-shaped LoRA r 16 (f32 weights), T = 512, in f32 and under bf16 autocast.
Each step: forward, backward, AdamW (lr 1e-4, betas 0.9/0.999, eps 1e-8, weight decay 0.01,
as napkin's) and zero_grad, timed to a `torch.cuda.synchronize()`; two warm-up steps, then
`--runs` timed ones (median, min, max). Every case runs with sdpa attention (transformers'
default) and eager attention (what napkin's bench runs), and with torch's default (foreach) and
fused AdamW. Memory: `max_memory_allocated()` over the timed steps, and above what the model
held before the first step.

Usage (a GPU machine): python3 scripts/reference/gpu_step.py [--runs 10] [--only TEXT] [--json FILE]
"""

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import warnings

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
warnings.filterwarnings("ignore")

import torch  # noqa: E402

TINYLLAMA = dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                 num_attention_heads=32, num_key_value_heads=4, tie_word_embeddings=False,
                 rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=2048)
SMOLLM2 = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
               num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True,
               rms_norm_eps=1e-5, rope_theta=100000.0, max_position_embeddings=8192)
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# name (napkin's), shape, seq, method, compute
CASES = [
    ("TinyLlama-1.1B QLoRA r16 NF4+DQ ckpt T=512", TINYLLAMA, 512, "qlora", "bf16"),
    ("TinyLlama-1.1B QLoRA r16 NF4+DQ ckpt T=2048", TINYLLAMA, 2048, "qlora", "bf16"),
    ("SmolLM2-135M LoRA r16 T=512", SMOLLM2, 512, "lora", "f32"),
    ("SmolLM2-135M LoRA r16 T=512", SMOLLM2, 512, "lora", "bf16"),
]


def saved(shape, directory, made={}):
    key = json.dumps(shape, sort_keys=True)
    if key not in made:
        from transformers import LlamaConfig, LlamaForCausalLM
        torch.manual_seed(0)
        path = f"{directory}/{len(made)}"
        LlamaForCausalLM(LlamaConfig(use_cache=False, **shape)).save_pretrained(path)
        made[key] = path
    return made[key]


def build(shape, method, directory):
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import BitsAndBytesConfig, LlamaForCausalLM
    path = saved(shape, directory)
    if method == "qlora":
        quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                   bnb_4bit_use_double_quant=True,
                                   bnb_4bit_compute_dtype=torch.bfloat16)
        model = LlamaForCausalLM.from_pretrained(path, quantization_config=quant,
                                                 device_map="cuda", attn_implementation="sdpa")
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
    else:
        model = LlamaForCausalLM.from_pretrained(path, attn_implementation="sdpa").cuda()
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                      target_modules=ALL_LINEAR)
    model = get_peft_model(model, lora)
    model.train()
    return model


def set_attention(model, kind):
    base = model.get_base_model()
    if hasattr(base, "set_attn_implementation"):
        base.set_attn_implementation(kind)
    else:
        base.config._attn_implementation = kind


def time_steps(model, data, compute, fused, runs):
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.999), eps=1e-8,
                                  weight_decay=0.01, fused=fused)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=compute == "bf16")

    def step():
        with autocast:
            loss = model(data, labels=data).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    seconds = []
    for _ in range(runs):
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated()
    del optimizer
    return seconds, held, peak


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--only")
    parser.add_argument("--json")
    args = parser.parse_args()
    import bitsandbytes
    import peft
    import transformers
    versions = dict(torch=torch.__version__, transformers=transformers.__version__,
                    peft=peft.__version__, bitsandbytes=bitsandbytes.__version__)
    print(f"PyTorch reference on {torch.cuda.get_device_name()}: {versions}", flush=True)
    print("settings: AdamW lr 1e-4 betas (0.9, 0.999) eps 1e-8 weight decay 0.01; LoRA r 16 "
          "alpha 32 dropout 0 on q,k,v,o,gate,up,down; B = 1", flush=True)
    results = []
    with tempfile.TemporaryDirectory() as directory:
        for name, shape, seq, method, compute in CASES:
            if args.only and args.only not in name:
                continue
            model = build(shape, method, directory)
            torch.manual_seed(1)
            data = torch.randint(0, shape["vocab_size"], (1, seq), device="cuda")
            for attention in ("sdpa", "eager"):
                set_attention(model, attention)
                for fused in (False, True):
                    seconds, held, peak = time_steps(model, data, compute, fused, args.runs)
                    median = statistics.median(seconds)
                    row = dict(name=name, compute=compute, attention=attention,
                               adamw="fused" if fused else "foreach", tokens=seq,
                               median_seconds=median, min_seconds=min(seconds),
                               max_seconds=max(seconds), tokens_per_second=seq / median,
                               held_bytes=held, peak_allocated=peak,
                               peak_above_held=peak - held)
                    results.append(row)
                    print(f"{name} [{compute}, {attention}, {row['adamw']} AdamW]: "
                          f"{median * 1e3:.1f} ms median ({min(seconds) * 1e3:.1f}-"
                          f"{max(seconds) * 1e3:.1f}), {seq / median:.0f} tokens/s, peak "
                          f"{peak / 1e9:.3f} GB ({(peak - held) / 1e9:.3f} above held)",
                          flush=True)
            del model
            gc.collect()
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(versions=versions, gpu=torch.cuda.get_device_name(),
                           runs=args.runs, cases=results), f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
