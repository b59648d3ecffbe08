"""A tiny Mistral with a sliding window shorter than its reference sequence, and transformers'
logits for it: napkin's eager attention must apply the window as transformers does.

A corpus case, not a fixture model: the reference is eager attention over more positions than
the window, against which `sliding_window.rs` holds napkin's eager and efficient attention and
both generation engines. Writes `hf/` (the model) and `reference.safetensors`
(`input_ids` [1, 16], `logits` [1, 16, 96]).

    .venv/bin/python tests/corpus/sliding_window/make_case.py
"""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

HERE = Path(__file__).parent
torch.set_num_threads(2)
torch.use_deterministic_algorithms(True)


def main():
    from transformers import MistralConfig, MistralForCausalLM

    out = HERE / "hf"
    out.mkdir(parents=True, exist_ok=True)
    config = MistralConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                           sliding_window=5, max_position_embeddings=64, rope_theta=10000.0,
                           rms_norm_eps=1e-5, tie_word_embeddings=False, initializer_range=0.05)
    config._attn_implementation = "eager"
    torch.manual_seed(7301)
    model = MistralForCausalLM(config).eval()
    g = torch.Generator().manual_seed(7302)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
    model.save_pretrained(out, safe_serialization=True)
    path = out / "config.json"
    d = json.loads(path.read_text())
    d["torch_dtype"] = "float32"
    path.write_text(json.dumps(d, indent=2, sort_keys=True))
    (out / "generation_config.json").unlink(missing_ok=True)
    ids = torch.randint(0, config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(7303))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    save_file({"input_ids": ids.contiguous(), "logits": logits.contiguous()},
              str(HERE / "reference.safetensors"), metadata={"format": "oracle-v1"})
    print(out, "window", config.sliding_window, "T", ids.shape[1], "logits", tuple(logits.shape))


if __name__ == "__main__":
    main()
