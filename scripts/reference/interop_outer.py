"""peft loads napkin's adapters on the embedding and the LM head (called by scripts/ci/interop.sh).

Trains two steps on tests/corpus/head_lora's untied model with LoRA on q, v, embed_tokens and
lm_head (its 256 tokens take the shared byte-level tokenizer without its merges, written here),
then loads the adapter with peft's `PeftModel.from_pretrained` on transformers' load of the same
folder: its logits must be napkin's within 1e-5 of the largest, and the adapter must move them.

    .venv/bin/python scripts/reference/interop_outer.py NAPKIN FIXTURES
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).parent))
from interop import RELATIVE_TOLERANCE, napkin_logits, torch_logits  # noqa: E402


def main():
    napkin, fixtures = sys.argv[1], Path(sys.argv[2])
    model_dir = Path("tests/corpus/head_lora/hf")
    work = Path(tempfile.mkdtemp())
    tokenizer = json.loads((fixtures / "tokenizer" / "tokenizer.json").read_text())
    tokenizer["model"]["merges"] = []
    tokenizer["model"]["vocab"] = {k: v for k, v in tokenizer["model"]["vocab"].items() if v < 256}
    (work / "tokenizer.json").write_text(json.dumps(tokenizer))
    run = work / "run"
    subprocess.run([napkin, "train", "--model", str(model_dir), "--tokenizer", str(work / "tokenizer.json"),
                    "--chat-format", "chatml", "--data", "data/napkin-instruct.jsonl", "--out", str(run),
                    "--lora-r", "4", "--lora-targets", "q,v,lm_head,embed_tokens", "--lr", "1e-2",
                    "--seq-len", "256", "--steps", "2", "--plain"], check=True, capture_output=True)
    ids = [(i * 37 + 5) % 256 for i in range(20)]
    ours = napkin_logits(napkin, model_dir, ids, work / "napkin.npy", adapter=run)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    theirs = torch_logits(PeftModel.from_pretrained(base, run).eval(), ids)
    plain = torch_logits(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval(), ids)
    err, scale = float(np.abs(ours - theirs).max()), float(np.abs(theirs).max())
    moved = float(np.abs(theirs - plain).max())
    ok = err <= RELATIVE_TOLERANCE * scale and moved > 0
    print(f"  peft PeftModel.from_pretrained(embed_tokens + lm_head adapter) vs napkin: max |Δlogit| "
          f"{err:.2e} ({err / scale:.1e} of {scale:.2f}); the adapter moves them by {moved:.2e} "
          f"{'ok' if ok else 'FAIL'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
