"""Writes the oracle napkin's GGUF quantizers and export type mix are checked against, made by
llama.cpp itself (the library llama-cpp-python 0.3.36 builds and ships; no model is
downloaded).

1. Blocks: `llama-cpp-quantize.f32` (rows of 256 values: weight-like, wide, heavy-tailed,
   one-signed, constant, zero, tiny, mixed-scale, one outlier, exact halves) and, for each type,
   `llama-cpp-<type>.blocks`: what ggml's `ggml_quantize_chunk` (no importance matrix, so the
   reference quantizers llama.cpp's quantizer runs) makes of them.
2. Type mix: `llama-cpp-type-mix.json`: for a few model shapes (f32 GGUFs with seeded weights
   and llama.cpp's Llama SPM vocabulary, `scripts/fetch/llama-cpp-data.sh`), the type llama.cpp's
   quantizer (`llama_model_quantize`) gives each 2-D tensor for each file type.

    python3 -m venv .venv-llama && .venv-llama/bin/pip install llama-cpp-python==0.3.36 gguf==0.19.0 numpy
    .venv-llama/bin/python tests/corpus/ggml/make_llama_cpp_reference.py
"""

import ctypes
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType

HERE = Path(__file__).parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "scripts/reference"))
import llama_cpp  # noqa: E402
from make_kquant_model import quantize, write_model  # noqa: E402

rng = np.random.default_rng(20261204)


def rows():
    """The input rows, 256 values each, every one a case the searches treat differently."""
    out = [rng.normal(0.0, 0.02, 256) for _ in range(16)]  # weight-like
    out += [rng.normal(0.0, 1.0, 256) for _ in range(4)]  # wide
    out += [rng.normal(0.0, 0.02, 256) / np.maximum(rng.uniform(0, 1, 256), 0.05) for _ in range(2)]
    out.append(rng.uniform(0.01, 1.0, 256))  # all positive
    out.append(-rng.uniform(0.01, 1.0, 256))  # all negative
    out.append(np.zeros(256))
    out.append(np.full(256, 0.3))
    out.append(rng.normal(0.0, 1e-9, 256))  # steps below f16's range
    out.append(np.concatenate([rng.normal(0, 10.0 ** (g - 4), 32) for g in range(8)]))
    outlier = np.zeros(256)
    outlier[77] = 3.0
    out.append(outlier + rng.normal(0, 1e-3, 256))
    out.append(np.array([(k % 64 - 32) + 0.5 for k in range(256)]) * 0.01)  # exact halves
    return np.stack(out).astype(np.float32)


def blocks():
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib/libggml-base.so"))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [
        ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
    ]
    values = rows()
    (HERE / "llama-cpp-quantize.f32").write_bytes(values.astype("<f4").tobytes())
    for name in ["Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1", "Q4_0", "Q8_0"]:
        qtype = GGMLQuantizationType[name]
        dst = np.zeros(values.size * 2, dtype=np.uint8)
        n = lib.ggml_quantize_chunk(int(qtype), values.ctypes.data, dst.ctypes.data, 0,
                                    values.shape[0], values.shape[1], None)
        (HERE / f"llama-cpp-{name}.blocks").write_bytes(dst[:n].tobytes())
        print(f"{name}: {values.shape[0]} rows of 256 → {n} bytes")


# (name, (vocab, dim, ffn, layers, heads, kv heads), tied): rows of whole K blocks over 16
# and 28 layers; rows of whole 32-blocks only (the K-quants fall back); rows that are not
# whole 32-blocks (f16 fallback); untied and tied heads; and Phi-3's fused attn_qkv and ffn_up
# (arch phi3: llama.cpp counts attn_qkv as an attn_v).
SHAPES = [
    ("k-rows-16-layers", (32000, 256, 768, 16, 4, 1), False),
    ("k-rows-28-layers", (32000, 256, 512, 28, 4, 2), False),
    ("32-rows-tied", (32000, 288, 800, 12, 6, 2), True),
    ("odd-rows-tied", (32000, 80, 200, 3, 2, 1), True),
    ("phi3-fused-16-layers", (32000, 256, 512, 16, 4, 4), False, "phi3"),
]
FTYPES = ["F16", "Q8_0", "Q4_0", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K"]


def type_mix(vocab):
    out = {}
    with tempfile.TemporaryDirectory() as work:
        for name, shape, tied, *arch in SHAPES:
            arch = arch[0] if arch else "llama"
            source = Path(work) / f"{name}.F32.gguf"
            write_model(source, vocab, 7, shape=shape, dtype=np.float32, tied=tied, arch=arch)
            case = {"vocab": shape[0], "hidden": shape[1], "intermediate": shape[2],
                    "layers": shape[3], "heads": shape[4], "kv_heads": shape[5], "tied": tied,
                    "types": {}}
            if arch != "llama":
                case["arch"] = arch
            for ftype in FTYPES:
                target = Path(work) / f"{name}.{ftype}.gguf"
                quantize(llama_cpp, source, target, ftype)
                reader = GGUFReader(target)
                case["types"][ftype] = {
                    t.name: t.tensor_type.name for t in reader.tensors if len(t.shape) == 2
                }
                target.unlink()
                print(f"{name} {ftype}: {sorted(set(case['types'][ftype].values()))}")
            out[name] = case
    (HERE / "llama-cpp-type-mix.json").write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    blocks()
    type_mix(str(ROOT / "models/llama.cpp/vocab/ggml-vocab-llama-spm.gguf"))
