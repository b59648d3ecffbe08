#!/usr/bin/env python3
"""Turns `napkin measure --device cuda --json` outputs into measured.json, the device-pool bytes
tests/tests/memory/cuda_pool.rs compares the predictor with.

Usage: record.py DIR FITTED_NAMES > measured.json
DIR holds NAME.json (measure's output) and NAME.args (the flags it ran with); FITTED_NAMES is a
comma-separated list of the cases the row model was worked out on (the rest are held out).
"""
import argparse
import json
import pathlib
import shlex
import sys


def scenario(args: str) -> dict:
    """The scenario flags of `napkin measure`, with its defaults."""
    p = argparse.ArgumentParser()
    p.add_argument("--preset")
    p.add_argument("--lora-r", type=int, default=0)
    p.add_argument("--lora-targets", default="all-linear")
    p.add_argument("--nf4", action="store_true")
    p.add_argument("--double-quant", action="store_true")
    p.add_argument("--checkpointing", action="store_true")
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--dtype", default="f32")
    p.add_argument("--attention", default="eager")
    p.add_argument("--optimizer", default="adamw")
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args(shlex.split(args))
    return {
        "preset": a.preset,
        "lora_r": a.lora_r,
        "lora_targets": a.lora_targets,
        "nf4": a.nf4,
        "double_quant": a.double_quant,
        "checkpointing": a.checkpointing,
        "micro_batch": a.micro_batch,
        "seq_len": a.seq_len,
        "dtype": a.dtype,
        "attention": a.attention,
        "optimizer": a.optimizer,
    }


def measured(report: dict) -> dict:
    kinds = {k["name"].split(" (")[0]: k["measured"] for k in report["kinds"]}
    blocks = [l for l in report["layers"] if l["name"].startswith("layers.")]
    forward = [l for l in report["layers"] if l["name"].startswith("all")][0]
    return {
        "parameters": kinds["parameters"],
        "gradients": kinds["gradients"],
        "optimizer_state": kinds["optimizer state"],
        "layers": [l["measured"] for l in blocks],
        "forward": forward["measured"],
        "step_peak_at_marks": report["step_peak"]["measured"],
    }


def main() -> None:
    folder, fitted = pathlib.Path(sys.argv[1]), set(sys.argv[2].split(","))
    cases = []
    for path in sorted(folder.glob("*.json")):
        args = path.with_suffix(".args").read_text().strip()
        cases.append({
            "name": path.stem,
            "args": args,
            "fitted": path.stem in fitted,
            "scenario": scenario(args),
            "measured": measured(json.loads(path.read_text())),
        })
    json.dump({
        "what": "device-pool bytes (in use after a sync) of `napkin measure --device cuda --json ARGS`",
        "device": sys.argv[3] if len(sys.argv) > 3 else "",
        "cases": cases,
    }, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
