"""What computing the LM head on the response positions only saves in the trainer's log-prob forward.

Runs on: CPU, with the `models` extra for SmolLM2-135M-Instruct (prepared once under ~/.cache/reinforce_pro).
Takes:   ~2 minutes on 2 cores with the defaults.

    python -m benchmarks.bench_logprob_head                 # measure, write JSON, render the table
    python -m benchmarks.bench_logprob_head --render FILE   # re-render from a JSON

One forward + backward of `response_log_probs` on a batch shaped like the SmolLM2 chain_sum step (left-padded
chat-templated prompts, right-padded responses), timed with the LM head over every position ("full": the
(B, S, V) logits, then sliced) and over the response only ("response": HF's logits_to_keep; the padded path
keeps the last num_actions + 1 columns, the packed path of --packing_samples the columns where some bin
predicts a response token), for the padded and the packed forward, alternating, median of `--reps`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from unittest import mock

from benchmarks.common import PACKAGED_MODELS, bench_main

NAME = "bench_logprob_head"
MODEL = PACKAGED_MODELS / "smollm2-135m-instruct"


def batch(rows: int, prompt: int, response: int, vocab: int, seed: int = 0):
    """(rows, prompt + response) token ids and mask: prompts of prompt/2..prompt tokens, responses of
    response/4..response, padded on the left and the right as a rollout batch is."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    seq = torch.randint(10, vocab, (rows, prompt + response), generator=gen)
    mask = torch.ones_like(seq)
    for i in range(rows):
        p = int(torch.randint(prompt // 2, prompt + 1, (1,), generator=gen))
        r = int(torch.randint(response // 4, response + 1, (1,), generator=gen))
        mask[i, : prompt - p] = 0
        mask[i, prompt + r :] = 0
    return seq * mask, mask


MODES = ("full", "response", "packed full", "packed response")


def time_step(model, seq, mask, response: int, packed: bool) -> float:
    from reinforce_pro.models.logprobs import response_log_probs

    start = time.perf_counter()
    model.zero_grad(set_to_none=True)
    lp, _ = response_log_probs(model, seq, mask, response, packed=packed)
    (lp * mask[:, -response:]).sum().backward()
    return time.perf_counter() - start


def measure(rows: int, prompt: int, response: int, reps: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from reinforce_pro.models import logprobs

    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    seq, mask = batch(rows, prompt, response, model.config.vocab_size)
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    for rep in range(reps + 1):  # the first round warms up
        for mode in times:
            keep = mode.endswith("response")
            with mock.patch.object(logprobs, "accepts_logits_to_keep", lambda _m, keep=keep: keep):
                t = time_step(model, seq, mask, response, packed=mode.startswith("packed"))
            if rep:
                times[mode].append(t)
    return {mode: statistics.median(ts) for mode, ts in times.items()} | {"times": times}


def render(payload: dict, out_dir: Path) -> str:
    res, cfg = payload["results"], payload["config"]
    lines = [
        f"SmolLM2-135M-Instruct, forward + backward of the response log-probs, {cfg['rows']} rows x "
        f"({cfg['prompt']} prompt + {cfg['response']} response) columns, median of {cfg['reps']}",
        "",
        "| forward | LM head over | seconds | vs padded, full head |",
        "|---|---|---|---|",
    ]
    for mode in (m for m in MODES if m in res):  # JSONs before the packed modes have the padded two
        forward, head = ("packed", mode.split()[1]) if mode.startswith("packed") else ("padded", mode)
        lines.append(f"| {forward} | {head} | {res[mode]:.3f} | {res['full'] / res[mode]:.2f}x |")
    m = payload["machine"]
    lines.append(f"\n_{m['cpu']} ({m['cpu_count']} cores), torch {m['torch']}, commit {payload['commit'][:12]}._")
    text = "\n".join(lines)
    (out_dir / f"{NAME}.md").write_text(text + "\n")
    return text


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows", type=int, default=8, help="rows per micro-batch (the SmolLM2 recipe's 8)")
    p.add_argument("--prompt", type=int, default=96, help="prompt columns (--prompt_max_len of the recipe)")
    p.add_argument("--response", type=int, default=16, help="response columns (--max_new_tokens)")
    p.add_argument("--reps", type=int, default=5)


def measured(args) -> tuple[dict, dict]:
    config = {"rows": args.rows, "prompt": args.prompt, "response": args.response, "reps": args.reps}
    return config, measure(args.rows, args.prompt, args.response, args.reps)


def main(argv=None) -> int:
    return bench_main(argv, NAME, __doc__, options, measured, render)


if __name__ == "__main__":
    raise SystemExit(main())
