"""Synchronous against asynchronous training (--async_train) on the embedded default.

Runs on: CPU (the embedded default: tiny Qwen2, bf16 vLLM CPU engine, fp32 DeepSpeed policy).
Takes:   ~2 minutes per run on 2 cores at 200 steps; 4 conditions x 3 seeds = 12 runs, one after
         the other in one process (one local Ray cluster, fresh actors per run).

    python -m benchmarks.bench_async                   # measure, write JSON, render table + plot
    python -m benchmarks.bench_async --render FILE     # re-render from a JSON

Per run: samples/s and the median phase times over the steps after `--warmup_steps`, the staleness and
wait metrics, and the reward curve against the training wall clock (the sum of time/step: start-up and the
supervised warm start are the same for every condition and left out). Targets: async samples/s
>= 1.5x sync; the final reward (mean of the last `--final_window` steps) within the seed spread of sync's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import reinforce_pro  # noqa: F401  (before ray: keeps a local cluster on loopback, see ray_env.py)
from benchmarks.common import (
    bench_main,
    new_figure,
    save_figure,
    scratch_dir,
)

CONDITIONS = {
    "sync": [],
    "async_q1": ["--async_train", "--async_queue_size", "1"],
    "async_q2": ["--async_train", "--async_queue_size", "2"],
    "async_q1_partial": [
        "--async_train",
        "--async_queue_size",
        "1",
        "--partial_rollout",
        "--partial_rollout_chunk",
        "2",
    ],
}
PHASES = ["generate", "make_experience", "train", "weight_sync", "step"]
TARGET_SPEEDUP = 1.5


def one_run(flags: list[str], seed: int, steps: int) -> list[dict]:
    from reinforce_pro.cli.train_ppo_ray import parse
    from reinforce_pro.run.driver import build_and_fit
    from reinforce_pro.run.prepare import prepare

    with scratch_dir("bench_async_") as run_dir:
        _, cfg = parse(["--save_path", str(run_dir), "--max_samples", str(32 * steps), "--seed", str(seed), *flags])
        return build_and_fit(cfg, prepare(cfg))


def summarise(history: list[dict], warmup: int, final_window: int) -> dict:
    measured = history[warmup:]
    wall, curve = 0.0, []
    for h in history:
        wall += h["time/step"]
        curve.append([wall, h["rollout/reward_mean"]])
    out = {
        "steps": len(history),
        "samples_per_s": statistics.median(h["rollout/num_samples"] / h["time/step"] for h in measured),
        "median_seconds": {p: statistics.median(h[f"time/{p}"] for h in measured) for p in PHASES},
        "train_wall_s": wall,
        "final_reward": statistics.mean(h["rollout/reward_mean"] for h in history[-final_window:]),
        "staleness_mean": statistics.mean(h["async/staleness_mean"] for h in measured),
        "is_vllm_kl_mean": statistics.mean(abs(h.get("is/vllm_kl", 0.0)) for h in measured),
        "logprob_abs_diff_mean": statistics.mean(h["rollout/logprob_abs_diff_mean"] for h in measured),
        "curve": curve,  # [training wall seconds, reward] per step
    }
    for key in ("async/trainer_wait_s", "async/producer_wait_s", "async/overlap_frac", "async/partial_mixed_rows"):
        if key in measured[0]:
            out[key.split("/")[1]] = statistics.median(h[key] for h in measured)
    return out


def measure(conditions: list[str], seeds: list[int], steps: int, warmup: int, final_window: int) -> dict:
    runs = {c: {} for c in conditions}
    for seed in seeds:
        for c in conditions:  # interleaved: a drift in the host's speed hits every condition alike
            print(f"[bench_async] {c} seed {seed}", flush=True)
            runs[c][str(seed)] = summarise(one_run(CONDITIONS[c], seed, steps), warmup, final_window)
    return {"runs": runs, "summary": summary_table(runs)}


def summary_table(runs: dict) -> dict:
    base = statistics.mean(r["samples_per_s"] for r in runs["sync"].values()) if "sync" in runs else None
    out = {}
    for c, by_seed in runs.items():
        rs = list(by_seed.values())
        finals = [r["final_reward"] for r in rs]
        sps = statistics.mean(r["samples_per_s"] for r in rs)
        out[c] = {
            "samples_per_s": sps,
            "speedup_vs_sync": sps / base if base else None,
            "final_reward_mean": statistics.mean(finals),
            "final_reward_min": min(finals),
            "final_reward_max": max(finals),
            "train_wall_s": statistics.mean(r["train_wall_s"] for r in rs),
            "staleness_mean": statistics.mean(r["staleness_mean"] for r in rs),
            "logprob_abs_diff_mean": statistics.mean(r["logprob_abs_diff_mean"] for r in rs),
            "median_seconds": {p: statistics.mean(r["median_seconds"][p] for r in rs) for p in PHASES},
            "overlap_frac": statistics.mean(r.get("overlap_frac", 0.0) for r in rs),
            "partial_mixed_rows": statistics.mean(r.get("partial_mixed_rows", 0.0) for r in rs),
        }
    return out


def render(payload: dict, out_dir: Path) -> str:
    s, cfg, m = payload["results"]["summary"], payload["config"], payload["machine"]
    lines = [
        "| condition | samples/s | vs sync | final reward (mean, min-max over seeds) | train wall s | staleness "
        "| overlap | mixed rows | generate | make_exp | train | sync | step |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c, r in s.items():
        ms = r["median_seconds"]
        speed = f"{r['speedup_vs_sync']:.2f}x" if r["speedup_vs_sync"] else ""
        lines.append(
            f"| {c} | {r['samples_per_s']:.0f} | {speed} | {r['final_reward_mean']:.3f} "
            f"({r['final_reward_min']:.3f}-{r['final_reward_max']:.3f}) | {r['train_wall_s']:.0f} "
            f"| {r['staleness_mean']:.2f} | {r['overlap_frac']:.2f} | {r.get('partial_mixed_rows', 0.0):.2f} "
            f"| {ms['generate']:.3f} "
            f"| {ms['make_experience']:.3f} | {ms['train']:.3f} | {ms['weight_sync']:.3f} | {ms['step']:.3f} |"
        )
    lines += [
        "",
        f"Embedded default, {cfg['steps']} RL steps per run, seeds {cfg['seeds']}; medians over steps after "
        f"{cfg['warmup_steps']}, final reward = mean of the last {cfg['final_window']} steps. Target: async "
        f">= {TARGET_SPEEDUP}x sync samples/s. {m['cpu']} ({m['cpu_count']} cores), torch {m['torch']}, "
        f"commit {payload['commit'][:12]}.",
    ]
    table = "\n".join(lines)
    (out_dir / "bench_async.md").write_text(table + "\n")
    plot(payload, out_dir / "bench_async.png")
    return table


def plot(payload: dict, path: Path, window: int = 20) -> None:
    fig, ax = new_figure((7, 4))
    for i, (c, by_seed) in enumerate(payload["results"]["runs"].items()):
        for j, r in enumerate(by_seed.values()):
            wall = [p[0] for p in r["curve"]]
            reward = [p[1] for p in r["curve"]]
            smooth = [statistics.mean(reward[max(0, k - window + 1) : k + 1]) for k in range(len(reward))]
            ax.plot(wall, smooth, color=f"C{i}", alpha=0.8, label=c if j == 0 else None)
    ax.set_xlabel("training wall clock (s, sum of time/step)")
    ax.set_ylabel(f"reward (mean of last {window} steps)")
    ax.set_title("embedded default: reward against wall clock, one line per seed")
    save_figure(fig, ax, path)


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=300, help="RL steps per run")
    p.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    p.add_argument("--conditions", nargs="+", default=list(CONDITIONS), choices=list(CONDITIONS))
    p.add_argument("--warmup_steps", type=int, default=5, help="leading steps left out of the timing statistics")
    p.add_argument("--final_window", type=int, default=50, help="steps averaged for the final reward")


def measured(args) -> tuple[dict, dict]:
    config = {k: getattr(args, k) for k in ("steps", "seeds", "conditions", "warmup_steps", "final_window")}
    results = measure(args.conditions, args.seeds, args.steps, args.warmup_steps, args.final_window)
    return {**config, "job": "embedded default of train_ppo_ray"}, results


def main(argv=None) -> int:
    return bench_main(argv, "bench_async", __doc__, options, measured, render)


if __name__ == "__main__":
    sys.exit(main())
