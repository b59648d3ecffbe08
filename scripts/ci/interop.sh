#!/usr/bin/env bash
# napkin's adapters (LoRA, rsLoRA, DoRA, on the embedding and the head), merged folder and GGUF
# exports loaded by peft, transformers and (when
# LLAMA_CPP_PYTHON names a Python with llama-cpp-python, or .venv has it) llama.cpp, compared
# with napkin's own logits and greedy answer; the K-quant exports compared tensor by tensor with
# llama.cpp's quantizer's files of the same weights; the Phi-3 corpus model's merged folder read by
# transformers.
# Optional, not part of scripts/test.sh: it uses the performance suite's PyTorch reference in
# .venv (set up on first use, ≈ 3 GB from PyPI) plus the `gguf` package transformers reads
# GGUF files with. Trains a short LoRA run on SmolLM2-135M (scripts/fetch/smollm2.sh).
# Usage: scripts/ci/interop.sh   (env: NAPKIN=path/to/napkin to skip the release build,
#        LLAMA_CPP_PYTHON=path/to/python with llama-cpp-python installed)
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! .venv/bin/python -c "import torch, transformers, peft, gguf" 2>/dev/null; then
    echo "setting up the PyTorch reference in .venv (one time, ≈ 3 GB from PyPI)…"
    python3 -m venv .venv
    .venv/bin/pip install --quiet --upgrade pip
    .venv/bin/pip install --quiet -r scripts/reference/requirements.txt gguf==0.19.0
fi
napkin="${NAPKIN:-target/release/napkin}"
if [ -z "${NAPKIN:-}" ]; then
    cargo build --release --locked -p napkin
fi
base="$(bash scripts/fetch/smollm2.sh)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "== a short LoRA run on $base, merged in f32"
"$napkin" train --model "$base" --data data/napkin-instruct.jsonl --out "$work/run" \
    --lora-r 8 --lr 2e-3 --steps 4 --seq-len 96 --save-every 0 --plain \
    --merge --merge-dtype f32 2>&1 | tail -n 3
echo "== a short rsLoRA run (alpha/sqrt(r), peft's use_rslora)"
"$napkin" train --model "$base" --data data/napkin-instruct.jsonl --out "$work/rslora" \
    --lora-r 8 --rslora --lr 2e-3 --steps 4 --seq-len 96 --save-every 0 --plain 2>&1 | tail -n 1
echo "== a short DoRA run (peft's use_dora: a magnitude per output row)"
"$napkin" train --model "$base" --data data/napkin-instruct.jsonl --out "$work/dora" \
    --lora-r 8 --dora --lr 2e-3 --steps 4 --seq-len 96 --save-every 0 --plain 2>&1 | tail -n 1
echo "== exports"
"$napkin" export --model "$base" --adapter "$work/run" --format gguf --quant f32 \
    --out "$work/merged.f32.gguf"
"$napkin" export --model "$base" --adapter "$work/run" --format gguf --quant q8_0 \
    --out "$work/merged.q8_0.gguf"
echo "== compared"
export HF_HUB_DISABLE_PROGRESS_BARS=1 TQDM_DISABLE=1 TRANSFORMERS_VERBOSITY=error
.venv/bin/python scripts/reference/interop.py --napkin "$napkin" --base "$base" --run "$work/run" \
    --gguf-f32 "$work/merged.f32.gguf" --rslora-run "$work/rslora" --dora-run "$work/dora"
"${LLAMA_CPP_PYTHON:-.venv/bin/python}" scripts/reference/interop_llama_cpp.py "$napkin" "$work/merged.q8_0.gguf"
echo "== adapters on embed_tokens and lm_head (an untied corpus model) in peft"
.venv/bin/python scripts/reference/interop_outer.py "$napkin" \
    "${NAPKIN_FIXTURES:-$(cd .. && pwd)/shared/fixtures}"
echo "== Phi-3: napkin's merged folder (fused qkv_proj, gate_up_proj) in transformers"
.venv/bin/python scripts/reference/interop_phi3.py "$napkin"
echo "== K-quant exports (Q4_K_M, Q5_K_M, Q6_K) against llama.cpp's own quantizer"
"${LLAMA_CPP_PYTHON:-.venv/bin/python}" scripts/reference/interop_kquants.py "$napkin" "$base" \
    --adapter "$work/run"
