"""What an fp32 LM head on both sides (`--fp32_lm_head`) does to the engine/trainer gap of a bf16 run, and what it
costs a step: the main job with a bf16 trainer and a bf16 engine, without and with it, one run after the other in
one invocation; the main job as it ships (fp32 trainer, bf16 engine) beside them for reference.

Runs on: CPU (the embedded default: Ray, vLLM's CPU build, DeepSpeed).
Takes:   ~5 minutes on 2 cores with the defaults (three runs of 60 steps, each with its warm start).

    python -m benchmarks.bench_fp32_head                   # measure, write JSON, render the table
    python -m benchmarks.bench_fp32_head --render FILE     # re-render from a JSON

The gap is `rollout/logprob_abs_diff_*`: |trainer's old log-prob - engine's sampled log-prob| over the step's
response tokens, before the step's update (both sides hold the same weights). Step 1 is the `[agreement]` line's
number; the means run over every step after SKIP. Step times are medians over the same steps.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.common import arms_main, run_cli

BASE = ["--auto_checkpoint_minutes", "0"]
ARMS = {
    "bf16 trainer, bf16 engine": ["--param_dtype", "bf16"],
    "bf16 trainer, bf16 engine, --fp32_lm_head": ["--param_dtype", "bf16", "--fp32_lm_head"],
    "fp32 trainer, bf16 engine (the main job)": [],
}
SKIP = 5  # start-up steps left out of the medians


def run_arm(name: str, steps: int, seed: int, workdir: Path) -> dict:
    folder = workdir / f"arm{list(ARMS).index(name)}"
    rows, _ = run_cli([*BASE, "--seed", str(seed), "--max_samples", str(32 * steps), *ARMS[name]], folder)
    kept = [r for r in rows if r.get("step", 0) > SKIP]
    gap = {k: [r[f"rollout/logprob_abs_diff_{k}"] for r in rows] for k in ("mean", "p99", "max")}
    return {
        "arm": name, "steps": len(rows), "step1": {k: v[0] for k, v in gap.items()},
        "mean_over_steps": {k: statistics.fmean(v[SKIP:]) for k, v in gap.items()},
        "median_step_s": statistics.median(r["time/step"] for r in kept),
        "median_s": {p: statistics.median(r[f"time/{p}"] for r in kept) for p in ("generate", "train")},
        "reward_last10": statistics.fmean(r["rollout/reward_mean"] for r in rows[-10:]),
    }  # fmt: skip


def render(payload: dict, out_dir: Path) -> str:
    lines = [
        "| arm | step 1 gap: mean, p99, max | mean gap over steps: mean, p99, max | median step (s) | "
        "generate, train (s) |",
        "|---|---|---|---|---|",
    ]
    for r in payload["results"]["arms"]:
        s1, ov = r["step1"], r["mean_over_steps"]
        lines.append(
            f"| {r['arm']} | {s1['mean']:.1e}, {s1['p99']:.1e}, {s1['max']:.1e} | {ov['mean']:.1e}, {ov['p99']:.1e}, "
            f"{ov['max']:.1e} | {r['median_step_s']:.3f} | {r['median_s']['generate']:.3f}, "
            f"{r['median_s']['train']:.3f} |"
        )
    cfg = payload["config"]
    where = f"{payload['machine'].get('cpu', '?')}, commit {payload['commit'][:9]}, {payload['created']}"
    lines += ["", f"_{where}; {cfg['steps']} steps, seed {cfg['seed']}, first {SKIP} steps left out of the means "
              "and medians._"]  # fmt: skip
    text = "\n".join(lines)
    (out_dir / "bench_fp32_head.md").write_text(text + "\n")
    return text


def main(argv=None) -> int:
    return arms_main(argv, "bench_fp32_head", __doc__, ARMS, run_arm, render, 60, {"base": BASE, "skip": SKIP})


if __name__ == "__main__":
    raise SystemExit(main())
