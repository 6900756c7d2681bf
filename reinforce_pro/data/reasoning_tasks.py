"""Real reasoning tasks as prompt files: reasoning-gym's procedural generators (Apache-2.0; the `models` extra)
written as jsonl, a training file and a held-out file drawn with different seeds, for --prompt_data and
--eval_dataset (no question in both). Each record keeps the generator's whole entry as its label, so the reward function
(examples/python/reward_reasoning_gym.py) scores answers with reasoning-gym's own verifier.

    python -m reinforce_pro.data.reasoning_tasks chain_sum --train 2000 --eval 100 --out data/chain_sum

Records: {"question": text + ANSWER_HINT, "answer": "-4", "entry": {"question", "answer", "metadata"}}; use
`--input_key question --label_key entry --apply_chat_template`. Generation is offline and deterministic.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

# The tasks this project documents and tests: the arithmetic family and one GSM-style word-problem task.
# Any other reasoning-gym dataset name works too (its answers must be what the verifier expects).
TASKS = ("basic_arithmetic", "chain_sum", "products", "decimal_arithmetic", "gsm_symbolic")
ANSWER_HINT = " Give only the final answer, as a number."
HELD_OUT_SEED_OFFSET = 1_000_003  # far from any training item's Random(seed + i)
INSTALL = "reasoning-gym is not installed: install the models extra (EXTRAS=cpu,models,dev bash scripts/setup_env.sh)"


def task_records(task: str, n: int, seed: int, config: dict | None = None) -> list[dict]:
    """`n` records of reasoning-gym dataset `task` drawn with `seed`; `config`: the dataset's own settings
    (chain_sum: min_terms, max_terms, min_digits, max_digits, ...)."""
    import reasoning_gym

    dataset = reasoning_gym.create_dataset(task, size=n, seed=seed, **(config or {}))
    out = []
    for entry in dataset:
        entry = json.loads(json.dumps(entry))  # tuples in the metadata become lists, as the file will hold them
        out.append({"question": entry["question"] + ANSWER_HINT, "answer": str(entry["answer"]), "entry": entry})
    return out


def write_task(
    task: str, out: Path, train: int, held_out: int, seed: int, config: dict | None = None
) -> tuple[Path, Path]:
    """out/train.jsonl and out/eval.jsonl, with no question in both.

    reasoning-gym draws item i from Random(seed + i), so seed + 1 would only shift the same items by one; and
    small tasks (two single-digit terms: 200 distinct questions) repeat questions anyway. So the held-out file
    takes `held_out` distinct questions drawn from a distant seed, and the training file is drawn from `seed`
    with every held-out question left out."""
    held = _distinct(task, held_out, seed + HELD_OUT_SEED_OFFSET, config, exclude=set())
    kept = _distinct(task, train, seed, config, exclude={r["question"] for r in held}, unique=False)
    out.mkdir(parents=True, exist_ok=True)
    paths = out / "train.jsonl", out / "eval.jsonl"
    for path, records in zip(paths, (kept, held), strict=True):
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return paths


def _distinct(task, n, seed, config, exclude: set, unique: bool = True) -> list[dict]:
    """`n` records whose question is not in `exclude` (and, with `unique`, not repeated), drawn in rounds
    of growing size from `seed`; fewer if the task has fewer such questions."""
    out, seen, size = [], set(exclude), max(n, 16)
    for _ in range(8):
        out, seen = [], set(exclude)
        for r in task_records(task, size, seed, config):
            if r["question"] not in seen and len(out) < n:
                out.append(r)
                if unique:
                    seen.add(r["question"])
        if len(out) == n:
            break
        size *= 2
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reinforce_pro.data.reasoning_tasks", description=__doc__.split("\n")[0]
    )
    parser.add_argument("task", help=f"a reasoning-gym dataset name, e.g. {', '.join(TASKS)}")
    parser.add_argument("--out", type=Path, required=True, help="directory for train.jsonl and eval.jsonl")
    parser.add_argument("--train", type=int, default=2000, help="training records")
    parser.add_argument("--eval", type=int, default=100, help="held-out records")
    parser.add_argument("--seed", type=int, default=0, help="random seed (the held-out file's questions never train)")
    parser.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE",
        help="the task's settings, values as JSON (chain_sum: --set max_terms=2 max_digits=1)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        config = {k: json.loads(v) for k, v in (item.split("=", 1) for item in args.set)}
    except ValueError:
        print(f"reasoning_tasks: error: --set takes KEY=VALUE with a JSON value, got {args.set}", file=sys.stderr)
        return 2
    if importlib.util.find_spec("reasoning_gym") is None:
        print(f"reasoning_tasks: error: {INSTALL}", file=sys.stderr)
        return 2
    import reasoning_gym

    if args.task not in reasoning_gym.factory.DATASETS:
        print(f"reasoning_tasks: error: unknown task {args.task!r}; e.g. {', '.join(TASKS)}", file=sys.stderr)
        return 2
    try:
        paths = write_task(args.task, args.out, args.train, args.eval, args.seed, config)
    except (TypeError, ValueError) as e:  # reasoning-gym's own check of the settings
        print(f"reasoning_tasks: error: {args.task} {config}: {e}", file=sys.stderr)
        return 2
    for path in paths:
        print(f"[reasoning_tasks] {path}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
