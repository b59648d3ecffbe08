"""LoRA on the embedding and the LM head (peft's `target_modules` with `embed_tokens` and
`lm_head`) on a tiny untied Llama: `head_lora.rs` holds napkin's adapters to these.

Writes, beside this script:
- `hf/`: the model (`LlamaForCausalLM`, f32, GQA 4 on 2, untied head; norms drawn away from 1);
- `lora/`: the peft adapter (r 4, alpha 8, on q, v, lm_head and embed_tokens; every A and B drawn
  N(0, 0.05^2) after `get_peft_model` made it), as `save_pretrained` writes it (its default
  `save_embedding_layers="auto"` adds the embedding's and the head's base weights);
- `reference.safetensors`: `input_ids` [2, 13]; `logits`, `loss` and `grad.<peft name>` for
  every adapter tensor (`model.train()`, no dropout); `merged_logits` from `merge_and_unload()`.

    .venv/bin/python tests/corpus/head_lora/make_case.py   (torch, transformers, peft as
    scripts/reference/requirements.txt pins them)
"""

import copy
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

HERE = Path(__file__).parent
SEED = 9401
TARGETS = ["q_proj", "v_proj", "lm_head", "embed_tokens"]
torch.set_num_threads(2)
torch.use_deterministic_algorithms(True)


def make_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=1e4,
                         tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                         initializer_range=0.02, hidden_act="silu")
    config._attn_implementation = "eager"
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
    out = HERE / "hf"
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(out, safe_serialization=True)
    path = out / "config.json"
    d = json.loads(path.read_text())
    d["rope_theta"] = 1e4  # the transformers 4.x place too
    d["architectures"] = ["LlamaForCausalLM"]
    d["torch_dtype"] = "float32"
    path.write_text(json.dumps(d, indent=2, sort_keys=True))
    (out / "generation_config.json").unlink(missing_ok=True)
    return model


def saved_name(name):
    """peft's in-memory parameter name → its key in adapter_model.safetensors."""
    return name.replace(".default", "")


def main():
    from peft import LoraConfig, get_peft_model

    model = make_model()
    ids = torch.randint(0, 256, (2, 13), generator=torch.Generator().manual_seed(SEED + 2))
    ref = {"input_ids": ids.contiguous()}
    peft_model = get_peft_model(copy.deepcopy(model), LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS, bias="none",
        task_type="CAUSAL_LM"))
    g = torch.Generator().manual_seed(SEED + 3)
    params = [(n, p) for n, p in peft_model.named_parameters() if "lora_" in n]
    with torch.no_grad():
        for _, p in params:
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    lora = HERE / "lora"
    if lora.exists():
        shutil.rmtree(lora)
    peft_model.save_pretrained(lora)
    (lora / "README.md").unlink(missing_ok=True)
    config = lora / "adapter_config.json"
    d = json.loads(config.read_text())
    d["target_modules"] = sorted(d["target_modules"])  # a set in peft: the same file every run
    config.write_text(json.dumps(d, indent=2, sort_keys=True))

    peft_model.train()
    out = peft_model(input_ids=ids, labels=ids)
    out.loss.backward()
    ref["logits"] = out.logits.detach().float().contiguous()
    ref["loss"] = torch.tensor([out.loss.item()], dtype=torch.float32)
    for name, p in params:
        ref[f"grad.{saved_name(name)}"] = p.grad.detach().clone().contiguous()
    with torch.no_grad():
        merged = copy.deepcopy(peft_model).merge_and_unload()
        ref["merged_logits"] = merged(input_ids=ids).logits.float().contiguous()
    save_file(ref, str(HERE / "reference.safetensors"), metadata={"format": "oracle-v1"})

    from safetensors import safe_open
    with safe_open(str(lora / "adapter_model.safetensors"), "pt") as f:
        keys = {k: list(f.get_tensor(k).shape) for k in f.keys()}
    import peft, transformers
    print(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__,
                      "peft": peft.__version__, "loss": out.loss.item(),
                      "adapter_keys": {k: v for k, v in keys.items() if "layers.1" not in k},
                      "grads": sorted(k for k in ref if k.startswith("grad.") and "layers" not in k)},
                     indent=1))


if __name__ == "__main__":
    main()
