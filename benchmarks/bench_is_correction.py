"""Forward + backward time of PolicyLoss for each IS correction, as a ratio to `tis` in the same run.

Runs on: CPU (float32), the machine's default torch thread count. Takes ~1-3 minutes at the default
sizes on 2 cores. Target: reinforce_pro within 1.15x of tis.

    python -m benchmarks.bench_is_correction                 # measure, write JSON, print + render table
    python -m benchmarks.bench_is_correction --render FILE   # re-render the table/plot from a JSON

Each timed call builds the loss from fresh leaf log-probs and runs backward, i.e. what the trainer pays
per micro-batch.

Allocator: by default the script re-executes itself with glibc's malloc told to keep freed memory
(MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_), the CPU counterpart of the caching allocator torch
uses on CUDA. Without it, timings depend on the heap's history: once glibc has trimmed its heap, every
fresh multi-MB temporary re-faults its pages (measured: a 1 ms cumsum taking 8 ms), which swamps the
arithmetic being compared. `--system-malloc` measures with the allocator as the environment has it.

Types are timed round-robin (in a rotating order) so that drift in machine load affects all of them
alike; the median of the repeats is reported.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import bench_main
from reinforce_pro.algos.is_correction import IS_CORRECTIONS, default_band
from reinforce_pro.algos.losses import PolicyLoss
from reinforce_pro.procs import KEEP_FREED_MEMORY  # what the CPU trainer ranks get too

SIZES = [(64, 1024), (256, 4096), (256, 8192)]
VARIANTS = ["none", *IS_CORRECTIONS]  # "none": PolicyLoss without IS correction
TARGET = {"reinforce_pro": 1.15}


def make_inputs(b: int, t: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=gen) * 3
    log_probs = old + 0.05 * torch.randn(b, t, generator=gen)
    rollout = old + 0.3 * torch.randn(b, t, generator=gen)  # enough mismatch that every filter masks
    adv = torch.randn(b, 1, generator=gen).expand(b, t).contiguous()
    lengths = torch.randint(t // 4, t + 1, (b,), generator=gen)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    return log_probs, old, rollout, adv, mask


def time_once(loss_fn: PolicyLoss, inputs, inner: int) -> float:
    """Mean seconds of one forward + backward (+ reading the metrics) over `inner` back-to-back calls."""
    log_probs, old, rollout, adv, mask = inputs
    leaves = [log_probs.clone().requires_grad_(True) for _ in range(inner)]
    start = time.perf_counter()
    for lp in leaves:
        loss, metrics = loss_fn(lp, old, adv, action_mask=mask, rollout_log_probs=rollout)
        loss.backward()
        _ = {k: v.item() for k, v in metrics.items()}  # the trainer reads the metrics too
    return (time.perf_counter() - start) / inner


def measure(sizes, repeats: int, warmup: int) -> list[dict]:
    losses = {
        v: PolicyLoss(
            enable_vllm_is_correction=v != "none",
            vllm_is_correction_type="tis" if v == "none" else v,
            vllm_is_truncated_threshold=default_band(v, (0.5, 5.0)),
        )
        for v in VARIANTS
    }
    rows = []
    for b, t in sizes:
        inputs = make_inputs(b, t)
        # Small sizes take a few ms: repeat the call inside one sample so each sample lasts >= ~40 ms.
        inner = max(1, round(0.04 / time_once(losses["tis"], inputs, 1)))
        times = {v: [] for v in VARIANTS}
        for i in range(warmup + repeats):
            order = VARIANTS[i % len(VARIANTS) :] + VARIANTS[: i % len(VARIANTS)]
            for v in order:
                dt = time_once(losses[v], inputs, inner)
                if i >= warmup:
                    times[v].append(dt)
        for v in VARIANTS:
            med = statistics.median(times[v])
            # Paired ratio: each sample against the tis sample of the same round, then the median.
            # Host noise drifts on a scale of seconds, so a round's samples share it; this is more
            # stable than a ratio of medians.
            ratio = statistics.median(x / y for x, y in zip(times[v], times["tis"], strict=True))
            rows.append(
                {
                    "B": b,
                    "T": t,
                    "variant": v,
                    "median_ms": 1000 * med,
                    "min_ms": 1000 * min(times[v]),
                    "ratio_to_tis": ratio,
                    "repeats": repeats,
                    "calls_per_sample": inner,
                }
            )
            print(f"  B={b:<4} T={t:<5} {v:<14} {1000 * med:9.2f} ms  x{ratio:.3f}", flush=True)
    return rows


def measured_variants(rows: list[dict]) -> list[str]:
    """The variants a result holds, in VARIANTS' order (a result from before a correction was added lacks it)."""
    return [v for v in VARIANTS if any(r["variant"] == v for r in rows)]


def render(payload: dict, out_dir: Path) -> str:
    """Markdown table (and a PNG bar chart when matplotlib is installed) from the JSON payload."""
    rows = payload["results"]
    sizes = sorted({(r["B"], r["T"]) for r in rows})
    header = "| variant | " + " | ".join(f"B={b}, T={t}" for b, t in sizes) + " |"
    lines = [header, "|---|" + "---|" * len(sizes)]
    for v in measured_variants(rows):
        cells = []
        for b, t in sizes:
            r = next(r for r in rows if r["variant"] == v and (r["B"], r["T"]) == (b, t))
            cells.append(f"{r['median_ms']:.1f} ms (x{r['ratio_to_tis']:.2f})")
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    m = payload["machine"]
    lines.append("")
    lines.append(
        f"forward + backward of PolicyLoss, float32, median of {rows[0]['repeats']} samples "
        f"(each the mean of >= 1 back-to-back calls lasting ~40 ms); "
        f"{m['cpu']} ({m['cpu_count']} cores, {m['torch_threads']} torch threads), torch {m['torch']}, "
        f"commit {payload['commit'][:12]}, malloc keeps freed memory: "
        f"{all(payload['config'].get('malloc_env', {}).values())}. In parentheses: median over rounds of "
        f"(time / time of tis in the same round)."
    )
    table = "\n".join(lines)
    (out_dir / "bench_is_correction.md").write_text(table + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return table
    fig, ax = plt.subplots(figsize=(7, 3.5))
    variants = measured_variants(rows)
    width = 0.8 / len(variants)
    for i, v in enumerate(variants):
        ys = [next(r["ratio_to_tis"] for r in rows if r["variant"] == v and (r["B"], r["T"]) == s) for s in sizes]
        ax.bar([j + i * width for j in range(len(sizes))], ys, width, label=v)
    ax.axhline(TARGET["reinforce_pro"], color="k", ls="--", lw=0.8, label="reinforce_pro target")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(sizes))], [f"B={b}\nT={t}" for b, t in sizes])
    ax.set_ylabel("time / time(tis)")
    ax.set_title("PolicyLoss forward+backward, CPU float32")
    ax.set_ylim(0, 1.5)
    ax.legend(fontsize=7, ncol=6, loc="upper center")
    fig.tight_layout()
    fig.savefig(out_dir / "bench_is_correction.png", dpi=120)
    return table


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes", default=",".join(f"{b}x{t}" for b, t in SIZES), help="comma-separated BxT list")
    p.add_argument("--repeats", type=int, default=15, help="timed repeats per variant and size")
    p.add_argument("--warmup", type=int, default=2, help="untimed repeats first")
    p.add_argument(
        "--system-malloc", action="store_true", help="do not set the keep-freed-memory malloc variables (see above)"
    )


def measured(args) -> tuple[dict, list]:
    if not args.system_malloc and any(os.environ.get(k) != v for k, v in KEEP_FREED_MEMORY.items()):
        # glibc reads these at process start: re-execute with them set.
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **KEEP_FREED_MEMORY})
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    config = {"sizes": sizes, "repeats": args.repeats, "warmup": args.warmup, "dtype": "float32",
              "threshold": [0.5, 5.0]}  # fmt: skip
    rows = measure(sizes, args.repeats, args.warmup)
    worst = max(r["ratio_to_tis"] for r in rows if r["variant"] == "reinforce_pro")
    print(f"reinforce_pro worst ratio to tis: {worst:.3f} (target <= {TARGET['reinforce_pro']})")
    return config, rows


def main(argv=None) -> int:
    return bench_main(argv, "bench_is_correction", __doc__, options, measured, render)


if __name__ == "__main__":
    sys.exit(main())
