"""Writes the ggml dequantization oracle napkin's GGUF reader is checked against.

For each quantization type: a few blocks of seeded random bytes (every byte pattern is a valid
block once its f16 scales are finite; here they are set to small random values) and their
dequantization by the `gguf` package from PyPI (gguf-py, llama.cpp's own Python reader, numpy).
Files: `<type>.blocks` (the raw blocks) and `<type>.f32` (the expected values, little-endian).

    python3 -m venv .venv-gguf && .venv-gguf/bin/pip install gguf==0.19.0 numpy==2.4.6
    .venv-gguf/bin/python tests/corpus/ggml/make_reference.py
"""

from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

HERE = Path(__file__).parent
BLOCKS = 6
rng = np.random.default_rng(20261125)

# Byte offsets of each block's f16 scales (d, and dmin/m where the type has one).
HALF_OFFSETS = {
    "Q4_0": [0],
    "Q4_1": [0, 2],
    "Q5_0": [0],
    "Q5_1": [0, 2],
    "Q8_0": [0],
    "Q3_K": [108],
    "Q4_K": [0, 2],
    "Q5_K": [0, 2],
    "Q6_K": [208],
    "Q2_K": [80, 82],  # last, so the types above keep their random bytes
}

for name, halves in HALF_OFFSETS.items():
    qtype = GGMLQuantizationType[name]
    per_block, block_bytes = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(BLOCKS, block_bytes), dtype=np.uint8)
    for offset in halves:
        scale = rng.uniform(-0.05, 0.05, size=BLOCKS).astype(np.float16)
        raw[:, offset:offset + 2] = scale.view(np.uint8).reshape(BLOCKS, 2)
    values = dequantize(raw.reshape(-1), qtype).astype("<f4")
    assert values.size == BLOCKS * per_block and np.isfinite(values).all()
    (HERE / f"{name}.blocks").write_bytes(raw.tobytes())
    (HERE / f"{name}.f32").write_bytes(values.tobytes())
    print(f"{name}: {BLOCKS} blocks of {per_block} values, {block_bytes} bytes each")

# Quantization: seeded rows (and a block of exact ties, a block of zeros) quantized by gguf-py,
# whose Q8_0 and Q4_0 quantizers are bit-exact with llama.cpp's reference ones.
# Files: `quantize.f32` (the input, shared) and `quantize-<type>.blocks` (the expected blocks).
from gguf.quants import quantize  # noqa: E402

values = rng.normal(0.0, 0.05, size=32 * 30).astype(np.float32)
ties = np.array([127.0] + [k + 0.5 for k in range(-15, 16)], dtype=np.float32)
values = np.concatenate([values, ties, np.zeros(32, dtype=np.float32)])
(HERE / "quantize.f32").write_bytes(values.astype("<f4").tobytes())
for name in ["Q8_0", "Q4_0"]:
    blocks = quantize(values.reshape(1, -1), GGMLQuantizationType[name])
    (HERE / f"quantize-{name}.blocks").write_bytes(blocks.tobytes())
    print(f"quantize {name}: {values.size} values → {blocks.size} bytes")

# The 16-bit floats napkin writes, on the same values and on their edge cases: halfway cases
# (rounded to even), f16 subnormals and underflow, the largest f16 and what overflows it.
# Files: `quantize-halves.f32` (the edge values) and `quantize-<type>.blocks` (both inputs,
# the seeded values first).
halves = np.array([1 + 2.0**-11, 1 + 3 * 2.0**-11, -(1 + 2.0**-11), 1 + 2.0**-8, 1 + 3 * 2.0**-8,
                   6e-8, 3e-8, 1e-8, -1e-9, 65504.0, 65519.0, 65520.0, -70000.0, 3.0e38, 1e-39,
                   0.0, -0.0], dtype=np.float32)
(HERE / "quantize-halves.f32").write_bytes(halves.astype("<f4").tobytes())
for name in ["F16", "BF16"]:
    blocks = quantize(np.concatenate([values, halves]).reshape(1, -1), GGMLQuantizationType[name])
    (HERE / f"quantize-{name}.blocks").write_bytes(blocks.tobytes())
    print(f"quantize {name}: {values.size + halves.size} values → {blocks.nbytes} bytes")
