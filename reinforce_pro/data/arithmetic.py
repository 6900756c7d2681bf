"""The built-in verifiable task of the embedded default: small additions, exact-match reward.

A prompt is "a+b=" and the answer is the decimal sum; the model should answer and stop (<eos>). The
operand ranges keep it at the edge of what a 0.4M-parameter character-level model learns in minutes:
a short supervised warm start gets it partly right, and RL has room to improve it.
"""

from __future__ import annotations

import argparse
import json
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


def main() -> None:
    """`python -m reinforce_pro.data.arithmetic --n 64 --seed 1234 > held_out.jsonl`: records as jsonl, e.g.
    a held-out set for --eval_dataset (the embedded default draws its training prompts with --seed 42)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--n", type=int, default=64, help="number of records")
    parser.add_argument("--seed", type=int, default=1234, help="random seed")
    parser.add_argument("--max_a", type=int, default=DEFAULT_MAX_A, help="largest first operand")
    parser.add_argument("--max_b", type=int, default=DEFAULT_MAX_B, help="largest second operand")
    args = parser.parse_args()
    for record in arithmetic_records(args.n, args.seed, args.max_a, args.max_b):
        print(json.dumps(record))


if __name__ == "__main__":
    main()
