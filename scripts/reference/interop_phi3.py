"""napkin's merged Phi-3 folder in transformers: `napkin export --format hf` of the Phi-3 corpus
model with peft's adapter on its fused `qkv_proj` and `gate_up_proj` (tests/corpus/phi3), read
back by transformers' Phi3ForCausalLM, against peft's own logits with that adapter (the
corpus's `fused_lora.logits`). The model has no tokenizer of its own; the export borrows the
shared fixtures' one, which the logits never use.

    .venv/bin/python scripts/reference/interop_phi3.py path/to/napkin
"""

import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests/corpus/phi3"
TOLERANCE = 1e-5


def main():
    napkin = sys.argv[1]
    tokenizer = ROOT.parent / "shared/fixtures/tokenizer/tokenizer.json"
    reference = load_file(str(CORPUS / "reference.safetensors"))
    with tempfile.TemporaryDirectory() as work:
        out = Path(work) / "merged"
        subprocess.run([napkin, "export", "--model", str(CORPUS / "hf"), "--adapter",
                        str(CORPUS / "fused_lora"), "--tokenizer", str(tokenizer),
                        "--format", "hf", "--out", str(out)], check=True, capture_output=True)
        stored = sorted(load_file(str(out / "model.safetensors")))
        assert any(n.endswith("self_attn.qkv_proj.weight") for n in stored), stored[:8]
        model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32,
                                                     attn_implementation="eager").eval()
        with torch.no_grad():
            got = model(input_ids=reference["input_ids"]).logits
    want = reference["fused_lora.logits"]
    gap = ((got - want).abs().max() / want.abs().max()).item()
    print(f"Phi-3: napkin's merged folder ({type(model).__name__}) in transformers, logits off "
          f"peft's with the fused adapter: {gap:.1e} of the largest (tolerance {TOLERANCE:.0e})")
    if gap > TOLERANCE:
        sys.exit(1)


if __name__ == "__main__":
    main()
