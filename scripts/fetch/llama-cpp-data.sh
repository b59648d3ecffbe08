#!/usr/bin/env bash
# Fetches llama.cpp's test data into models/llama.cpp/ (git-ignored):
# - vocab/: vocabulary-only GGUFs of Llama 2 (SentencePiece), Llama 3, Qwen2, Phi-3, GPT-2,
#   DeepSeek, …, each with llama.cpp's test texts (`.inp`) and the ids Hugging Face's tokenizer
#   gives them (`.out`) — read by tests/integration/gguf_tokenizers.rs;
# - templates/: real chat templates (Llama 3.x, Qwen2.5, Phi-3.5, Gemma 2, Mistral NeMo,
#   SmolLM3, DeepSeek-R1-Distill) — rendered by tests/integration/chat_templates.rs against
#   transformers' renderings in tests/corpus/chat_templates/.
# They come from the source distribution of `llama-cpp-python` on PyPI (MIT; llama.cpp is
# vendored in it), checked against the index's sha256, so no model hub is needed.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
dest="$root/models/llama.cpp"
version="0.3.36"
names="llama-spm phi-3 llama-bpe qwen2 gpt-2 mpt deepseek-llm deepseek-coder falcon starcoder refact command-r"
templates="meta-llama-Llama-3.1-8B-Instruct meta-llama-Llama-3.2-3B-Instruct Qwen-Qwen2.5-7B-Instruct microsoft-Phi-3.5-mini-instruct google-gemma-2-2b-it mistralai-Mistral-Nemo-Instruct-2407 HuggingFaceTB-SmolLM3-3B deepseek-ai-DeepSeek-R1-Distill-Llama-8B"
if [ -f "$dest/.complete-$version-2" ]; then
    echo "$dest"
    exit 0
fi
mkdir -p "$dest/vocab" "$dest/templates"
python3 - "$dest" "$version" "$names" "$templates" <<'PY'
import hashlib, io, os, re, sys, tarfile, urllib.request

dest, version = sys.argv[1], sys.argv[2]
names, templates = sys.argv[3].split(), sys.argv[4].split()
index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
page = urllib.request.urlopen(f"{index}/llama-cpp-python/", timeout=120).read().decode()
match = re.search(
    rf'href="([^"#]*llama_cpp_python-{re.escape(version)}\.tar\.gz)#sha256=([0-9a-f]{{64}})"', page
)
if not match:
    sys.exit(f"error: llama_cpp_python-{version}.tar.gz not found on {index}")
url, want = match.groups()
if url.startswith("/"):
    url = index.split("/simple")[0] + url
print(f"downloading {url.rsplit('/', 1)[-1]} (≈ 77 MB) for llama.cpp's tokenizer vocabularies…", file=sys.stderr)
data = urllib.request.urlopen(url, timeout=600).read()
got = hashlib.sha256(data).hexdigest()
if got != want:
    sys.exit(f"error: sha256 of the download is {got}, the index says {want}")
wanted = {f"models/ggml-vocab-{n}.gguf{ext}": "vocab" for n in names for ext in ("", ".inp", ".out")}
wanted.update({f"models/templates/{t}.jinja": "templates" for t in templates})
with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
    for member in tar.getmembers():
        inside = member.name.split("/vendor/llama.cpp/", 1)[-1]
        if inside in wanted and member.isfile():
            folder = os.path.join(dest, wanted.pop(inside))
            base = inside.rsplit("/", 1)[-1]
            part = os.path.join(folder, base + ".part")
            with tar.extractfile(member) as src, open(part, "wb") as out:
                out.write(src.read())
            os.replace(part, os.path.join(folder, base))  # complete or absent
if wanted:
    sys.exit(f"error: not in the archive: {sorted(wanted)}")
PY
touch "$dest/.complete-$version-2"
echo "$dest"
