"""Renders real chat templates with transformers, the oracle napkin's Jinja renderer is
checked against (tests/integration/chat_templates.rs).

The templates are llama.cpp's copies of the models' own (models/llama.cpp/templates/, fetched by
scripts/fetch/llama-cpp-data.sh), SmolLM2's from its GGUF (scripts/fetch/smollm2.sh) and
TinyLlama-Chat's Zephyr template (tinyllama-zephyr.jinja beside this script); each is rendered on a few conversations with and without the
generation prompt by `transformers.utils.chat_template_utils.render_jinja_template`, the
function `apply_chat_template` calls. A template that refuses a conversation (Gemma 2 has no
system role) records the refusal. `date_string` is fixed so Llama 3.1's date line is the
template's own default, as napkin renders it (napkin defines no `strftime_now`).

    scripts/ci/interop.sh sets up .venv; then:
    .venv/bin/python tests/corpus/chat_templates/make_expected.py
"""

import json
from pathlib import Path

from transformers.utils.chat_template_utils import render_jinja_template

HERE = Path(__file__).parent
ROOT = HERE.parents[2]
SMOLLM2 = "models/SmolLM2-135M-Instruct.Q4_1.gguf"

# The special-token texts each model's tokenizer_config.json gives the template.
TOKENS = {
    "SmolLM2-135M-Instruct": ("<|im_start|>", "<|im_end|>"),
    "TinyLlama-1.1B-Chat-zephyr": ("<s>", "</s>"),
    "meta-llama-Llama-3.1-8B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "meta-llama-Llama-3.2-3B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "Qwen-Qwen2.5-7B-Instruct": (None, "<|im_end|>"),
    "microsoft-Phi-3.5-mini-instruct": ("<s>", "<|endoftext|>"),
    "google-gemma-2-2b-it": ("<bos>", "<eos>"),
    "mistralai-Mistral-Nemo-Instruct-2407": ("<s>", "</s>"),
    "HuggingFaceTB-SmolLM3-3B": (None, "<|im_end|>"),
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
}

SYSTEM = {"role": "system", "content": "You are a concise assistant."}
USER = {"role": "user", "content": "What is the capital of France?"}
REPLY = {"role": "assistant", "content": "Paris."}
USER2 = {"role": "user", "content": "  And of Peru?\n"}
CONVERSATIONS = [
    ([USER], True),
    ([USER, REPLY], False),
    ([SYSTEM, USER, REPLY], False),
    ([SYSTEM, USER, REPLY, USER2], True),
    ([USER, REPLY, USER2, {"role": "assistant", "content": "Lima."}], False),
]



def template_path(name):
    """Where a template's source is, relative to the repository root."""
    if name == "SmolLM2-135M-Instruct":
        return f"gguf:{SMOLLM2}"
    if name == "TinyLlama-1.1B-Chat-zephyr":
        return "tests/corpus/chat_templates/tinyllama-zephyr.jinja"
    return f"models/llama.cpp/templates/{name}.jinja"


def read_template(where):
    if where.startswith("gguf:"):
        from gguf import GGUFReader
        return GGUFReader(ROOT / where[5:]).fields["tokenizer.chat_template"].contents()
    return (ROOT / where).read_text()


out = {}
for name, (bos, eos) in TOKENS.items():
    where = template_path(name)
    source = read_template(where)
    cases = []
    for messages, generation in CONVERSATIONS:
        case = {"messages": messages, "add_generation_prompt": generation}
        try:
            rendered = render_jinja_template(
                conversations=[messages], chat_template=source, add_generation_prompt=generation,
                bos_token=bos or "", eos_token=eos or "", date_string="26 Jul 2024")
            case["text"] = rendered[0][0]
        except Exception as e:  # the template's own raise_exception
            case["error"] = str(e)
        cases.append(case)
    out[name] = {"source": where, "bos_token": bos, "eos_token": eos, "cases": cases}
    print(f"{name}: {sum('text' in c for c in cases)} rendered, {sum('error' in c for c in cases)} refused")
(HERE / "expected.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
