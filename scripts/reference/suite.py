"""The PyTorch side of `napkin bench suite`: the same cases on torch + transformers + peft +
bitsandbytes (CPU, eager mode, f32), driven one run at a time so the two stacks interleave.

Protocol (one JSON object per line on stdin, one answer per line on stdout):
  {"op": "setup", "case": {...}}  builds the case and runs one warm-up   -> {"ok": true, ...}
  {"op": "run", "peak": p}        one run of the current case            -> {"seconds": s, "peak_rss_bytes": b}
                                  (p: trim the heap and restart the peak first; else steady state)
  {"op": "quit"}
A failure answers {"error": "..."}; the driver prints it and goes on with the next case.

Cases ("kind"): train, forward, generate, nf4_quantize, nf4_dequantize, nf4_matmul, matmul. Each names its
HF Llama config, shapes and method exactly as napkin builds them (see native/src/commands/bench/cases.rs);
the NF4 ones say how many times one run repeats the operation ("repeats").
Set up by scripts/bench/suite.sh (a virtual environment with pinned versions); not used by the tests.
"""

import ctypes
import gc
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

torch.set_num_threads(int(os.environ.get("NAPKIN_BENCH_THREADS", "2")))
torch.manual_seed(0)

LIBC = ctypes.CDLL("libc.so.6")


def rss_bytes(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def rss_split():
    """Resident bytes now by kind: anonymous (heap, tensors), file-backed (mapped files such as
    a loaded safetensors checkpoint), shared memory."""
    return {k: rss_bytes(k) for k in ("RssAnon", "RssFile", "RssShmem")}


def reset_peak_rss():
    """Returns freed heap to the OS and restarts the kernel's peak-RSS counter (VmHWM)."""
    gc.collect()
    LIBC.malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def tokens(batch, seq, vocab):
    """The same synthetic rows napkin uses: ((i*31 + r*101 + 1) mod V)."""
    rows = [[(i * 31 + r * 101 + 1) % vocab for i in range(seq)] for r in range(batch)]
    return torch.tensor(rows, dtype=torch.long)


def llama_config(config_json):
    from transformers import LlamaConfig

    # SDPA: transformers' default attention, fused and memory-efficient on the CPU (napkin's
    # side runs its efficient attention); said explicitly so a changed default cannot slip in.
    return LlamaConfig(**config_json, attn_implementation="sdpa")


def save_random_checkpoint(config_json):
    """A random f32 model saved to a temporary folder (returned; deleted when it is dropped).
    The QLoRA case loads it quantized, as users load a checkpoint; the driver calls this before
    the case's idle size is read, so the f32 model built here is not in the step's peak."""
    from transformers import LlamaForCausalLM

    folder = tempfile.TemporaryDirectory()
    model = LlamaForCausalLM(llama_config(config_json))
    model.save_pretrained(folder.name)
    del model
    return folder


def llama(config_json, quantized, checkpoint=None):
    from transformers import LlamaForCausalLM

    if not quantized:
        model = LlamaForCausalLM(llama_config(config_json))
        assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
        return model.float()
    # QLoRA as users write it: a checkpoint loaded with a BitsAndBytesConfig (NF4, double
    # quant), from the folder the driver saved before reading the idle size.
    from transformers import BitsAndBytesConfig

    q = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.float32,
        bnb_4bit_quant_storage=torch.uint8,
    )
    return LlamaForCausalLM.from_pretrained(
        checkpoint.name,
        quantization_config=q,
        device_map="cpu",
        torch_dtype=torch.float32,
        attn_implementation="sdpa",
    )


def compiled(model, case):
    """`torch.compile(model)` when the case asks for it (the driver's --reference-compile),
    else the model itself."""
    if not case.get("compile"):
        return model
    return torch.compile(model)


class Train:
    def __init__(self, case):
        method = case["method"]
        wanted = case["settings"]
        model = llama(case["config"], quantized=method == "qlora",
                      checkpoint=case.get("checkpoint"))
        if method in ("lora", "qlora"):
            from peft import LoraConfig, get_peft_model

            if method == "qlora":
                from peft import prepare_model_for_kbit_training

                model = prepare_model_for_kbit_training(
                    model, use_gradient_checkpointing=False
                )
            lora = LoraConfig(
                r=wanted["lora"]["r"],
                lora_alpha=wanted["lora"]["alpha"],
                lora_dropout=wanted["lora"]["dropout"],
                target_modules=wanted["lora"]["targets"],
                task_type="CAUSAL_LM",
            )
            model = get_peft_model(model, lora)
        if case["checkpointing"]:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        model.config.use_cache = False
        model.train()
        self.model = model
        # torch.compile (inductor, C++ on the CPU): the step's forward and backward as compiled
        # graphs; the settings are read from the module it wraps.
        self.step_model = compiled(model, case)
        self.compiles = self.step_model is not model
        self.ids = tokens(case["batch"], case["seq"], case["config"]["vocab_size"])
        params = [p for p in model.parameters() if p.requires_grad]
        o = wanted["optimizer"]
        fused = bool(case.get("fused_adamw", False))
        self.optimizer = torch.optim.AdamW(
            params, lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"],
            weight_decay=o["weight_decay"], fused=fused or None,
        )
        notes = []
        if fused:
            notes.append("AdamW(fused=True): PyTorch's one-kernel update")
        if self.compiles:
            notes.append("torch.compile (inductor)")
        self.notes = "; ".join(notes) or None
        self.settings = self.read_settings(case["checkpointing"])

    def read_settings(self, checkpointing):
        """The hyper-parameters as the built objects hold them (not as they were asked for)."""
        group = self.optimizer.param_groups[0]
        settings = {
            "threads": torch.get_num_threads(),
            "optimizer": {
                "name": type(self.optimizer).__name__,
                "lr": group["lr"],
                "betas": list(group["betas"]),
                "eps": group["eps"],
                "weight_decay": group["weight_decay"],
            },
            "checkpointing": bool(getattr(self.model, "is_gradient_checkpointing", False)),
        }
        peft_config = getattr(self.model, "peft_config", None)
        if peft_config:
            lora = peft_config["default"]
            settings["lora"] = {
                "r": lora.r,
                "alpha": float(lora.lora_alpha),
                "dropout": float(lora.lora_dropout),
                "targets": sorted(lora.target_modules),
            }
        for module in self.model.modules():
            state = getattr(getattr(module, "weight", None), "quant_state", None)
            if state is not None:
                settings["nf4"] = {
                    "block_size": state.blocksize,
                    "double_quant": bool(state.nested),
                }
                break
        return settings

    def run(self):
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.step_model(input_ids=self.ids, labels=self.ids).loss
        loss.backward()
        self.optimizer.step()


class Forward:
    def __init__(self, case):
        self.model = compiled(llama(case["config"], quantized=False).eval(), case)
        self.ids = tokens(case["batch"], case["seq"], case["config"]["vocab_size"])
        self.compiles = bool(case.get("compile"))
        if self.compiles:
            self.notes = "torch.compile (inductor)"

    def run(self):
        with torch.no_grad():
            self.model(input_ids=self.ids, use_cache=False)


class Generate:
    def __init__(self, case):
        self.model = llama(case["config"], quantized=False).eval()
        self.ids = tokens(1, case["prompt"], case["config"]["vocab_size"])
        self.new = case["new_tokens"]

    def run(self):
        with torch.no_grad():
            self.model.generate(
                self.ids,
                max_new_tokens=self.new,
                min_new_tokens=self.new,
                do_sample=False,
                pad_token_id=0,
            )


def weight(case):
    g = torch.Generator().manual_seed(0)
    return torch.randn(case["rows"], case["cols"], generator=g) * 0.02


class Nf4Quantize:
    def __init__(self, case):
        import bitsandbytes.functional as F

        self.F = F
        self.w = weight(case)
        self.block = case["block_size"]
        self.double = case["double_quant"]
        self.repeats = case.get("repeats", 1)

    def run(self):
        for _ in range(self.repeats):
            self.F.quantize_4bit(
                self.w, blocksize=self.block, quant_type="nf4", compress_statistics=self.double
            )


class Nf4Dequantize(Nf4Quantize):
    def __init__(self, case):
        super().__init__(case)
        self.q, self.state = self.F.quantize_4bit(
            self.w, blocksize=self.block, quant_type="nf4", compress_statistics=self.double
        )
        # Written into one preallocated output, as napkin's dequantize reuses its buffer — where
        # bitsandbytes offers it: its `dequantize_4bit.out` has no CPU kernel in 0.50.2.
        self.out = torch.empty_like(self.w)
        try:
            self.F.dequantize_4bit(self.q, self.state, out=self.out)
            self.notes = "dequantize_4bit writes into a preallocated out="
        except NotImplementedError:
            self.out = None
            self.notes = ("dequantize_4bit allocates its output each call: bitsandbytes "
                          "has no CPU kernel for out= (dequantize_4bit.out)")

    def run(self):
        for _ in range(self.repeats):
            if self.out is None:
                self.F.dequantize_4bit(self.q, self.state)
            else:
                self.F.dequantize_4bit(self.q, self.state, out=self.out)


class Nf4Matmul(Nf4Dequantize):
    def __init__(self, case):
        super().__init__(case)
        import bitsandbytes as bnb

        self.bnb = bnb
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(case["tokens"], case["cols"], generator=g)

    def run(self):
        with torch.no_grad():
            for _ in range(self.repeats):
                self.bnb.matmul_4bit(self.x, self.q.t(), quant_state=self.state)


class Matmul:
    def __init__(self, case):
        g = torch.Generator().manual_seed(0)
        n = case["n"]
        self.a = torch.randn(n, n, generator=g)
        self.b = torch.randn(n, n, generator=g)

    def run(self):
        self.a @ self.b


KINDS = {
    "matmul": Matmul,
    "train": Train,
    "forward": Forward,
    "generate": Generate,
    "nf4_quantize": Nf4Quantize,
    "nf4_dequantize": Nf4Dequantize,
    "nf4_matmul": Nf4Matmul,
}


def answer(value):
    sys.stdout.write(json.dumps(value) + "\n")
    sys.stdout.flush()


def preload():
    """Imports the libraries every case uses and runs one small product, before any case's idle
    memory is read: the driver starts a fresh process per case, and a case's peak should count
    what its step allocates, not the first import of transformers or the BLAS threads' start."""
    import transformers.models.llama.modeling_llama  # noqa: F401
    import peft  # noqa: F401

    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        pass  # the NF4 cases report the error themselves
    a = torch.ones(256, 256)
    (a @ a).sum().item()


def main():
    import warnings

    warnings.filterwarnings("ignore")
    preload()
    current = None
    for line in sys.stdin:
        request = json.loads(line)
        op = request.get("op")
        try:
            if op == "setup":
                current = None
                case = request["case"]
                if case.get("method") == "qlora":
                    case["checkpoint"] = save_random_checkpoint(case["config"])
                reset_peak_rss()
                idle = rss_bytes("VmRSS")
                idle_split = rss_split()
                current = KINDS[case["kind"]](case)
                start = time.perf_counter()
                current.run()  # warm-up (with torch.compile: the compilation)
                first_seconds = time.perf_counter() - start
                notes = getattr(current, "notes", None)
                if getattr(current, "compiles", False):
                    current.run()  # a second warm-up: any recompilation the first one causes
                    notes += f"; the first run, compiling, took {first_seconds:.1f} s"
                settings = getattr(current, "settings", {"threads": torch.get_num_threads()})
                answer({"ok": True, "idle_rss_bytes": idle, "idle_split": idle_split,
                        "torch": torch.__version__, "settings": settings,
                        "notes": notes, "first_run_seconds": first_seconds})
            elif op == "run":
                # A peak run starts from a trimmed heap; a timed one runs in the steady state.
                peak = request.get("peak", True)
                if peak:
                    reset_peak_rss()
                start = time.perf_counter()
                current.run()
                seconds = time.perf_counter() - start
                answer({"seconds": seconds, "peak_rss_bytes": rss_bytes("VmHWM") if peak else 0,
                        "split": rss_split()})
            elif op == "quit":
                return
            else:
                answer({"error": f"unknown op {op!r}"})
        except Exception as error:  # reported to the driver, which goes on
            answer({"error": f"{type(error).__name__}: {error}"})


if __name__ == "__main__":
    main()
