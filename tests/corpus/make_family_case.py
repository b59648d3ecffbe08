"""A tiny model of one Llama-family architecture (`qwen2`: biases on q, k and v; `qwen3`: an
RMSNorm on each query and key head; `phi3`: q, k, v stored as one `qkv_proj` and gate, up as
one `gate_up_proj`, with a sliding window shorter than the 256 positions) with references from the Python stack over 256 positions,
three QLoRA steps, and the GGUF llama.cpp's own converter writes for it.

Writes, into `tests/corpus/<family>/`:
- `hf/`: the model (`Qwen2ForCausalLM` or `Qwen3ForCausalLM`, f32; biases and norms drawn,
  since HF's zeros and ones would hide a bias or a norm applied twice or not at all);
- `lora/`: a peft adapter (r 8, alpha 16, on q, v, o and down; A and B drawn N(0, 0.05^2));
- `model.f32.gguf`: `hf/` converted by llama.cpp's `convert_hf_to_gguf.py` (`--outtype f32`),
  from the llama-cpp-python 0.3.36 source on PyPI. The converter's tensor and metadata code runs
  as is; only its vocabulary step is replaced (this model has no tokenizer: the file gets 256
  placeholder tokens);
- `reference.safetensors`: `input_ids` [1, 256] and their `logits` [1, 256, 256] (eager
  attention); `qlora.input_ids` [2, 32] and `qlora.losses` [4]: the loss before each of three
  AdamW steps (lr 1e-2, weight decay 0, torch's single-tensor update) and after the last, with
  the base loaded by bitsandbytes in NF4 with double quantization (blocks of 64, f32 compute)
  and the adapter above trained by peft; for `phi3`, `fused_lora.logits` [1, 256, 256]: the
  logits with `fused_lora/`, a peft adapter on the fused `qkv_proj` and `gate_up_proj` (r 4,
  alpha 8, drawn as above); `qlora.absmax_codes_set_to_nearest` [1]: how many
  8-bit absmax codes bitsandbytes' CPU lookup put next to the nearest one, set to the nearest
  before training (napkin's choice, `tests/corpus/nf4_dq`).

    scripts/ci/interop.sh sets up .venv (torch, transformers, peft, bitsandbytes); then:
    .venv/bin/python tests/corpus/make_family_case.py qwen2
    .venv/bin/python tests/corpus/make_family_case.py qwen3
    .venv/bin/python tests/corpus/make_family_case.py phi3
"""

import hashlib
import io
import json
import re
import shutil
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

import torch
from safetensors.torch import save_file

FAMILIES = {
    # Qwen2.5-0.5B's shape at toy size: heads of hidden / heads, tied.
    "qwen2": dict(classes=("Qwen2Config", "Qwen2ForCausalLM"), seed=7401,
                  config=dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                              tie_word_embeddings=True)),
    # Qwen3's: heads wider than hidden / heads, untied (as Qwen3-8B).
    "qwen3": dict(classes=("Qwen3Config", "Qwen3ForCausalLM"), seed=7501,
                  config=dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                              tie_word_embeddings=False, attention_bias=False)),
    # Phi-3-mini's shape at toy size: as many key as query heads, untied, windowed (its 4k
    # checkpoint has a window of 2047). Every fused part is a whole number of double
    # quantization's 256-block groups, as in Phi-3-mini, so bitsandbytes' one quantization of
    # the fused tensor and napkin's split of it hold the same blocks. Without LongRoPE the
    # original context is the context (napkin writes it so).
    "phi3": dict(classes=("Phi3Config", "Phi3ForCausalLM"), seed=7601,
                 config=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=4,
                             tie_word_embeddings=False, sliding_window=200,
                             original_max_position_embeddings=512, pad_token_id=None, bos_token_id=None, eos_token_id=None),
                 targets=["o_proj", "down_proj"], fused_targets=["qkv_proj", "gate_up_proj"]),
}
FAMILY = sys.argv[1] if len(sys.argv) > 1 else ""
if FAMILY not in FAMILIES:
    sys.exit(f"usage: make_family_case.py {{{'|'.join(FAMILIES)}}}")
SPEC = FAMILIES[FAMILY]
SEED = SPEC["seed"]
HERE = Path(__file__).parent / FAMILY
VOCAB = 256
LLAMA_CPP_PYTHON = "0.3.36"
torch.set_num_threads(2)
torch.use_deterministic_algorithms(True)


def model_class():
    import transformers
    return getattr(transformers, SPEC["classes"][1])


def make_model():
    import transformers

    extra = {} if FAMILY == "phi3" else dict(use_sliding_window=False)
    config = getattr(transformers, SPEC["classes"][0])(
        vocab_size=VOCAB, **SPEC["config"], max_position_embeddings=512, rope_theta=1e6,
        rms_norm_eps=1e-6, initializer_range=0.05, hidden_act="silu", **extra)
    config._attn_implementation = "eager"
    torch.manual_seed(SEED)
    model = model_class()(config)
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
    out = HERE / "hf"
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(out, safe_serialization=True)
    path = out / "config.json"
    d = json.loads(path.read_text())
    d["torch_dtype"] = "float32"
    path.write_text(json.dumps(d, indent=2, sort_keys=True))
    (out / "generation_config.json").unlink(missing_ok=True)
    return config, model.eval()


def converter_source(into):
    """llama.cpp's converter and its gguf-py, from the llama-cpp-python source on PyPI."""
    page = urllib.request.urlopen("https://pypi.org/simple/llama-cpp-python/", timeout=120).read().decode()
    match = re.search(rf'href="([^"#]*llama_cpp_python-{re.escape(LLAMA_CPP_PYTHON)}\.tar\.gz)'
                      r'#sha256=([0-9a-f]{64})"', page)
    url, want = match.groups()
    data = urllib.request.urlopen(url, timeout=600).read()
    assert hashlib.sha256(data).hexdigest() == want, "the download's sha256 differs from PyPI's"
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = [m for m in tar.getmembers()
                   if re.search(r"/vendor/llama\.cpp/(convert_hf_to_gguf\.py|conversion/|gguf-py/)", m.name)]
        tar.extractall(into, members=members, filter="data")
    return Path(into) / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"


def convert(hf_dir, out):
    with tempfile.TemporaryDirectory() as tmp:
        root = converter_source(tmp)
        sys.path[:0] = [str(root), str(root / "gguf-py")]
        import gguf
        from conversion import ModelBase, get_model_architecture, get_model_class
        from conversion.base import ModelType

        def placeholder_vocab(self):
            self.gguf_writer.add_tokenizer_model("gpt2")
            self.gguf_writer.add_tokenizer_pre("qwen2")
            self.gguf_writer.add_token_list([f"<{i}>" for i in range(VOCAB)])
            self.gguf_writer.add_token_types([gguf.TokenType.NORMAL] * VOCAB)
            self.gguf_writer.add_token_merges([])

        hparams = ModelBase.load_hparams(hf_dir, False)
        model_class = get_model_class(get_model_architecture(hparams, ModelType.TEXT), mmproj=False)
        model_class.set_vocab = placeholder_vocab
        with torch.inference_mode():
            model_class(hf_dir, gguf.LlamaFileType.ALL_F32, out, eager=True).write()
        return model_class.__name__


def save_adapter(model, out):
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(out)
    (out / "README.md").unlink(missing_ok=True)
    adapter = out / "adapter_config.json"
    d = json.loads(adapter.read_text())
    d["target_modules"] = sorted(d["target_modules"])
    d["base_model_name_or_path"] = None
    adapter.write_text(json.dumps(d, indent=2, sort_keys=True))


def fused_lora_logits(model, ids):
    """The logits with a peft adapter on the fused projections (saved as `fused_lora/`)."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, bias="none",
                                             target_modules=SPEC["fused_targets"],
                                             task_type="CAUSAL_LM"))
    g = torch.Generator().manual_seed(SEED + 5)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    save_adapter(model, HERE / "fused_lora")
    with torch.no_grad():
        return model(input_ids=ids).logits


def qlora_losses(ids):
    from peft import LoraConfig, get_peft_model
    from transformers import BitsAndBytesConfig

    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                               bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.float32,
                               bnb_4bit_quant_storage=torch.uint8)
    base = model_class().from_pretrained(HERE / "hf", quantization_config=quant,
                                            dtype=torch.float32, attn_implementation="eager")
    import bitsandbytes.functional as F

    from safetensors.torch import load_file

    float_weights = load_file(str(HERE / "hf" / "model.safetensors"))
    codebook = F.get_4bit_type("nf4", device="cpu").float()
    replaced = 0
    for name, module in base.named_modules():
        if type(module).__name__ == "Linear4bit":
            w, state = module.weight, module.weight.quant_state
            # bitsandbytes' CPU lookup for the 8-bit absmax codes sometimes takes a neighbour of
            # the nearest code (tests/corpus/nf4_dq); napkin takes the nearest. Those codes are
            # set to the nearest here, so that both sides start from the same base, and counted.
            blocks = float_weights[f"{name}.weight"].reshape(-1, 64).abs().amax(dim=1)
            scale2 = state.state2.absmax[torch.arange(blocks.numel()) // 256]
            scaled = (blocks - state.offset) * (1.0 / scale2)
            nearest = (scaled[:, None] - state.state2.code[None, :]).abs().argmin(dim=1)
            differs = nearest.to(torch.uint8) != state.absmax
            for j in differs.nonzero().flatten().tolist():
                ours, theirs = int(nearest[j]), int(state.absmax[j])
                assert (scaled[j] - state.state2.code[ours]).abs() <= (scaled[j] - state.state2.code[theirs]).abs()
                state.absmax[j] = ours
                replaced += 1
            packed = w.data.reshape(-1)
            codes = torch.stack([packed >> 4, packed & 0xF], dim=1).reshape(-1).long()
            absmax = (F.dequantize_blockwise(state.absmax, state.state2) + state.offset).float()
            n = state.shape.numel()
            exact = (codebook[codes[:n]] * absmax[torch.arange(n) // 64]).reshape(state.shape)
            assert torch.equal(F.dequantize_4bit(w.data, state).float(), exact), name
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, bias="none",
                                            target_modules=SPEC.get("targets", ["q_proj", "v_proj", "o_proj", "down_proj"]),
                                            task_type="CAUSAL_LM"))
    g = torch.Generator().manual_seed(SEED + 3)
    params = [p for n, p in model.named_parameters() if "lora_" in n]
    with torch.no_grad():
        for p in params:
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    save_adapter(model, HERE / "lora")
    optimizer = torch.optim.AdamW(params, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                                  foreach=False, fused=False)
    model.train()
    losses = []
    for _ in range(3):
        loss = model(input_ids=ids, labels=ids).loss
        losses.append(loss.item())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        losses.append(model(input_ids=ids, labels=ids).loss.item())
    return losses, replaced


def main():
    config, model = make_model()
    ids = torch.randint(0, VOCAB, (1, 256), generator=torch.Generator().manual_seed(SEED + 2))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    converter = convert(HERE / "hf", HERE / "model.f32.gguf")
    train_ids = torch.randint(0, VOCAB, (2, 32), generator=torch.Generator().manual_seed(SEED + 4))
    losses, replaced = qlora_losses(train_ids)
    tensors = {"input_ids": ids.contiguous(), "logits": logits.contiguous(),
               "qlora.input_ids": train_ids.contiguous(),
               "qlora.losses": torch.tensor(losses, dtype=torch.float32),
               "qlora.absmax_codes_set_to_nearest": torch.tensor([replaced], dtype=torch.int64)}
    if "fused_targets" in SPEC:
        tensors["fused_lora.logits"] = fused_lora_logits(model, ids).contiguous()
    save_file(tensors, str(HERE / "reference.safetensors"), metadata={"format": "oracle-v1"})
    print("converter", converter, "logits", tuple(logits.shape), "qlora losses", losses,
          "absmax codes set to the nearest", replaced)


if __name__ == "__main__":
    main()
