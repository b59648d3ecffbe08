"""Measure what PyTorch keeps and allocates for one training step of a Hugging Face Llama.

For every case of the grid: a randomly initialised `LlamaForCausalLM` of the given shape,
trained fully, with peft LoRA, or as QLoRA (bitsandbytes `Linear4bit` through
`prepare_model_for_kbit_training`), one forward and one backward on the CPU. Two boundary
counts, never a formula:

- `saved_per_layer`: the bytes of the tensors autograd saves during a first forward
  (`torch.autograd.graph.saved_tensors_hooks`), each storage counted once, parameters and
  buffers excluded, attributed to the decoder layer (or "outside") where it is first saved.
  Not recorded under active checkpointing (the checkpoint's own hooks hide the saved tensors).
- `alive_after_forward` and `peak`: the allocator's running total from the profiler's
  allocation events (`profile_memory=True`) of a second forward and the backward, without
  hooks, relative to the moment before that forward: what
  the forward leaves alive (saved tensors, the logits and the loss), and the highest point of
  forward plus backward (gradients included).

With `--device cuda` the same grid runs on a CUDA GPU (plus TinyLlama-1.1B-shaped cases, held out
at scale): `alive_after_forward` and `peak` are then `torch.cuda.memory_allocated()` after the
forward and `torch.cuda.max_memory_allocated()` over forward and backward, both relative to the
allocation before the forward; `reserved` is the caching allocator's `memory_reserved()` at the end.
A warm-up step runs first: cuBLAS takes a workspace per handle from the caching allocator on
first use (one for the forward's thread, one for autograd's backward thread; 32 MiB each on
Hopper), reported once as `cublas_workspace_bytes` instead of in the first case's peak.

With `--fresh` every case runs in a process of its own (`--case NAME`, several at once with
`--jobs N`), so nothing a case allocates or caches stays for the next: `reserved` and
`max_allocated` are then the case's alone (beside cuBLAS's workspaces). `--traces DIR` also
writes, per case, the caching allocator's own record of the process (`_record_memory_history`,
as `DIR/NAME.txt`):
every allocation, free and segment `cudaMalloc`/`cudaFree` in order, the ground truth for a model
of its rounding and segments.

Run from the repository root with the bench venv:
    .venv/bin/python tests/corpus/pytorch_profile/measure.py > tests/corpus/pytorch_profile/measured.json
and on a GPU machine (torch, transformers, peft and bitsandbytes installed):
    python3 tests/corpus/pytorch_profile/measure.py --device cuda --fresh --jobs 6 \
        --traces /tmp/traces > tests/corpus/pytorch_profile/measured-cuda.json
"""

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import warnings
import weakref

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

warnings.filterwarnings("ignore")

import bitsandbytes  # noqa: E402
import peft  # noqa: E402
import transformers  # noqa: E402
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training  # noqa: E402
from transformers import BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM  # noqa: E402

transformers.logging.set_verbosity_error()

# Allocation sizes no op of the step makes, to find the forward in the allocation timeline.
OPEN_MARK, CLOSE_MARK = 12_345_671, 12_345_673

SHAPES = {
    "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False),
    "tiny-tied": dict(vocab_size=320, hidden_size=96, intermediate_size=256, num_hidden_layers=3,
                      num_attention_heads=6, num_key_value_heads=3, tie_word_embeddings=True),
    "wide": dict(vocab_size=1000, hidden_size=256, intermediate_size=704, num_hidden_layers=2,
                 num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=False),
    # SmolLM2-135M's shape with 4 of its 30 layers.
    "smollm2-slice": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                          num_hidden_layers=4, num_attention_heads=9, num_key_value_heads=3,
                          tie_word_embeddings=True),
    # TinyLlama-1.1B's shape, all 22 layers (CUDA only: held out at scale).
    "tinyllama": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                      num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
                      tie_word_embeddings=False),
}

# name, shape, batch, seq, mode, settings
CASES = [
    ("full-eager", "tiny", 1, 32, "full", dict(attn="eager")),
    ("full-sdpa", "tiny", 2, 48, "full", dict(attn="sdpa")),
    ("lora-qv-sdpa", "tiny", 1, 64, "lora", dict(attn="sdpa", r=8, dropout=0.0)),
    ("lora-qv-dropout", "tiny", 1, 64, "lora", dict(attn="sdpa", r=8, dropout=0.05)),
    ("lora-all-eager", "tiny-tied", 2, 40, "lora", dict(attn="eager", r=16, dropout=0.1, targets="all-linear")),
    ("lora-qv-eval", "wide", 1, 96, "lora", dict(attn="sdpa", r=32, dropout=0.05, mode="eval")),
    ("lora-ckpt", "tiny", 2, 64, "lora", dict(attn="sdpa", r=8, dropout=0.05, ckpt="non-reentrant")),
    ("lora-ckpt-reentrant", "tiny-tied", 1, 80, "lora", dict(attn="sdpa", r=8, dropout=0.0, ckpt="reentrant")),
    ("qlora-nf4-eval", "wide", 1, 128, "qlora", dict(attn="sdpa", r=16, dropout=0.05, quant="nf4", mode="eval")),
    ("qlora-fp4-eval", "wide", 2, 64, "qlora", dict(attn="sdpa", r=16, dropout=0.05, quant="fp4", mode="eval")),
    ("qlora-nf4-dq-train", "wide", 1, 96, "qlora", dict(attn="eager", r=8, dropout=0.05, quant="nf4", double_quant=True)),
    ("qlora-nf4-ckpt", "wide", 1, 128, "qlora", dict(attn="sdpa", r=16, dropout=0.05, quant="nf4", ckpt="reentrant")),
    # As the seed leaves it: from_pretrained's eval mode, get_peft_model's new adapters in train mode.
    ("qlora-fp4-as-loaded", "wide", 1, 128, "qlora", dict(attn="sdpa", r=16, dropout=0.05, quant="fp4", ckpt="reentrant", mode="as-loaded")),
    ("lora-as-loaded", "tiny-tied", 2, 48, "lora", dict(attn="eager", r=8, dropout=0.1, mode="as-loaded")),
    # 16-bit models (no kbit preparation): bf16 hidden states, peft's adapters in f32.
    ("full-bf16-eager", "tiny", 1, 48, "full", dict(attn="eager", dtype="bf16")),
    ("lora-bf16-dropout", "tiny-tied", 2, 64, "lora", dict(attn="sdpa", r=8, dropout=0.05, dtype="bf16")),
    ("smollm2-lora", "smollm2-slice", 1, 256, "lora", dict(attn="sdpa", r=16, dropout=0.05)),
    ("smollm2-qlora-eval", "smollm2-slice", 1, 256, "qlora", dict(attn="sdpa", r=16, dropout=0.05, quant="nf4", mode="eval")),
]

# Held out at scale, on CUDA only: a QLoRA run as the seeds make it and a 16-bit LoRA run.
CUDA_CASES = [
    ("tinyllama-qlora-dq-ckpt", "tinyllama", 1, 512, "qlora", dict(attn="sdpa", r=16, dropout=0.05, quant="nf4", double_quant=True, ckpt="reentrant", targets="all-linear")),
    ("tinyllama-lora-bf16", "tinyllama", 2, 256, "lora", dict(attn="sdpa", r=16, dropout=0.05, dtype="bf16")),
]

DEVICE = "cpu"
# With --traces: the allocator's history is recorded and each case's trace kept here.
TRACING = False
TRACES = {}


def allocation_events(prof):
    """(time, signed bytes) of every CPU allocation and free the profiler saw, in time order."""
    out = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.tag == _EventType.Allocation:
            out.append((event.start_time_ns, event.extra_fields.alloc_size))
    out.sort()
    return out


def saved_model(shape, directory, made={}):
    """A random model of `shape` saved once per run (seed 0), its folder."""
    if shape not in made:
        config = LlamaConfig(max_position_embeddings=4096, use_cache=False, **SHAPES[shape])
        torch.manual_seed(0)
        path = f"{directory}/{shape}"
        LlamaForCausalLM(config).save_pretrained(path)
        made[shape] = path
    return made[shape]


def build(shape, mode, s, directory):
    directory = saved_model(shape, directory)
    kwargs = dict(attn_implementation=s["attn"])
    if s.get("dtype") == "bf16":
        kwargs["dtype"] = torch.bfloat16
    if mode == "qlora":
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type=s["quant"],
            bnb_4bit_use_double_quant=s.get("double_quant", False),
            bnb_4bit_compute_dtype=torch.bfloat16)
        kwargs["device_map"] = DEVICE
    model = LlamaForCausalLM.from_pretrained(directory, **kwargs)
    if mode != "qlora":
        model = model.to(DEVICE)
    ckpt = s.get("ckpt")
    if mode == "qlora":
        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=ckpt is not None,
            gradient_checkpointing_kwargs={"use_reentrant": ckpt == "reentrant"})
    elif ckpt is not None:
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": ckpt == "reentrant"})
        model.enable_input_require_grads()
    if mode in ("lora", "qlora"):
        lora = LoraConfig(r=s["r"], lora_alpha=2 * s["r"], lora_dropout=s["dropout"], bias="none",
                          task_type="CAUSAL_LM", target_modules=s.get("targets"))
        model = get_peft_model(model, lora)
    # from_pretrained leaves the model in eval mode (HF skips checkpointing) while the adapters
    # get_peft_model adds are new modules in train mode (their dropout runs): "as-loaded", as
    # the seed ran. "train" and "eval" set every module.
    mode = s.get("mode", "train")
    if mode == "train":
        model.train()
    elif mode == "eval":
        model.eval()
    return model


def measure(name, shape, batch, seq, mode, s, directory):
    model = build(shape, mode, s, directory)
    vocab = SHAPES[shape]["vocab_size"]
    torch.manual_seed(1)
    data = torch.randint(0, vocab, (batch, seq)).to(DEVICE)
    # A warm-up forward first: bitsandbytes' CPU path repacks a 4-bit weight on its first use.
    with torch.no_grad():
        model(data)
    persistent = set()
    for t in list(model.parameters()) + list(model.buffers()):
        persistent.add(t.untyped_storage().data_ptr())
    layers = model.get_decoder().layers if hasattr(model, "get_decoder") else model.model.layers
    where = ["outside"]
    for i, layer in enumerate(layers):
        layer.register_forward_pre_hook(lambda m, a, i=i: where.__setitem__(0, i))
        layer.register_forward_hook(lambda m, a, o: where.__setitem__(0, "outside"))
    saved = {}
    holds = []
    packed = []

    def pack(t):
        # Holding every packed tensor keeps a freed storage's address from being reused by a
        # later one within this forward (which would hide the later one).
        holds.append(t)
        ptr = t.untyped_storage().data_ptr()
        if ptr not in persistent and ptr not in saved:
            saved[ptr] = (where[0], t.untyped_storage().nbytes())
            packed.append(weakref.ref(t))
        # A detached alias, not `t`: when an op saves its own output, `t.grad_fn` is that op's
        # node, and a node holding a tensor that holds the node is a cycle no collector sees —
        # the whole graph of this pass would stay allocated through the measured step.
        return t.detach()

    # First pass: what autograd saves (the hooks hold references, so this pass is not timed
    # for memory).
    before = torch.cuda.memory_allocated() if DEVICE == "cuda" else None
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        output = model(data, labels=data)
    del output, holds
    model.zero_grad(set_to_none=True)
    where[0] = "outside"
    gc.collect()
    # The token ids stay alive (the caller holds them); nothing else may.
    ids = data.untyped_storage().data_ptr()
    left = [t for t in (r() for r in packed)
            if t is not None and t.untyped_storage().data_ptr() != ids]
    if left:
        sys.exit(f"{name}: the first pass left {len(left)} saved tensors alive "
                 f"({sum(t.untyped_storage().nbytes() for t in left)} bytes)")
    if DEVICE == "cuda" and torch.cuda.memory_allocated() != before:
        sys.exit(f"{name}: the first pass left {torch.cuda.memory_allocated() - before} bytes "
                 "allocated")
    del left

    # Second pass: the allocator's view of forward and backward, without hooks.
    gc.collect()
    if DEVICE == "cuda":
        after_forward, peak = cuda_step(model, data)
    else:
        after_forward, peak = cpu_step(model, data)
    case = step_figures(model, layers, saved, name, shape, batch, seq, mode, s, after_forward, peak)
    if DEVICE == "cuda":
        case["reserved"] = torch.cuda.memory_reserved()
        case["max_allocated"] = torch.cuda.max_memory_allocated()
        if TRACING:
            # The allocator's record up to the moment `reserved` was read.
            TRACES[name] = allocator_trace()
    del model
    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return case


def cpu_step(model, data):
    """(alive after the forward, peak of forward and backward) from the CPU profiler."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        start = torch.empty(OPEN_MARK, dtype=torch.uint8)
        output = model(data, labels=data)
        middle = torch.empty(CLOSE_MARK, dtype=torch.uint8)
        output.loss.backward()
        del start, middle
    return cpu_timeline(prof)


def cuda_warm_up(directory):
    """One forward and backward before any case: cuBLAS gets a workspace from the caching
    allocator per handle on first use (the forward's thread and autograd's backward thread
    each have one), which would otherwise land in the first case's peak. Returns the bytes
    they hold once everything else is freed."""
    model = build("tiny", "full", dict(attn="eager"), directory)
    data = torch.randint(0, SHAPES["tiny"]["vocab_size"], (1, 32)).to(DEVICE)
    model(data, labels=data).loss.backward()
    del model, data
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.memory_allocated()


def cuda_step(model, data):
    """(alive after the forward, peak of forward and backward) from the CUDA allocator's counters."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    output = model(data, labels=data)
    torch.cuda.synchronize()
    after_forward = torch.cuda.memory_allocated() - base
    output.loss.backward()
    torch.cuda.synchronize()
    return after_forward, torch.cuda.max_memory_allocated() - base


def cpu_timeline(prof):
    """(alive after the forward, peak) from the profiler's allocation events between the marks."""
    events = allocation_events(prof)
    # The two markers split the timeline: one opens the forward, the other closes it.
    opened = next(i for i, (_, b) in enumerate(events) if b == OPEN_MARK)
    closed = next(i for i, (_, b) in enumerate(events) if b == CLOSE_MARK and i > opened)
    total, peak, after_forward = 0, 0, None
    for i, (_, b) in enumerate(events[opened + 1:], start=opened + 1):
        if i == closed:
            after_forward = total
            continue
        if b in (-OPEN_MARK, -CLOSE_MARK) and i > closed:
            continue
        total += b
        peak = max(peak, total)
    return after_forward, peak


def step_figures(model, layers, saved, name, shape, batch, seq, mode, s, after_forward, peak):
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    weights += sum(b.numel() * b.element_size() for b in model.buffers())
    # bitsandbytes keeps each 4-bit weight's absmax (and, with double quantization, the
    # second-level scales and code book) on its quant_state, which is neither parameter nor buffer.
    for module in model.modules():
        state = getattr(getattr(module, "weight", None), "quant_state", None)
        if state is not None:
            weights += state.absmax.numel() * state.absmax.element_size()
            if state.nested:
                weights += sum(t.numel() * t.element_size()
                               for t in (state.state2.absmax, state.state2.code))
    per_layer = [0] * len(layers)
    outside = 0
    for layer, nbytes in saved.values():
        if layer == "outside":
            outside += nbytes
        else:
            per_layer[layer] += nbytes
    case = dict(name=name, shape=shape, config=SHAPES[shape], batch=batch, seq=seq, mode=mode,
                settings=s, trainable_bytes=trainable, weight_bytes=weights,
                alive_after_forward=after_forward, peak=peak)
    if s.get("ckpt") is None or s.get("mode", "train") != "train":
        case["saved_per_layer"] = per_layer
        case["saved_outside"] = outside
    return case


def allocator_trace():
    """The caching allocator's record of this process, one line per event in order:
    `a ID BYTES` an allocation (ID counts from 0), `f ID` its free (returned to the pool),
    `s BYTES` a segment's `cudaMalloc`, `e` a run of segment `cudaFree`s (an `empty_cache()`)."""
    snapshot = torch.cuda.memory._snapshot()
    lines, ids, count, previous = [], {}, 0, None
    for event in snapshot["device_traces"][torch.cuda.current_device()]:
        action = event["action"]
        if action == "alloc":
            ids[event["addr"]] = count
            lines.append(f"a {count} {event['size']}")
            count += 1
        elif action == "free_completed":
            # An address may be handed out again: the next allocation there is a new ID.
            freed = ids.pop(event["addr"], None)
            if freed is not None:
                lines.append(f"f {freed}")
        elif action == "segment_alloc":
            lines.append(f"s {event['size']}")
        elif action == "segment_free" and previous != "segment_free":
            lines.append("e")
        if action in ("alloc", "free_completed", "segment_alloc", "segment_free"):
            previous = action
    return lines


def run_fresh(grid, args):
    """Each case in a process of its own, `args.jobs` at a time; their cases in grid order."""
    def command(name):
        cmd = [sys.executable, os.path.abspath(__file__), "--device", args.device, "--case", name]
        if args.traces:
            cmd += ["--traces", args.traces]
        return cmd
    names = [case[0] for case in grid]
    results, running = {}, []
    pending = list(names)
    while pending or running:
        while pending and len(running) < args.jobs:
            name = pending.pop(0)
            running.append((name, subprocess.Popen(command(name), stdout=subprocess.PIPE)))
        name, process = running.pop(0)
        out, _ = process.communicate()
        if process.returncode != 0:
            sys.exit(f"case {name} failed (exit {process.returncode})")
        measured = json.loads(out)
        results[name] = measured
        print(name, file=sys.stderr)
    first = results[names[0]]
    out = {key: value for key, value in first.items() if key != "cases"}
    out["cases"] = [results[name]["cases"][0] for name in names]
    out["fresh"] = True
    return out


def main():
    global DEVICE, TRACING
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--only", help="only the cases whose name contains this text")
    parser.add_argument("--case", help="only the case of this exact name")
    parser.add_argument("--fresh", action="store_true",
                        help="each case in a process of its own (clean allocator figures)")
    parser.add_argument("--jobs", type=int, default=1, help="with --fresh: processes at once")
    parser.add_argument("--traces", help="with --device cuda: write each case's allocator "
                        "trace to DIR/NAME.json")
    args = parser.parse_args()
    DEVICE, only = args.device, args.only
    grid = CASES + (CUDA_CASES if DEVICE == "cuda" else [])
    grid = [case for case in grid if (not only or only in case[0])
            and (not args.case or args.case == case[0])]
    if not grid:
        sys.exit("no case matches")
    if args.fresh:
        json.dump(run_fresh(grid, args), sys.stdout, indent=1)
        print()
        return
    torch.set_num_threads(2)
    if DEVICE == "cuda" and args.traces:
        TRACING = True
        torch.cuda.memory._record_memory_history(max_entries=2_000_000, context=None,
                                                 stacks="python")
    cases = []
    with tempfile.TemporaryDirectory() as directory:
        if DEVICE == "cuda":
            workspaces = cuda_warm_up(directory)
        for case in grid:
            cases.append(measure(*case, directory))
            print(case[0], file=sys.stderr)
    versions = dict(torch=torch.__version__.split("+")[0], transformers=transformers.__version__,
                    peft=peft.__version__, bitsandbytes=bitsandbytes.__version__)
    out = dict(versions=versions, device=DEVICE, cases=cases)
    if DEVICE == "cuda":
        out["gpu"] = torch.cuda.get_device_name()
        out["cublas_workspace_bytes"] = workspaces
        if args.traces:
            os.makedirs(args.traces, exist_ok=True)
            for name, lines in TRACES.items():
                case = next(c for c in cases if c["name"] == name)
                with open(os.path.join(args.traces, f"{name}.txt"), "w") as f:
                    f.write(f"# {name}: reserved {case['reserved']}, max_allocated "
                            f"{case['max_allocated']} (torch {torch.__version__})\n")
                    f.write("\n".join(lines) + "\n")
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
