"""Writes napkin-instruct.jsonl: the small instruction data set napkin ships for its demos and
tests. Every answer is computed here (or, for the short glossary and the capitals, written by
the napkin authors), so the file can be regenerated exactly: `python3 make_napkin_instruct.py`.

Licence of the script and of the data it writes: CC0 1.0 (public domain dedication).
"""

import json
import random

rng = random.Random(20261122)
examples = []


def alpaca(instruction, output, input_text=None):
    example = {"instruction": instruction}
    if input_text is not None:
        example["input"] = input_text
    example["output"] = output
    examples.append(example)


# Arithmetic: 120 examples.
for _ in range(120):
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    op = rng.choice(["plus", "minus", "times"])
    value = {"plus": a + b, "minus": a - b, "times": a * b}[op]
    symbol = {"plus": "+", "minus": "-", "times": "×"}[op]
    if rng.random() < 0.5:
        alpaca(f"What is {a} {op} {b}?", f"{a} {symbol} {b} = {value}.")
    else:
        alpaca(f"Compute {a} {symbol} {b}.", f"{a} {symbol} {b} = {value}.")

# Weight memory by dtype (1 GB = 10^9 bytes): 60 examples.
bytes_per_param = {"float32": 4, "bfloat16": 2, "int8": 1, "4-bit NF4": 0.5}
for _ in range(60):
    billions = rng.choice([0.135, 0.5, 1.1, 1.5, 3, 7, 8, 13, 34, 70])
    dtype = rng.choice(list(bytes_per_param))
    gb = billions * bytes_per_param[dtype]
    alpaca(f"How many gigabytes do the weights of a {billions}-billion-parameter model take in {dtype}?",
           f"{billions} billion parameters × {bytes_per_param[dtype]} bytes = {gb:g} GB.")

# LoRA parameter counts: 60 examples.
for _ in range(60):
    r = rng.choice([4, 8, 16, 32, 64])
    d_in = rng.choice([576, 1024, 1536, 2048, 4096])
    d_out = rng.choice([576, 1024, 1536, 2048, 4096, 11008])
    alpaca(f"How many trainable parameters does a rank-{r} LoRA adapter add to a linear layer "
           f"with {d_in} inputs and {d_out} outputs?",
           f"r × (in + out) = {r} × ({d_in} + {d_out}) = {r * (d_in + d_out)}.")

# Word games: 100 examples.
words = ["napkin", "memory", "gradient", "adapter", "quantize", "optimizer", "tensor", "layer",
         "batch", "token", "cosine", "momentum", "kernel", "matrix", "vector", "laptop",
         "browser", "workshop", "learner", "checkpoint", "packing", "attention", "softmax",
         "embedding", "precision", "scale", "block", "codebook", "sequence", "rotary"]
for _ in range(60):
    w = rng.choice(words)
    if rng.random() < 0.5:
        alpaca("Spell the word backwards.", f"{w[::-1]}", input_text=w)
    else:
        alpaca(f"Spell the word '{w}' backwards.", f"{w[::-1]}")
for _ in range(40):
    w = rng.choice(words)
    alpaca(f"Write '{w}' in capital letters.", w.upper())

# Capitals, written by the napkin authors.
capitals = [("France", "Paris"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Germany", "Berlin"),
            ("Japan", "Tokyo"), ("Egypt", "Cairo"), ("Canada", "Ottawa"),
            ("Australia", "Canberra"), ("Kenya", "Nairobi"), ("Portugal", "Lisbon"),
            ("Greece", "Athens"), ("Norway", "Oslo"), ("Sweden", "Stockholm"),
            ("Finland", "Helsinki"), ("Poland", "Warsaw"), ("Austria", "Vienna"),
            ("Ireland", "Dublin"), ("Peru", "Lima"), ("Chile", "Santiago"),
            ("Argentina", "Buenos Aires"), ("India", "New Delhi"), ("China", "Beijing"),
            ("South Korea", "Seoul"), ("Thailand", "Bangkok"), ("Vietnam", "Hanoi"),
            ("Turkey", "Ankara"), ("Netherlands", "Amsterdam"), ("Denmark", "Copenhagen"),
            ("Hungary", "Budapest"), ("Czechia", "Prague")]
for country, city in capitals:
    alpaca(f"What is the capital of {country}?", f"The capital of {country} is {city}.")

# A glossary of the subject, written by the napkin authors.
glossary = [
    ("What does LoRA stand for?", "Low-Rank Adaptation: a frozen weight W gets a trainable update B·A of small rank r."),
    ("What is QLoRA?", "LoRA adapters trained on top of a frozen base model quantized to 4-bit NF4."),
    ("What is NF4?", "NormalFloat 4: a 4-bit code whose 16 values are quantiles of a normal distribution, scaled per block by the block's absolute maximum."),
    ("What does double quantization save?", "It stores the NF4 block scales in 8 bits instead of 32, about 0.37 bits per weight with blocks of 64."),
    ("What does gradient checkpointing trade?", "Memory for compute: activations are recomputed in the backward pass instead of being kept."),
    ("What is gradient accumulation?", "Summing gradients over several micro-batches before one optimizer step, to reach a large batch in small memory."),
    ("How many bytes of optimizer state does AdamW keep per parameter?", "Eight: two float32 moments."),
    ("How many bytes of state does 8-bit AdamW keep per parameter?", "About two: two 8-bit moments plus a small scale per block."),
    ("Why do large vocabularies cost memory?", "The logits tensor has batch × sequence × vocabulary entries, and training keeps it for the backward pass."),
    ("What is sequence packing?", "Placing several short samples in one row, with positions restarting and attention kept inside each sample."),
    ("What is a warm-up?", "A few first steps whose learning rate grows linearly from zero to the peak."),
    ("What does gradient clipping do?", "It scales all gradients down when their global norm exceeds a limit."),
    ("What is the memory of full fine-tuning with AdamW in float32?", "About 16 bytes per parameter: 4 for weights, 4 for gradients and 8 for the optimizer, plus activations."),
    ("What does a KV cache store?", "The keys and values of past tokens, so each new token attends to them without recomputing them."),
    ("What is RoPE?", "Rotary position embedding: queries and keys are rotated by angles proportional to their position."),
]
for question, answer in glossary:
    alpaca(question, answer)

rng.shuffle(examples)
with open("napkin-instruct.jsonl", "w", encoding="utf-8") as f:
    for example in examples:
        f.write(json.dumps(example, ensure_ascii=False) + "\n")
print(f"{len(examples)} examples")
