"""The built-in verifiable task of the embedded default: small additions, exact-match reward.

A prompt is "a+b=" and the answer is the decimal sum; the model should answer and stop (<eos>). The
operand ranges keep it at the edge of what a 0.4M-parameter character-level model learns in minutes:
a short supervised warm start gets it partly right, and RL has room to improve it.
"""

from __future__ import annotations

import random

DEFAULT_MAX_A = 19
DEFAULT_MAX_B = 19


def arithmetic_records(n: int, seed: int, max_a: int = DEFAULT_MAX_A, max_b: int = DEFAULT_MAX_B) -> list[dict]:
    """`n` records {"input": "a+b=", "label": "a+b"} drawn with `seed`."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(0, max_a), rng.randint(0, max_b)
        out.append({"input": f"{a}+{b}=", "label": str(a + b)})
    return out
