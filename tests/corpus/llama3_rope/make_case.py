"""A Llama-3.2-style model whose RoPE scaling bites within 288 positions, as an HF folder and as
the GGUF llama.cpp's converter makes of it, with transformers' logits: for
tests/integration/llama3_rope.rs.

Weights are N(0, 0.1²) (not 0.02²) so that attention, and so position, matters. The schedule
is `rope_type: llama3` with a pre-training context of 64 (Meta's is 8192), so the
low frequencies are divided by the factor and two of the 16 frequencies sit on the smooth ramp
between. The GGUF follows llama.cpp's converter (conversion/llama.py in the llama-cpp-python
0.3.36 source): tensor names, the Q/K row order of its RoPE kernel, no RoPE metadata beyond the
base, and the schedule as per-dimension divisors in `rope_freqs.weight`, computed in float32 as it
computes them. Nothing here is computed by napkin.

Files: `hf/` (config.json, model.safetensors), `model.gguf`, `reference.safetensors`
(`input_ids` [1, 288], `logits` [1, 288, V] with the schedule, `logits_unscaled` with plain RoPE,
`rope_freqs` [16]).

    scripts/ci/interop.sh sets up .venv (torch, transformers, gguf); then:
    .venv/bin/python tests/corpus/llama3_rope/make_case.py
"""

import json
import math
import shutil
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

HERE = Path(__file__).parent
T = 288
SCHEDULE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 8.0,
            "original_max_position_embeddings": 64}
torch.manual_seed(7301)
torch.set_num_threads(2)


def make(scaling):
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32, rope_theta=5e5,
                         rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=512,
                         rope_scaling=scaling, attention_bias=False, mlp_bias=False,
                         initializer_range=0.1)
    config._attn_implementation = "eager"
    return config, LlamaForCausalLM(config)


def converter_factors(config):
    """llama.cpp's converter's `rope_freqs.weight` for a llama3 schedule, in its arithmetic."""
    rope = config.rope_parameters
    base, dim = rope["rope_theta"], config.head_dim
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32)


def permute(w, heads):
    """HF's rotate-half rows to llama.cpp's interleaved pairs, per head (its converter's permute)."""
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


config, model = make(SCHEDULE)
g = torch.Generator().manual_seed(7302)
with torch.no_grad():
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
ids = torch.randint(0, config.vocab_size, (1, T), generator=torch.Generator().manual_seed(7303))
with torch.no_grad():
    logits = model(input_ids=ids).logits.float().contiguous()
    plain_config, plain = make(None)
    plain.load_state_dict(model.state_dict())
    logits_unscaled = plain(input_ids=ids).logits.float().contiguous()
factors = converter_factors(config)
# The divisors are what transformers' schedule does to the plain frequencies.
inv_plain = 1.0 / (config.rope_parameters["rope_theta"] ** (torch.arange(0, 32, 2).float() / 32))
assert torch.allclose(inv_plain / model.model.rotary_emb.inv_freq, factors, rtol=1e-5)
assert (factors == 1).sum() > 0 and (factors == SCHEDULE["factor"]).sum() > 0
ramp = int(((factors > 1) & (factors < SCHEDULE["factor"])).sum())

hf = HERE / "hf"
if hf.exists():
    shutil.rmtree(hf)
model.save_pretrained(hf, safe_serialization=True)
(hf / "generation_config.json").unlink(missing_ok=True)
d = json.loads((hf / "config.json").read_text())
d["rope_theta"] = 5e5
d["rope_scaling"] = SCHEDULE  # the transformers 4.x place too
(hf / "config.json").write_text(json.dumps(d, indent=2, sort_keys=True))

writer = gguf.GGUFWriter(str(HERE / "model.gguf"), "llama")
writer.add_name("llama3-rope")
writer.add_context_length(config.max_position_embeddings)
writer.add_embedding_length(config.hidden_size)
writer.add_block_count(config.num_hidden_layers)
writer.add_feed_forward_length(config.intermediate_size)
writer.add_head_count(config.num_attention_heads)
writer.add_head_count_kv(config.num_key_value_heads)
writer.add_rope_dimension_count(config.head_dim)
writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
writer.add_layer_norm_rms_eps(config.rms_norm_eps)
writer.add_vocab_size(config.vocab_size)
writer.add_file_type(gguf.LlamaFileType.ALL_F32)
names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
         "lm_head.weight": "output.weight"}
short = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
         "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
         "mlp.down_proj": "ffn_down"}
writer.add_tensor("rope_freqs.weight", factors.numpy())
for name, p in model.state_dict().items():
    w = p.detach().float()
    if name in names:
        out = names[name]
    else:
        layer, module = name.removeprefix("model.layers.").split(".", 1)
        out = f"blk.{layer}.{short[module.removesuffix('.weight')]}.weight"
        if module == "self_attn.q_proj.weight":
            w = permute(w, config.num_attention_heads)
        elif module == "self_attn.k_proj.weight":
            w = permute(w, config.num_key_value_heads)
    writer.add_tensor(out, np.ascontiguousarray(w.numpy()))
writer.write_header_to_file()
writer.write_kv_data_to_file()
writer.write_tensors_to_file()
writer.close()

save_file({"input_ids": ids, "logits": logits, "logits_unscaled": logits_unscaled,
           "rope_freqs": factors}, str(HERE / "reference.safetensors"))
gap = float((logits - logits_unscaled).abs().max() / logits.abs().max())
print(f"{ramp} frequencies on the ramp; plain RoPE moves the logits by {gap:.3f} of their largest")
