"""A long-response built-in task the 2-layer built-in model learns: the running sum of ten labelled digits.

Prompt: ten digits, each after its letter, "a7b1c0d1e9f0g1h1i5j3=". Response: one step per letter, the letter,
its digit copied from the prompt and the sum so far, then "#" and the total:

    a7=7;b1=8;c0=8;d1=9;e9=18;f0=18;g1=19;h1=20;i5=25;j3=28;#28

About 60 tokens on the character tokenizer. Every step reads the one before it, so a wrong digit or a wrong
sum early in the response carries into every sum after it: the drift a prefix-level correction is designed
for. The reward reads the total after the last "#" only (exact match, ASCII digits), so the steps are the
model's own work, not a format it is paid for.

Why this and not column-wise addition (data/scratchpad.py): each step here finds its digit by content (the
digit after its letter), which two attention layers do; a column of a multi-digit sum is found by position,
which the 2-layer model did not learn in a warm start of minutes (docs/running.md).

    python -m reinforce_pro.data.running_sum --split held_out --n 200 > held_out.jsonl   # an --eval_dataset
"""

from __future__ import annotations

import random

from reinforce_pro.data.splits import print_split
from reinforce_pro.rewards.builtin import marked_answer_match

LETTERS = "abcdefghij"  # one per term: the number of terms is len(LETTERS)


def prompt(digits: list[int]) -> str:
    return "".join(f"{letter}{d}" for letter, d in zip(LETTERS, digits, strict=True)) + "="


def worked(digits: list[int]) -> str:
    """The worked response: "<letter><digit>=<sum so far>;" per term, then "#" and the total."""
    total, steps = 0, []
    for letter, d in zip(LETTERS, digits, strict=True):
        total += d
        steps.append(f"{letter}{d}={total};")
    return "".join(steps) + f"#{total}"


def held_out(digits: list[int]) -> bool:
    """The held-out rule: (total + 3 x first digit) % 7 == 0, about one question in seven. A rule on the question,
    so the splits are disjoint whatever the seeds, and the held-out totals are not one residue class."""
    return (sum(digits) + 3 * digits[0]) % 7 == 0


def records(n: int, seed: int, split: str = "train") -> list[dict]:
    """`n` records {"input": prompt, "label": the total, "solution": the worked response} of one split."""
    if split not in ("train", "held_out"):
        raise ValueError(f"split must be train or held_out, got {split!r}")
    rng, out = random.Random(seed), []
    while len(out) < n:
        digits = [rng.randrange(10) for _ in LETTERS]
        if held_out(digits) == (split == "held_out"):
            out.append({"input": prompt(digits), "label": str(sum(digits)), "solution": worked(digits)})
    return out


reward = marked_answer_match  # 1.0 when the total after the last "#" equals the label


if __name__ == "__main__":
    print_split(records)
