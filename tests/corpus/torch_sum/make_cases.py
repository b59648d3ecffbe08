"""torch's float32 `sum()` and `mean()` on the CPU, for `tricks/torch_mean.rs` (double
quantization's offset is bitsandbytes' `absmax.mean()`).

The values are exact float32 numbers both sides compute from a seed (SplitMix64, 24 random
bits each, scaled by a power of two), so only the lengths, seeds and torch's results are
stored. Each length is summed with one thread, and the long ones also with 4 and 16 threads:
torch splits a sum of 32,768 values or more between threads, which changes the order.
File: `cases.json`.

    scripts/ci/interop.sh sets up .venv (torch); then:
    .venv/bin/python tests/corpus/torch_sum/make_cases.py
"""

import json
import struct
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).parent
MASK = (1 << 64) - 1


def values(seed, n, signed):
    """n float32 values: 24-bit integers from SplitMix64 times 2^-28 (centred when signed)."""
    out, state = np.empty(n, dtype=np.float32), seed
    for i in range(n):
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        k = (z ^ (z >> 31)) >> 40
        out[i] = (k - (1 << 23) if signed else k) * 2.0 ** -28
    return out


def bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


lengths = list(range(1, 301)) + [511, 1000, 4097, 9216, 32767, 32768, 40000, 100003, 262144]
cases = []
for n in lengths:
    for signed in (False, True):
        seed = 1000 * n + signed
        x = torch.from_numpy(values(seed, n, signed))
        for threads in (1, 4, 16) if n >= 32768 else (1,):
            torch.set_num_threads(threads)
            cases.append({"n": n, "seed": seed, "signed": signed, "threads": threads,
                          "sum_bits": bits(x.sum().item()), "mean_bits": bits(x.mean().item())})
meta = {"produced_by": f"torch {torch.__version__} on the CPU ({torch.backends.cpu.get_cpu_capability()})",
        "cases": cases}
lines = ",\n".join("  " + json.dumps(c) for c in cases)
(HERE / "cases.json").write_text(f'{{"produced_by": {json.dumps(meta["produced_by"])},\n "cases": [\n{lines}\n]}}\n')
print(len(cases), "cases")
