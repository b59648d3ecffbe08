"""napkin's K-quant GGUF exports against llama.cpp's own quantizer on a real model (called by
scripts/ci/interop.sh, or alone): napkin exports the model as F32 and as each K-quant file
type; llama.cpp (llama-cpp-python's `llama_model_quantize`) quantizes napkin's F32 file to the
same type; every tensor's type and bytes are compared (both must be equal). Then a chat prompt
is answered greedily by `napkin generate` on napkin's file and by llama.cpp on the same weights
dequantized to F32 (napkin's export of napkin's file), which must agree, and by llama.cpp on
napkin's file itself, printed only: llama.cpp rounds the activations to 8 bits in its quantized
products (Q8_K / Q8_0), and on SmolLM2 that alone changes the greedy answer (its answer on the
F32 of the same weights is napkin's).

    .venv-llama/bin/python scripts/reference/interop_kquants.py NAPKIN MODEL [--adapter DIR]
"""

import argparse
import ctypes
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import llama_cpp
    from gguf import GGUFReader
except ImportError:
    print("  llama-cpp-python (and gguf) are not installed here: the K-quant check is skipped")
    sys.exit(0)

FILE_TYPES = ["Q4_K_M", "Q5_K_M", "Q6_K"]
PROMPT = "What is the capital of France?"


def export(napkin, model, adapter, quant, out):
    cmd = [napkin, "export", "--model", model, "--format", "gguf", "--quant", quant, "--out", out]
    if adapter:
        cmd += ["--adapter", adapter]
    subprocess.run(cmd, check=True, capture_output=True)


def llama_cpp_quantize(source, target, file_type):
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{file_type}")
    rc = llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(),
                                        ctypes.byref(params))
    if rc != 0:
        sys.exit(f"error: llama.cpp could not quantize {source} to {file_type} (rc {rc})")


def compare(ours_path, theirs_path):
    ours = {t.name: t for t in GGUFReader(ours_path).tensors}
    theirs = {t.name: t for t in GGUFReader(theirs_path).tensors}
    assert ours.keys() == theirs.keys(), sorted(set(ours) ^ set(theirs))
    types, counts, differ = [], {}, []
    for name, t in theirs.items():
        o = ours[name]
        if o.tensor_type != t.tensor_type:
            types.append(f"{name}: napkin {o.tensor_type.name}, llama.cpp {t.tensor_type.name}")
        elif bytes(o.data.tobytes()) != bytes(t.data.tobytes()):
            differ.append(name)
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return types, differ, counts


def llama_cpp_answer(gguf):
    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=256, n_threads=2, verbose=False)
    out = llm.create_chat_completion(messages=[{"role": "user", "content": PROMPT}],
                                     max_tokens=16, temperature=0.0)
    return out["choices"][0]["message"]["content"].strip()


def napkin_answer(napkin, gguf):
    return subprocess.run(
        [napkin, "generate", "--model", str(gguf), "--chat", "--prompt", PROMPT,
         "--max-new-tokens", "16"], check=True, capture_output=True, text=True).stdout.strip()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("napkin")
    p.add_argument("model")
    p.add_argument("--adapter")
    a = p.parse_args()
    failed = False
    with tempfile.TemporaryDirectory() as work:
        f32 = Path(work) / "model.F32.gguf"
        export(a.napkin, a.model, a.adapter, "f32", f32)
        for file_type in FILE_TYPES:
            ours = Path(work) / f"napkin.{file_type}.gguf"
            theirs = Path(work) / f"llama-cpp.{file_type}.gguf"
            export(a.napkin, a.model, a.adapter, file_type.lower(), ours)
            llama_cpp_quantize(f32, theirs, file_type)
            types, differ, counts = compare(ours, theirs)
            mix = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
            print(f"  {file_type}: {sum(counts.values())} tensors ({mix}); types differing: "
                  f"{len(types)}, bytes differing: {len(differ)}")
            for line in types + differ[:5]:
                print(f"    {line}")
            dequantized = Path(work) / f"napkin.{file_type}.F32.gguf"
            export(a.napkin, str(ours), None, "f32", dequantized)
            mine, exact = napkin_answer(a.napkin, ours), llama_cpp_answer(dequantized)
            same = mine == exact
            print(f"  {file_type}: napkin on napkin's file:             {mine!r}")
            print(f"  {file_type}: llama.cpp on its weights in F32:     {exact!r} "
                  f"({'the same' if same else 'DIFFERENT'})")
            print(f"  {file_type}: llama.cpp on napkin's file (8-bit activations): "
                  f"{llama_cpp_answer(ours)!r}")
            failed |= bool(types or differ) or not same
            for path in (theirs, ours, dequantized):
                path.unlink()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
