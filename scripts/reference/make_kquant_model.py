"""A TinyLlama-1.1B-shaped GGUF with random weights, quantized by llama.cpp's own quantizer, for
`napkin bench generate` on the K-quant files practitioners download (Q4_K_M, Q5_K_M, Q6_K).

No weights are downloaded: the values are seeded normal(0, 0.02) in F16, the tokenizer is
llama.cpp's Llama SPM vocabulary (32000 tokens, TinyLlama's; `scripts/fetch/llama-cpp-data.sh`
puts it in models/llama.cpp/vocab). The F16 file is then quantized with
`llama_cpp.llama_model_quantize` (llama-cpp-python), so the blocks and the per-tensor type mix
are llama.cpp's, not napkin's. Speed does not depend on the values; the text generated is noise.

    python3 -m venv .venv-llama && .venv-llama/bin/pip install llama-cpp-python==0.3.36 gguf==0.19.0 numpy
    .venv-llama/bin/python scripts/reference/make_kquant_model.py --out models/random-tinyllama --types Q4_K_M Q6_K
"""

import argparse
import ctypes
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFWriter, GGMLQuantizationType

# TinyLlama-1.1B's shape (napkin's `tinyllama-1.1b` preset).
VOCAB, DIM, FFN, LAYERS, HEADS, KV_HEADS = 32000, 2048, 5632, 22, 32, 4


def tokenizer_fields(vocab_path):
    r = GGUFReader(vocab_path)

    def strings(name):
        f = r.fields[name]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    def values(name):
        f = r.fields[name]
        return [f.parts[i][0].item() for i in f.data]

    def scalar(name):
        f = r.fields[name]
        return f.parts[f.data[0]][0].item()

    return {
        "tokens": strings("tokenizer.ggml.tokens"),
        "scores": values("tokenizer.ggml.scores"),
        "types": values("tokenizer.ggml.token_type"),
        "bos": scalar("tokenizer.ggml.bos_token_id"),
        "eos": scalar("tokenizer.ggml.eos_token_id"),
        "unk": scalar("tokenizer.ggml.unknown_token_id"),
    }


def write_model(path, vocab_path, seed, shape=None, dtype=np.float16, tied=False, arch="llama"):
    """A llama GGUF of `shape` (vocab, dim, ffn, layers, heads, kv_heads; TinyLlama's by
    default) with seeded normal(0, 0.02) weights in `dtype` and llama.cpp's vocabulary at
    `vocab_path` (whose size must be the shape's vocab); `tied` writes no `output.weight`;
    arch `phi3` writes Phi-3's fused `attn_qkv` and `ffn_up` (gate and up), as llama.cpp's
    converter does, and no window."""
    vocab, dim, ffn, layers, heads, kv_heads = shape or (VOCAB, DIM, FFN, LAYERS, HEADS, KV_HEADS)
    tok = tokenizer_fields(vocab_path)
    assert len(tok["tokens"]) == vocab, len(tok["tokens"])
    w = GGUFWriter(str(path), arch)
    if arch == "phi3":
        w.add_rope_scaling_orig_ctx_len(2048)
        w.add_sliding_window(0)
    w.add_name(f"random llama {dim}x{layers}")
    w.add_context_length(2048)
    w.add_embedding_length(dim)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(dim // heads)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(vocab)
    w.add_file_type(1 if dtype == np.float16 else 0)  # mostly F16, or all F32
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tok["tokens"])
    w.add_token_scores(tok["scores"])
    w.add_token_types(tok["types"])
    w.add_bos_token_id(tok["bos"])
    w.add_eos_token_id(tok["eos"])
    w.add_unk_token_id(tok["unk"])
    rng = np.random.default_rng(seed)

    def matrix(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(dtype)

    ones = np.ones(dim, dtype=np.float32)
    head_dim = dim // heads
    w.add_tensor("token_embd.weight", matrix(vocab, dim))
    for i in range(layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones)
        if arch == "phi3":
            w.add_tensor(p + "attn_qkv.weight", matrix((heads + 2 * kv_heads) * head_dim, dim))
        else:
            w.add_tensor(p + "attn_q.weight", matrix(heads * head_dim, dim))
            w.add_tensor(p + "attn_k.weight", matrix(kv_heads * head_dim, dim))
            w.add_tensor(p + "attn_v.weight", matrix(kv_heads * head_dim, dim))
        w.add_tensor(p + "attn_output.weight", matrix(dim, heads * head_dim))
        w.add_tensor(p + "ffn_norm.weight", ones)
        if arch == "phi3":
            w.add_tensor(p + "ffn_up.weight", matrix(2 * ffn, dim))
        else:
            w.add_tensor(p + "ffn_gate.weight", matrix(ffn, dim))
            w.add_tensor(p + "ffn_up.weight", matrix(ffn, dim))
        w.add_tensor(p + "ffn_down.weight", matrix(dim, ffn))
    w.add_tensor("output_norm.weight", ones)
    if not tied:
        w.add_tensor("output.weight", matrix(vocab, dim))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def quantize(llama_cpp, source, target, ftype_name):
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype_name}")
    params.nthread = 0
    rc = llama_cpp.llama_model_quantize(
        str(source).encode(), str(target).encode(), ctypes.byref(params)
    )
    if rc != 0:
        sys.exit(f"error: llama.cpp could not quantize {source} to {ftype_name} (rc {rc})")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, help="folder for the files")
    p.add_argument("--types", nargs="+", default=["Q4_K_M"], help="llama.cpp file types")
    p.add_argument("--vocab", default="models/llama.cpp/vocab/ggml-vocab-llama-spm.gguf")
    p.add_argument("--seed", type=int, default=20261127)
    a = p.parse_args()
    import llama_cpp

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    f16 = out / "random-tinyllama.F16.gguf"
    if not f16.exists():
        partial = f16.with_suffix(".partial")
        write_model(partial, a.vocab, a.seed)
        partial.rename(f16)
    for name in a.types:
        target = out / f"random-tinyllama.{name}.gguf"
        if not target.exists():
            partial = target.with_suffix(".partial")
            quantize(llama_cpp, f16, partial, name)
            partial.rename(target)
        print(target)


if __name__ == "__main__":
    main()
