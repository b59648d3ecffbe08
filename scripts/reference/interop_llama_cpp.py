"""llama.cpp (llama-cpp-python) loads a GGUF napkin exported and answers a chat prompt
greedily as `napkin generate` does on the same file (called by scripts/ci/interop.sh)."""

import subprocess
import sys

try:
    from llama_cpp import Llama
except ImportError:
    print("  llama-cpp-python is not installed here: the llama.cpp check is skipped")
    sys.exit(0)

napkin, gguf = sys.argv[1], sys.argv[2]
prompt = "What is the capital of France?"
llm = Llama(model_path=gguf, n_ctx=256, n_threads=2, verbose=False)
out = llm.create_chat_completion(
    messages=[{"role": "user", "content": prompt}], max_tokens=16, temperature=0.0)
theirs = out["choices"][0]["message"]["content"].strip()
ours = subprocess.run(
    [napkin, "generate", "--model", gguf, "--chat", "--prompt", prompt, "--max-new-tokens", "16"],
    check=True, capture_output=True, text=True).stdout.strip()
print(f"  llama.cpp on napkin's export: {theirs!r}")
print(f"  napkin    on napkin's export:  {ours!r}")
print(f"  {'the same' if theirs == ours else 'DIFFERENT'}")
sys.exit(0 if theirs == ours else 1)
