"""What each engine's arithmetic costs in accuracy on one GGUF: llama.cpp's logits and napkin's
(float model, quantized weights with 16- and 8-bit activations) for the same token ids, each
compared with the float model of the file (every weight dequantized to f32, f32 activations).

    napkin eval --model M.gguf --text "…" --logits float.npy           # the float model
    napkin eval --model M.gguf --text "…" --logits q16.npy --activation-bits 16
    napkin eval --model M.gguf --text "…" --logits q8.npy --activation-bits 8
    python scripts/reference/accuracy.py M.gguf --float float.npy --napkin 16=q16.npy 8=q8.npy

The token ids are read back from napkin's run (`--ids`, the same list `napkin eval --json`
scores; here given explicitly), so llama.cpp scores exactly the same sequence with no
tokenizer of its own. Per engine: perplexity of the text, mean KL divergence from the float
model's next-token distribution (nats per token), how often its top token is the float model's,
and its largest logit gap relative to the float model's largest logit."""

import argparse

import numpy as np


def log_softmax(logits):
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def compare(name, logits, reference, ids):
    logits, reference = logits.astype(np.float64), reference.astype(np.float64)
    lp, lq = log_softmax(reference), log_softmax(logits)
    nll = -lq[np.arange(len(ids) - 1), ids[1:]].mean()
    kl = (np.exp(lp) * (lp - lq)).sum(axis=-1).mean()
    top = (logits.argmax(axis=-1) == reference.argmax(axis=-1)).mean()
    gap = np.abs(logits - reference).max() / np.abs(reference).max()
    print(f"{name:<34} {np.exp(nll):>11.4f} {kl:>12.2e} {top:>9.4f} {gap:>14.2e}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--ids", required=True, help="comma-separated token ids (napkin's)")
    p.add_argument("--float", required=True, help="napkin eval --logits of the float model")
    p.add_argument("--napkin", nargs="*", default=[], help="LABEL=FILE.npy of napkin engines")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    import llama_cpp

    ids = np.array([int(i) for i in a.ids.split(",")])
    reference = np.load(a.float)
    if reference.shape[0] != len(ids):
        raise SystemExit(f"{a.float}: {reference.shape[0]} rows for {len(ids)} ids")
    llm = llama_cpp.Llama(
        model_path=a.model, n_ctx=len(ids) + 16, n_batch=len(ids), n_ubatch=len(ids),
        logits_all=True, n_threads=a.threads, n_threads_batch=a.threads, verbose=False)
    llm.eval(ids.tolist())
    theirs = np.array(llm.scores[: len(ids)], dtype=np.float32)
    print(f"{len(ids)} tokens ({len(ids) - 1} scored); each engine against the float model "
          f"(f32 weights dequantized from the file, f32 activations)")
    print(f"llama.cpp: llama-cpp-python {llama_cpp.__version__}, its default f16 KV cache, "
          f"{a.threads} threads, one batch")
    print(f"{'engine':<34} {'perplexity':>11} {'KL nats/tok':>12} {'top-1 =':>9} "
          f"{'max |Δ| / max':>14}")
    compare("napkin, float model", reference, reference, ids)
    for spec in a.napkin:
        label, path = spec.split("=", 1)
        compare(f"napkin, blocks, {label}-bit", np.load(path), reference, ids)
    compare("llama.cpp", theirs, reference, ids)


if __name__ == "__main__":
    main()
