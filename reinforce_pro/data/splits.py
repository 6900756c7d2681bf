"""The command line of the built-in task modules: a split of their records as jsonl."""

from __future__ import annotations

from collections.abc import Callable


def print_split(records: Callable[[int, int, str], list[dict]], argv: list[str] | None = None) -> None:
    """The command line of a task module: `records(n, seed, split)` printed as jsonl ({"input", "label",
    "solution"}), e.g. the held-out split for --eval_dataset."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description=print_split.__doc__)
    parser.add_argument("--n", type=int, default=200, help="number of records")
    parser.add_argument("--seed", type=int, default=1234, help="random seed")
    parser.add_argument("--split", default="held_out", choices=("train", "held_out"))
    args = parser.parse_args(argv)
    for record in records(args.n, args.seed, args.split):
        print(json.dumps(record))
