"""DoRA (peft's `use_dora=True`) on a tiny Llama, on a float and an NF4 base: `dora.rs` holds
napkin's DoRA linears to these.

Writes, beside this script:
- `hf/`: the model (`LlamaForCausalLM`, f32, GQA 4 on 2, untied; norms drawn away from 1);
- `lora/`: a peft DoRA adapter (r 4, alpha 8, on q, v, o and down): A and B drawn N(0, 0.05^2)
  after `get_peft_model` made it, and each magnitude vector scaled by 1 + N(0, 0.1^2) away from
  the weight norm peft initialises it to, so that every term of DoRA's output moves;
- `reference.safetensors`:
  - `input_ids` [2, 13];
  - `f32.logits`, `f32.loss` and `f32.grad.<peft name>` for every A, B and magnitude vector:
    the adapter on the float base, `model.train()`, no dropout;
  - `f32.merged_logits`: `merge_and_unload()`'s model on the same ids;
  - `nf4.logits`, `nf4.loss`, `nf4.grad.<peft name>`: the same adapter on the base loaded in
    4 bits by bitsandbytes (nf4, blocks of 64, no double quantization, f32 compute), whose DoRA
    norms read the dequantized weights.

    .venv/bin/python tests/corpus/dora/make_case.py   (torch, transformers, peft, bitsandbytes
    as scripts/reference/requirements.txt pins them)
"""

import copy
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

HERE = Path(__file__).parent
SEED = 9301
TARGETS = ["q_proj", "v_proj", "o_proj", "down_proj"]
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
    """peft's in-memory parameter name → its key in adapter_model.safetensors
    (`….lora_A.weight`, `….lora_magnitude_vector`)."""
    name = name.replace(".default", "")
    return name.removesuffix(".weight") if "lora_magnitude_vector" in name else name


def adapter_params(model):
    return [(n, p) for n, p in model.named_parameters() if "lora_" in n]


def step(model, ids, prefix, ref):
    model.train()
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    ref[f"{prefix}.logits"] = out.logits.detach().float().contiguous()
    ref[f"{prefix}.loss"] = torch.tensor([out.loss.item()], dtype=torch.float32)
    for name, p in adapter_params(model):
        ref[f"{prefix}.grad.{saved_name(name)}"] = p.grad.detach().clone().contiguous()
    return out.loss.item()


def main():
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import BitsAndBytesConfig, LlamaForCausalLM

    model = make_model()
    ids = torch.randint(0, 256, (2, 13), generator=torch.Generator().manual_seed(SEED + 2))
    ref = {"input_ids": ids.contiguous()}

    torch.manual_seed(SEED + 3)
    peft_model = get_peft_model(copy.deepcopy(model), LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS, bias="none",
        use_dora=True, task_type="CAUSAL_LM"))
    g = torch.Generator().manual_seed(SEED + 4)
    with torch.no_grad():
        for name, p in adapter_params(peft_model):
            if "lora_magnitude_vector" in name:
                p.mul_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
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

    f32_loss = step(peft_model, ids, "f32", ref)
    with torch.no_grad():
        merged = copy.deepcopy(peft_model).merge_and_unload()
        ref["f32.merged_logits"] = merged(input_ids=ids).logits.float().contiguous()

    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                               bnb_4bit_use_double_quant=False, bnb_4bit_compute_dtype=torch.float32,
                               bnb_4bit_quant_storage=torch.uint8)
    base4 = LlamaForCausalLM.from_pretrained(HERE / "hf", quantization_config=quant,
                                             dtype=torch.float32, attn_implementation="eager")
    nf4_model = PeftModel.from_pretrained(base4, lora, is_trainable=True)
    nf4_loss = step(nf4_model, ids, "nf4", ref)

    save_file(ref, str(HERE / "reference.safetensors"), metadata={"format": "oracle-v1"})
    import bitsandbytes, peft, transformers
    print(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__,
                      "peft": peft.__version__, "bitsandbytes": bitsandbytes.__version__,
                      "f32_loss": f32_loss, "nf4_loss": nf4_loss,
                      "tensors": sorted(k for k in ref if ".grad." in k)[:6]}, indent=1))


if __name__ == "__main__":
    main()
