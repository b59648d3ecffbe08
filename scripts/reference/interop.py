"""napkin's outputs in the Python tools people use them with (called by scripts/ci/interop.sh).

Given a napkin training run on a GGUF base (LoRA, merged with `--merge --merge-dtype f32`) and
napkin's GGUF exports of it, checks that
  - peft's `PeftModel.from_pretrained` loads the adapter onto transformers' load of the base,
  - transformers' `AutoModelForCausalLM` loads the merged folder, its tokenizer and template,
  - transformers' GGUF loader loads napkin's F32 GGUF export,
each giving napkin's logits (napkin eval --logits) within 1e-5 of the largest logit (f32
rounding over 30 blocks; two PyTorch paths differ by as much); and, with `--rslora-run`, that
peft loads an rsLoRA adapter napkin trained (`use_rslora`, scale α/√r) to napkin's logits too,
and with `--dora-run` a DoRA adapter (`use_dora`, its magnitude vectors).
llama.cpp's check is scripts/reference/interop_llama_cpp.py.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

RELATIVE_TOLERANCE = 1e-5


def napkin_logits(napkin, model, ids, out, adapter=None):
    cmd = [napkin, "eval", "--model", str(model), "--ids", ",".join(map(str, ids)),
           "--logits", str(out), "--json"]
    if adapter:
        cmd += ["--adapter", str(adapter)]
    subprocess.run(cmd, check=True, capture_output=True)
    return np.load(out)


def torch_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--napkin", required=True)
    p.add_argument("--base", required=True, type=Path, help="the GGUF the run trained on")
    p.add_argument("--run", required=True, type=Path, help="napkin train --out (with merged/)")
    p.add_argument("--gguf-f32", required=True, type=Path)
    p.add_argument("--rslora-run", type=Path, help="napkin train --rslora --out (adapter only)")
    p.add_argument("--dora-run", type=Path, help="napkin train --dora --out (adapter only)")
    a = p.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")

    merged_dir = a.run / "merged"
    tokenizer = AutoTokenizer.from_pretrained(merged_dir)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    print(f"prompt through the merged folder's chat template: {len(ids)} tokens")

    failures = []

    def compare(name, got, want):
        err = float(np.abs(got - want).max())
        scale = float(np.abs(want).max())
        ok = err <= RELATIVE_TOLERANCE * scale
        print(f"  {name:<62} max |Δlogit| {err:.2e} "
              f"({err / scale:.1e} of max |logit| {scale:.1f}) {'ok' if ok else 'FAIL'}")
        if not ok:
            failures.append(name)

    work = a.run / "interop"
    work.mkdir(exist_ok=True)
    with_adapter = napkin_logits(a.napkin, a.base, ids, work / "adapter.npy", adapter=a.run)
    merged = napkin_logits(a.napkin, merged_dir, ids, work / "merged.npy")
    compare("napkin: merged folder vs base + adapter", merged, with_adapter)

    base = AutoModelForCausalLM.from_pretrained(
        a.base.parent, gguf_file=a.base.name, dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, a.run).eval()
    compare("peft PeftModel.from_pretrained(GGUF base, adapter) vs napkin", torch_logits(peft_model, ids), with_adapter)

    hf_merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
    compare("transformers AutoModelForCausalLM(merged/) vs napkin", torch_logits(hf_merged, ids), with_adapter)
    compare("(PyTorch alone: peft vs merged/)", torch_logits(peft_model, ids), torch_logits(hf_merged, ids))

    hf_gguf = AutoModelForCausalLM.from_pretrained(
        a.gguf_f32.parent, gguf_file=a.gguf_f32.name, dtype=torch.float32).eval()
    compare("transformers GGUF loader(napkin export, F32) vs napkin", torch_logits(hf_gguf, ids), with_adapter)

    for run, key, what in [(a.rslora_run, "use_rslora", "rsLoRA"), (a.dora_run, "use_dora", "DoRA")]:
        if not run:
            continue
        config = json.loads((run / "adapter_config.json").read_text())
        if config.get(key) is not True:
            failures.append(f"the {what} run's adapter_config.json says {key} true")
        run_napkin = napkin_logits(a.napkin, a.base, ids, work / f"{key}.npy", adapter=run)
        run_base = AutoModelForCausalLM.from_pretrained(
            a.base.parent, gguf_file=a.base.name, dtype=torch.float32)
        run_peft = PeftModel.from_pretrained(run_base, run).eval()
        compare(f"peft PeftModel.from_pretrained(GGUF base, {what} adapter) vs napkin",
                torch_logits(run_peft, ids), run_napkin)
        if float(np.abs(run_napkin - napkin_logits(a.napkin, a.base, ids, work / "base.npy")).max()) == 0:
            failures.append(f"the {what} adapter leaves the logits unchanged")

    print(json.dumps({"failures": failures}))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
