"""--packing_samples against the padded forward: one training micro-step (forward, response log-probs, backward)
on a batch with mixed response lengths, and on one where every response has the same length (the control,
where packing can only cost).

Runs on: CPU (the default) or a GPU (--device cuda); no Ray, vLLM or DeepSpeed needed.
Takes:   ~3 minutes on 2 cores with the defaults.

    python -m benchmarks.bench_packing
    python -m benchmarks.bench_packing --rows 16 --reps 10 --sizes tiny,small
    python -m benchmarks.bench_packing --render FILE     # re-render table and plot from a JSON

Models are built locally from the tiny model's tokenizer: `tiny` is the embedded default's policy (hidden 128,
2 layers), `small` a wider and deeper one (hidden 512, 8 layers) where the linear layers dominate as they do in
real models. The padded path is the trainer's own (`Experience.trim_padding` first removes the columns that
are padding in every row). The packed path runs as the trainer runs it: with sdpa the model is loaded as
sdpa_varlen (models/varlen_attention.py) and the whole micro-batch goes in one row; "bins" is the path eager
attention takes (first-fit-decreasing bins as long as the longest row, a block-diagonal mask), timed on the
same model switched to sdpa meanwhile. Each condition is timed `reps` times after a warm-up, the three paths
alternating, and reported as the median.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import (
    attention_kernel,
    bench_main,
    new_figure,
    save_figure,
)
from reinforce_pro.models.logprobs import response_log_probs
from reinforce_pro.models.packing import pack
from reinforce_pro.models.tiny import build_tiny_model
from reinforce_pro.models.varlen_attention import load_name

ROOT = Path(__file__).resolve().parent.parent

PATHS = {"padded": (False, None), "one row": (True, None), "bins": (True, "sdpa")}  # packed?, kernel meanwhile

SIZES = {
    "tiny": {"hidden_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 384},
    "small": {"hidden_size": 512, "num_layers": 8, "num_heads": 8, "num_kv_heads": 4, "intermediate_size": 1536},
}


def make_batch(rows: int, prompt_len: int, response_len: int, mixed: bool, seed: int = 0):
    """Left-padded prompts of 50-100% of prompt_len; responses of 1..response_len tokens (mixed, uniform) or
    all response_len (equal)."""
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(4, 90, (rows, prompt_len + response_len), generator=g)
    mask = torch.ones_like(seq)
    for i in range(rows):
        p = int(torch.randint(prompt_len // 2, prompt_len + 1, (1,), generator=g))
        r = int(torch.randint(1, response_len + 1, (1,), generator=g)) if mixed else response_len
        mask[i, : prompt_len - p] = 0
        mask[i, prompt_len + r :] = 0
    # as the trainer does: drop the columns that are padding in every row (Experience.trim_padding)
    keep = mask.any(dim=0)
    first, last = int(keep.nonzero()[0]), int(keep.nonzero()[-1])
    return (seq * mask)[:, first : last + 1], mask[:, first : last + 1], last + 1 - prompt_len


def micro_step(model, seq, mask, num_actions: int, path: str) -> float:
    packed, kernel = PATHS[path]
    with attention_kernel(model.config, kernel):
        start = time.perf_counter()
        lp, _ = response_log_probs(model, seq, mask, num_actions, packed=packed)
        (lp * mask[:, -num_actions:]).sum().backward()
        if seq.is_cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    return seconds


def run_condition(model, seq, mask, num_actions: int, reps: int) -> dict:
    for path in PATHS:  # warm-up
        micro_step(model, seq, mask, num_actions, path)
    times = {path: [] for path in PATHS}
    for _ in range(reps):
        for path in PATHS:
            times[path].append(micro_step(model, seq, mask, num_actions, path))
    bins = pack(seq, mask).input_ids
    return {
        "padded_ms": 1000 * statistics.median(times["padded"]),
        "packed_ms": 1000 * statistics.median(times["one row"]),
        "bins_ms": 1000 * statistics.median(times["bins"]),
        "real_tokens": int(mask.sum()),
        "padded_tokens": seq.numel(),
        "bin_tokens": bins.numel(),
        "bins": bins.size(0),
    }


def render(payload: dict, out_dir: Path) -> str:
    cfg = payload["config"]
    lines = [
        "| model | responses | tokens: real (one row) / padded / in bins (rows -> bins) | padded ms | packed, one "
        "row ms | speed-up | in bins ms | speed-up |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in payload["results"]:
        lines.append(
            f"| {r['size']} | {r['lengths']} | {r['real_tokens']} / {r['padded_tokens']} / {r['bin_tokens']} "
            f"({cfg['rows']} -> {r['bins']}) | {r['padded_ms']:.1f} | {r['packed_ms']:.1f} | "
            f"{r['padded_ms'] / r['packed_ms']:.2f}x | {r['bins_ms']:.1f} | {r['padded_ms'] / r['bins_ms']:.2f}x |"
        )
    lines += [
        "",
        f"One training micro-step (forward, response log-probs, backward) of {cfg['rows']} rows, prompts of "
        f"{cfg['prompt_len'] // 2}-{cfg['prompt_len']} tokens, responses of up to {cfg['response_len']}; median of "
        f"{cfg['reps']} on {cfg['device']} ({payload['machine'].get('cpu', '')}, {cfg['threads']} threads, commit "
        f"{payload['commit'][:12]}).",
    ]
    text = "\n".join(lines) + "\n"
    (out_dir / "bench_packing.md").write_text(text)
    _plot(payload, out_dir / "bench_packing.png")
    return text


def _plot(payload: dict, path: Path) -> None:
    rows = payload["results"]
    labels = [f"{r['size']}\n{r['lengths']}" for r in rows]
    x = range(len(rows))
    fig, ax = new_figure((7, 3.5))
    ax.bar([i - 0.27 for i in x], [r["padded_ms"] for r in rows], 0.27, label="padded")
    ax.bar(list(x), [r["packed_ms"] for r in rows], 0.27, label="packed, one row (--packing_samples)")
    ax.bar([i + 0.27 for i in x], [r["bins_ms"] for r in rows], 0.27, label="packed in bins (eager's path)")
    ax.set_xticks(list(x), labels)
    ax.set_ylabel("ms per micro-step")
    ax.set_title("Training micro-step, padded vs packed")
    save_figure(fig, ax, path)


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows", type=int, default=16, help="rows per micro-batch")
    p.add_argument("--prompt_len", type=int, default=32, help="longest prompt (shortest: half of it)")
    p.add_argument("--response_len", type=int, default=96, help="longest response")
    p.add_argument("--reps", type=int, default=10, help="timed micro-steps per path and condition")
    p.add_argument("--sizes", default="tiny,small", help="comma-separated model sizes: " + ", ".join(SIZES))
    p.add_argument("--attn", default="sdpa", choices=["sdpa"], help="attn_implementation (loaded as sdpa_varlen)")
    p.add_argument("--device", default="cpu")


def measured(args) -> tuple[dict, list]:
    from transformers import AutoModelForCausalLM

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            path = build_tiny_model(Path(tmp) / size, seed=0, **SIZES[size])
            attn = load_name(args.attn, packing_samples=True)  # as the trainer loads it under --packing_samples
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=attn)
            model = model.to(args.device).train()
            for lengths in ("mixed", "equal"):
                seq, mask, num_actions = make_batch(args.rows, args.prompt_len, args.response_len, lengths == "mixed")
                seq, mask = seq.to(args.device), mask.to(args.device)
                r = run_condition(model, seq, mask, num_actions, args.reps)
                results.append({"size": size, "lengths": lengths, **r})
                print(f"{size} {lengths}: padded {r['padded_ms']:.1f} ms, one row {r['packed_ms']:.1f} ms, "
                      f"bins {r['bins_ms']:.1f} ms", flush=True)  # fmt: skip
    config = {k: v for k, v in vars(args).items() if k not in ("output", "render")}
    config.update(threads=torch.get_num_threads(), model_sizes={s: SIZES[s] for s in args.sizes.split(",")})
    return config, results


def main(argv=None) -> int:
    return bench_main(argv, "bench_packing", __doc__, options, measured, render)


if __name__ == "__main__":
    sys.exit(main())
