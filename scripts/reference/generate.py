"""llama.cpp's generation speed on a GGUF, for `napkin bench generate --reference PYTHON`:
the same prompt token ids (no tokenizing here), threads and token counts as napkin's run.

It loads the model, prints one JSON line (its resident growth, VmRSS, through the load and one
run, as napkin measures its engines; and its settings), then answers each `run` line on stdin
with one timed run as a JSON line (prompt and decode tokens/s), so that napkin can alternate its
runs with these; `quit` ends it."""

import argparse
import json
import sys
import time


def resident_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--tokens", type=int, required=True)
    p.add_argument("--prompt-ids", required=True)
    a = p.parse_args()
    import llama_cpp
    import numpy as np

    ids = json.loads(a.prompt_ids)
    before = resident_bytes()
    llm = llama_cpp.Llama(model_path=a.model, n_ctx=512, n_batch=512, n_threads=a.threads,
                          n_threads_batch=a.threads, verbose=False)

    def once():
        llm.reset()
        start = time.perf_counter()
        llm.eval(ids)
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(a.tokens):
            # Greedy, as napkin's run: the argmax of the last logits.
            llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])
        decode = time.perf_counter() - start
        return {"prefill": len(ids) / prefill, "decode": a.tokens / decode}

    once()
    grown = resident_bytes() - before if before is not None else None
    print(json.dumps({
        "resident_bytes": grown,
        "settings": {
            "llama_cpp_python": llama_cpp.__version__,
            "n_threads": a.threads, "n_threads_batch": a.threads, "n_ctx": 512, "n_batch": 512,
            "kv_cache": "f16 (llama.cpp's default)", "sampling": "argmax of the logits",
            "system_info": llama_cpp.llama_print_system_info().decode().strip(),
        },
    }), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        print(json.dumps(once()), flush=True)


if __name__ == "__main__":
    main()
