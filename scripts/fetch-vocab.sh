#!/usr/bin/env bash
# Fetches llama.cpp's tokenizer test vocabularies into models/llama.cpp-vocab/ (git-ignored):
# vocabulary-only GGUFs of Llama 2 (SentencePiece), Llama 3, Qwen2, Phi-3, GPT-2, DeepSeek, …,
# each with llama.cpp's test texts (`.inp`) and the ids Hugging Face's tokenizer gives them
# (`.out`). They come from the source distribution of `llama-cpp-python` on PyPI (MIT; llama.cpp
# is vendored in it), checked against the index's sha256, so no model hub is needed.
# tests/integration/gguf_tokenizers.rs reads them.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/models/llama.cpp-vocab"
version="0.3.36"
names="llama-spm phi-3 llama-bpe qwen2 gpt-2 mpt deepseek-llm deepseek-coder falcon starcoder refact command-r"
if [ -f "$dest/.complete-$version" ]; then
    echo "$dest"
    exit 0
fi
mkdir -p "$dest"
python3 - "$dest" "$version" $names <<'PY'
import hashlib, io, os, re, sys, tarfile, urllib.request

dest, version, names = sys.argv[1], sys.argv[2], sys.argv[3:]
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
wanted = {f"ggml-vocab-{n}.gguf{ext}" for n in names for ext in ("", ".inp", ".out")}
with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
    for member in tar.getmembers():
        base = member.name.rsplit("/", 1)[-1]
        if "/vendor/llama.cpp/models/" in member.name and base in wanted and member.isfile():
            part = os.path.join(dest, base + ".part")
            with tar.extractfile(member) as src, open(part, "wb") as out:
                out.write(src.read())
            os.replace(part, os.path.join(dest, base))  # complete or absent
            wanted.discard(base)
if wanted:
    sys.exit(f"error: not in the archive: {sorted(wanted)}")
PY
touch "$dest/.complete-$version"
echo "$dest"
