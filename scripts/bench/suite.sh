#!/usr/bin/env bash
# napkin's performance suite beside PyTorch (docs/performance.md). On first use it makes .venv
# from PyPI (scripts/reference/requirements.txt: torch, transformers, peft, bitsandbytes), then builds
# the release CLI and runs `napkin bench suite` with the reference interleaved, 2 threads on both
# sides. Figures: printed, and written to runs/bench/suite.json. Not part of scripts/test.sh.
# Usage: scripts/bench/suite.sh [napkin bench suite options, e.g. --only QLoRA]   (env: RUNS, default 15)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
scripts/setup-system.sh
if ! .venv/bin/python -c "import torch, transformers, peft, bitsandbytes" 2>/dev/null; then
    echo "setting up the PyTorch reference in .venv (one time, ≈ 3 GB from PyPI)…"
    python3 -m venv .venv
    .venv/bin/pip install --quiet --upgrade pip
    .venv/bin/pip install --quiet -r scripts/reference/requirements.txt
fi
cargo build --release -p napkin
mkdir -p runs/bench
export RAYON_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2
target/release/napkin bench suite --reference .venv/bin/python --runs "${RUNS:-15}" \
    --json runs/bench/suite.json "$@"
