"""Measure what PyTorch keeps and allocates for one DPO step of TRL's `DPOTrainer`.

The companion of `measure.py` (whose models, shapes and allocator timeline this reuses) for
preference tuning: a randomly initialised `LlamaForCausalLM`, LoRA or QLoRA made by the trainer
from a `peft_config` (so the reference is the base with the adapter disabled, and a quantized
model's adapters are cast to bf16, as `DPOTrainer` does), the trainer's own fused LM head
(`add_fused_lm_head`: per-token log-probabilities in tiles, no `[N, V]` logits), and one
`DPOTrainer._compute_loss` plus its backward on the CPU. A batch of P pairs is 2P rows of T
tokens (chosen rows, then rejected rows), the first T/4 of each row the prompt
(`completion_mask` 0), as the trainer's collator pads pairs of one length.

- `saved_per_layer` / `saved_outside`: as in `measure.py` (saved-tensor hooks on a first pass;
  the reference forward runs under `no_grad` and saves nothing). Not recorded under
  checkpointing.
- `alive_after_forward`, `peak`: the allocator's running total from the profiler's events of a
  second pass, relative to the moment before `_compute_loss`: what the policy forward, the
  reference forward and the loss leave alive, and the highest point of all of it plus the
  backward.

`bf16=False`: the step in the model's own dtypes, without autocast (`DPOConfig`'s default
`bf16=True` wraps the forward in autocast, which the PyTorch profile does not replay).

Run from the repository root with the reference venv (scripts/reference/requirements.txt plus
`trl==1.16.0 datasets==5.2.0`):
    .venv/bin/python tests/corpus/pytorch_profile/measure_dpo.py > tests/corpus/pytorch_profile/measured-dpo.json
`--only TEXT` runs the cases whose name contains TEXT.
"""

import argparse
import gc
import json
import sys
import tempfile
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import measure  # noqa: E402  (the shapes, the saved model, the CPU allocation timeline)

warnings.filterwarnings("ignore")

import peft  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from peft import LoraConfig, prepare_model_for_kbit_training  # noqa: E402
from transformers import BitsAndBytesConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402
from trl import DPOConfig, DPOTrainer  # noqa: E402

transformers.logging.set_verbosity_error()

TOKENIZER = Path(__file__).parent / "../../../../shared/fixtures/tokenizer/tokenizer.json"

# name, shape, pairs, seq, mode, settings. The fit set: these drove the profile's DPO rules.
FIT = [
    ("dpo-lora-qv", "tiny", 1, 64, "lora", dict(attn="sdpa", r=8)),
    ("dpo-lora-precompute", "tiny", 1, 64, "lora", dict(attn="sdpa", r=8, precompute=True)),
    ("dpo-lora-ckpt", "tiny-tied", 1, 80, "lora", dict(attn="sdpa", r=8, ckpt=True)),
    ("dpo-qlora-nf4", "wide", 1, 96, "qlora", dict(attn="sdpa", r=16, quant="nf4")),
    ("dpo-smollm2-lora", "smollm2-slice", 1, 256, "lora", dict(attn="sdpa", r=16)),
]
# Held out: chosen with the fit set, run once after the rules were written.
HELD_OUT = [
    ("held-dpo-lora-all-eager", "tiny-tied", 2, 48, "lora", dict(attn="eager", r=16, targets="all-linear")),
    ("held-dpo-qlora-ckpt-smollm2", "smollm2-slice", 1, 192, "qlora", dict(attn="sdpa", r=8, quant="nf4", ckpt=True)),
    ("held-dpo-lora-wide-precompute-ckpt", "wide", 2, 64, "lora", dict(attn="sdpa", r=32, precompute=True, ckpt=True)),
]


def base_model(shape, mode, s, directory):
    """The model as a user hands it to `DPOTrainer`: QLoRA through
    `prepare_model_for_kbit_training`; checkpointing enabled as the trainer's `train()` does
    (transformers' default, non-reentrant)."""
    path = measure.saved_model(shape, directory)
    kwargs = dict(attn_implementation=s["attn"])
    if mode == "qlora":
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type=s["quant"], bnb_4bit_compute_dtype=torch.bfloat16)
        kwargs["device_map"] = "cpu"
    model = LlamaForCausalLM.from_pretrained(path, **kwargs)
    ckpt = s.get("ckpt", False)
    if mode == "qlora":
        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=ckpt,
            gradient_checkpointing_kwargs={"use_reentrant": False})
    elif ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def trainer_for(model, s, directory):
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(TOKENIZER), eos_token="<|endoftext|>",
                                        pad_token="<|pad|>")
    data = Dataset.from_list([{"prompt": "a", "chosen": " b", "rejected": " c"}])
    args = DPOConfig(output_dir=f"{directory}/out", beta=0.1, loss_type=["sigmoid"], report_to=[],
                     use_cpu=True, bf16=False, per_device_train_batch_size=1,
                     gradient_checkpointing=s.get("ckpt", False),
                     gradient_checkpointing_kwargs={"use_reentrant": False},
                     precompute_ref_log_probs=False, dataset_num_proc=None)
    lora = LoraConfig(r=s["r"], lora_alpha=2 * s["r"], lora_dropout=0.05, bias="none",
                      task_type="CAUSAL_LM", target_modules=s.get("targets"))
    trainer = DPOTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer,
                         peft_config=lora)
    # The step as with precomputed reference log-probabilities: `_compute_loss` reads them from
    # the batch (set after construction, which would otherwise run the reference over the
    # one-pair text dataset above).
    trainer.precompute_ref_logps = bool(s.get("precompute"))
    return trainer


def batch_of(pairs, seq, vocab, precompute):
    torch.manual_seed(1)
    rows = 2 * pairs
    completion = torch.ones(rows, seq, dtype=torch.long)
    completion[:, : seq // 4] = 0
    batch = dict(input_ids=torch.randint(0, vocab, (rows, seq)),
                 attention_mask=torch.ones(rows, seq, dtype=torch.long),
                 completion_mask=completion)
    if precompute:
        batch["ref_chosen_logps"] = -torch.rand(pairs) * 10
        batch["ref_rejected_logps"] = -torch.rand(pairs) * 10
    return batch


def measure_case(name, shape, pairs, seq, mode, s, directory):
    trainer = trainer_for(base_model(shape, mode, s, directory), s, directory)
    model = trainer.model
    model.train()
    batch = batch_of(pairs, seq, measure.SHAPES[shape]["vocab_size"], s.get("precompute"))
    # A warm-up step first (bitsandbytes' CPU path repacks a 4-bit weight on its first use).
    trainer._compute_loss(model, batch, return_outputs=False).backward()
    model.zero_grad(set_to_none=True)
    gc.collect()

    persistent = {t.untyped_storage().data_ptr()
                  for t in list(model.parameters()) + list(model.buffers())}
    inputs = {v.untyped_storage().data_ptr() for v in batch.values()}
    layers = model.get_base_model().model.layers
    where = ["outside"]
    for i, layer in enumerate(layers):
        layer.register_forward_pre_hook(lambda m, a, i=i: where.__setitem__(0, i))
        layer.register_forward_hook(lambda m, a, o: where.__setitem__(0, "outside"))
    saved, holds = {}, []

    def pack(t):
        holds.append(t)
        ptr = t.untyped_storage().data_ptr()
        if ptr not in persistent and ptr not in inputs and ptr not in saved:
            saved[ptr] = (where[0], t.untyped_storage().nbytes())
        return t.detach()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = trainer._compute_loss(model, batch, return_outputs=False)
    del loss, holds
    model.zero_grad(set_to_none=True)
    where[0] = "outside"
    gc.collect()

    with measure.profile(activities=[measure.ProfilerActivity.CPU], profile_memory=True) as prof:
        start = torch.empty(measure.OPEN_MARK, dtype=torch.uint8)
        loss = trainer._compute_loss(model, batch, return_outputs=False)
        middle = torch.empty(measure.CLOSE_MARK, dtype=torch.uint8)
        loss.backward()
        del start, middle, loss
    after_forward, peak = measure.cpu_timeline(prof)

    per_layer, outside = [0] * len(layers), 0
    for layer, nbytes in saved.values():
        if layer == "outside":
            outside += nbytes
        else:
            per_layer[layer] += nbytes
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    case = dict(name=name, shape=shape, config=measure.SHAPES[shape], pairs=pairs, seq=seq,
                mode=mode, settings=s, trainable_bytes=trainable,
                alive_after_forward=after_forward, peak=peak)
    if not s.get("ckpt"):
        case["saved_per_layer"] = per_layer
        case["saved_outside"] = outside
    del trainer, model
    gc.collect()
    return case


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", help="only the cases whose name contains this text")
    parser.add_argument("--held-out", action="store_true", help="the held-out cases (run once)")
    args = parser.parse_args()
    grid = HELD_OUT if args.held_out else FIT
    grid = [c for c in grid if not args.only or args.only in c[0]]
    if not grid:
        sys.exit("no case matches")
    torch.set_num_threads(2)
    cases = []
    with tempfile.TemporaryDirectory() as directory:
        for case in grid:
            cases.append(measure_case(*case, directory))
            print(case[0], file=sys.stderr)
    versions = dict(torch=torch.__version__.split("+")[0], transformers=transformers.__version__,
                    peft=peft.__version__, trl=trl.__version__)
    json.dump(dict(versions=versions, device="cpu", cases=cases), sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
