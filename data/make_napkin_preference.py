"""Writes napkin-preference.jsonl: the preference pairs napkin ships for its DPO and ORPO demos
and tests. Each record is TRL's conversational shape: `prompt` (a user turn), `chosen` and
`rejected` (one assistant turn each). The chosen reply is right and plain; the rejected one is
wrong (an arithmetic slip, another country's capital, a miscount) or evasive. Every answer is
computed here, so the file can be regenerated exactly: `python3 make_napkin_preference.py`.

Licence of the script and of the data it writes: CC0 1.0 (public domain dedication).
"""

import json
import random

rng = random.Random(20261206)
pairs = []


def pair(question, chosen, rejected):
    pairs.append({
        "prompt": [{"role": "user", "content": question}],
        "chosen": [{"role": "assistant", "content": chosen}],
        "rejected": [{"role": "assistant", "content": rejected}],
    })


EVASIVE = [
    "I am not sure, you could look it up.",
    "That is hard to say.",
    "I would rather not answer that.",
    "It depends on many things.",
]

# Arithmetic: the right result against a near miss or an evasion.
for _ in range(110):
    a, b = rng.randint(2, 60), rng.randint(2, 60)
    op = rng.choice(["plus", "minus", "times"])
    value = {"plus": a + b, "minus": a - b, "times": a * b}[op]
    symbol = {"plus": "+", "minus": "-", "times": "×"}[op]
    wrong = value + rng.choice([-11, -10, -2, -1, 1, 2, 10, 11])
    question = rng.choice([f"What is {a} {op} {b}?", f"Compute {a} {symbol} {b}."])
    rejected = f"{a} {symbol} {b} = {wrong}." if rng.random() < 0.75 else rng.choice(EVASIVE)
    pair(question, f"{a} {symbol} {b} = {value}.", rejected)

# Capitals, written by the napkin authors; the wrong one is a neighbour's or a large city.
CAPITALS = [
    ("France", "Paris", "Lyon"), ("Germany", "Berlin", "Munich"), ("Italy", "Rome", "Milan"),
    ("Spain", "Madrid", "Barcelona"), ("Portugal", "Lisbon", "Porto"),
    ("Canada", "Ottawa", "Toronto"), ("Australia", "Canberra", "Sydney"),
    ("Japan", "Tokyo", "Osaka"), ("Brazil", "Brasília", "Rio de Janeiro"),
    ("Turkey", "Ankara", "Istanbul"), ("Switzerland", "Bern", "Zurich"),
    ("India", "New Delhi", "Mumbai"), ("Egypt", "Cairo", "Alexandria"),
    ("Kenya", "Nairobi", "Mombasa"), ("Poland", "Warsaw", "Kraków"),
    ("Norway", "Oslo", "Bergen"), ("Sweden", "Stockholm", "Gothenburg"),
    ("Morocco", "Rabat", "Casablanca"), ("Vietnam", "Hanoi", "Ho Chi Minh City"),
    ("New Zealand", "Wellington", "Auckland"), ("Nigeria", "Abuja", "Lagos"),
    ("Argentina", "Buenos Aires", "Córdoba"), ("Chile", "Santiago", "Valparaíso"),
    ("Peru", "Lima", "Cusco"), ("Greece", "Athens", "Thessaloniki"),
    ("Ireland", "Dublin", "Cork"), ("Scotland", "Edinburgh", "Glasgow"),
    ("Mexico", "Mexico City", "Guadalajara"), ("South Korea", "Seoul", "Busan"),
    ("Pakistan", "Islamabad", "Karachi"),
]
for country, capital, other in CAPITALS:
    question = rng.choice([f"What is the capital of {country}?", f"Name the capital city of {country}."])
    pair(question, f"The capital of {country} is {capital}.", f"The capital of {country} is {other}.")

# Counting letters: the right count against a miscount.
WORDS = ["banana", "gradient", "adapter", "quantize", "napkin", "memory", "tensor", "checkpoint",
         "optimizer", "parameter", "batch", "sequence", "attention", "dropout", "precision",
         "rank", "kernel", "layer", "token", "weight"]
for word in WORDS:
    letter = rng.choice(sorted(set(word)))
    count = word.count(letter)
    question = f"How many times does the letter '{letter}' appear in '{word}'?"
    wrong = count + rng.choice([1, 2]) if count < 3 else count - 1
    pair(question, f"'{letter}' appears {count} time{'s' if count != 1 else ''} in '{word}'.",
         f"'{letter}' appears {wrong} time{'s' if wrong != 1 else ''} in '{word}'.")

rng.shuffle(pairs)
with open("napkin-preference.jsonl", "w", encoding="utf-8") as out:
    for p in pairs:
        out.write(json.dumps(p, ensure_ascii=False) + "\n")
print(len(pairs), "pairs")
