"""A long-response built-in task: four-digit additions worked column by column in a scratchpad.

Prompt: the two operands zero-padded to four digits, "4831+2907=". Response: one step per column from the right,
"x+y+c=s," (the column's digits, the carry in, their sum), then the answer's digits found so far and ";", and at
the end "#" and the sum:

    4831+2907=1+7+0=8,8;3+0+0=3,38;8+9+0=17,738;4+2+1=7,7738;#7738

About 55 tokens on the character tokenizer, and every one carries work the answer depends on: a wrong column, a
dropped carry or a miscopied digit changes the final sum. The reward reads the answer after the last "#" only
(exact match, ASCII digits), so the scratchpad is the model's own work, not a format it is paid for. This is the
task where a drift in the early tokens changes the context of everything after them, which a prefix-level
correction is designed for.

    python -m reinforce_pro.data.scratchpad --split held_out --n 200 > held_out.jsonl   # an --eval_dataset
"""

from __future__ import annotations

import random

from reinforce_pro.data.splits import print_split
from reinforce_pro.rewards.builtin import marked_answer, marked_answer_match

DIGITS = 4


def operands(rng: random.Random) -> tuple[int, int]:
    return rng.randrange(10**DIGITS), rng.randrange(10**DIGITS)


def prompt(a: int, b: int) -> str:
    return f"{a:0{DIGITS}d}+{b:0{DIGITS}d}="


def scratchpad(a: int, b: int) -> str:
    """The worked response: the column steps with the digits found so far, then "#" and the sum."""
    steps, carry, found = [], 0, ""
    for i in range(DIGITS):
        x, y = (a // 10**i) % 10, (b // 10**i) % 10
        s = x + y + carry
        carry = s // 10
        found = (str(s) if i == DIGITS - 1 else str(s % 10)) + found
        steps.append(f"{x}+{y}+{s - x - y}={s},{found};")
    return "".join(steps) + f"#{a + b}"


def records(n: int, seed: int, split: str = "train") -> list[dict]:
    """`n` records {"input": prompt, "label": the sum, "solution": the worked response}. The splits are disjoint:
    a pair belongs to "held_out" when (a + 7 b) % 10 == 0, to "train" otherwise, so a held-out question is never
    trained on, whatever the seeds."""
    if split not in ("train", "held_out"):
        raise ValueError(f"split must be train or held_out, got {split!r}")
    rng, out = random.Random(seed), []
    while len(out) < n:
        a, b = operands(rng)
        if ((a + 7 * b) % 10 == 0) == (split == "held_out"):
            out.append({"input": prompt(a, b), "label": str(a + b), "solution": scratchpad(a, b)})
    return out


parse_answer = marked_answer  # the sum after the last "#", or None
reward = marked_answer_match  # 1.0 when the stated sum equals the label


if __name__ == "__main__":
    print_split(records)
