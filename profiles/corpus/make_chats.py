#!/usr/bin/env python3
"""Writes chats.jsonl: small arithmetic chat prompts in the style the demo model
was trained on (sums, products, counting, comparisons, repeating a word).
Deterministic (fixed seed), so the shipped file can be regenerated exactly:
    python3 profiles/corpus/make_chats.py > profiles/corpus/chats.jsonl
Each line holds only the user turn; `tandem profile --prompts` lets the model
write the answer (a <think> block, then the result)."""
import json
import random

rng = random.Random(1961)
WORDS = ["river", "apple", "train", "garden", "window", "music", "candle", "orange",
         "pencil", "bridge", "summer", "engine", "silver", "paper", "cloud", "tiger"]


def sums():
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    return rng.choice([f"What is {a} + {b}?", f"Add {a} and {b}.",
                       f"What is the sum of {a} and {b}?", f"Compute {a} plus {b}."])


def products():
    a, b = rng.randint(2, 12), rng.randint(2, 12)
    return rng.choice([f"What is {a} * {b}?", f"Multiply {a} by {b}.",
                       f"What is {a} times {b}?", f"What is the product of {a} and {b}?"])


def counting():
    a = rng.randint(1, 20)
    b = a + rng.randint(3, 9)
    return rng.choice([f"Count from {a} to {b} in a code block.",
                       f"List the numbers from {a} to {b} in a code block.",
                       f"Please count from {a} to {b}."])


def compare():
    a, b = rng.sample(range(1, 500), 2)
    return rng.choice([f"Which is larger, {a} or {b}?", f"Which is smaller, {a} or {b}?",
                       f"Is {a} greater than {b}?", f"Compare {a} and {b}."])


def repeat():
    w, n = rng.choice(WORDS), rng.randint(2, 6)
    return rng.choice([f"Repeat the word {w} {n} times.", f"Say {w} {n} times.",
                       f"Write the word {w} {n} times, separated by spaces."])


def main():
    kinds = [sums, products, counting, compare, repeat]
    for i in range(160):
        q = kinds[i % len(kinds)]()
        print(json.dumps({"messages": [{"role": "user", "content": q}]}))


main()
