"""Double quantization's offset as bitsandbytes computes it: torch's float32 `absmax.mean()`.

For NF4 blocks of 64, 128 and 256 (two seeds each) bitsandbytes 0.50 quantizes a seeded weight
on the CPU with `compress_statistics=True`; this writes the first-level absmax values (exact,
`max|x|` per block), the offset bitsandbytes stored, its 8-bit codes for `absmax − offset`, the
second-level scales and its dequantized absmax, for tests/integration/nf4_parity.rs.
Files: `cases.json` (shapes, offsets, and where each array starts) and `cases.bin` (the arrays,
little-endian, one after another).

    scripts/ci/interop.sh sets up .venv (torch, bitsandbytes); then:
    .venv/bin/python tests/corpus/nf4_dq/make_cases.py
"""

import json
from pathlib import Path

import bitsandbytes.functional as F
import numpy as np
import torch

HERE = Path(__file__).parent
torch.set_num_threads(1)
blob = bytearray()
cases = []


def put(array, dtype):
    start = len(blob)
    blob.extend(np.ascontiguousarray(array, dtype=dtype).tobytes())
    return [start, int(array.size)]


for block in (64, 128, 256):
    for seed in (1, 2):
        g = torch.Generator().manual_seed(1000 * block + seed)
        # Enough blocks for several second-level blocks of 256 and a partial one.
        rows = (256 * 3 + 77) * block // 256
        w = (torch.randn(rows, 256, generator=g) * 0.02).float()
        _, state = F.quantize_4bit(w, blocksize=block, compress_statistics=True, quant_type="nf4")
        absmax = w.reshape(-1, block).abs().amax(dim=1)
        torch_mean = absmax.mean()
        dequantized_absmax = F.dequantize_blockwise(state.absmax, state.state2) + state.offset
        cases.append({
            "block": block,
            "seed": seed,
            "absmax_count": int(absmax.numel()),
            "offset": float(state.offset),
            "torch_mean_equals_offset": bool(torch_mean.item() == float(state.offset)),
            "absmax": put(absmax.numpy(), "<f4"),
            "qabsmax": put(state.absmax.numpy(), "u1"),
            "absmax2": put(state.state2.absmax.numpy(), "<f4"),
            "absmax_dequant": put(dequantized_absmax.float().numpy(), "<f4"),
        })
        print(f"block {block} seed {seed}: {absmax.numel()} absmax values, offset {float(state.offset)!r}")

meta = {"produced_by": f"bitsandbytes {__import__('bitsandbytes').__version__}, torch {torch.__version__}, CPU",
        "cases": cases}
(HERE / "cases.json").write_text(json.dumps(meta, indent=1) + "\n")
(HERE / "cases.bin").write_bytes(bytes(blob))
