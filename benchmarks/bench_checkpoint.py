"""What the default checkpoints cost: the embedded default's step time with no checkpoints and with a checkpoint
after every step, one run after the other in one invocation, and from them what the default cadence
(--auto_checkpoint_minutes 5) adds to a step; plus the checkpoint's size on disk.

Runs on: CPU (the embedded default: Ray, vLLM's CPU build, DeepSpeed).
Takes:   ~3 minutes on 2 cores with the defaults (two runs of 60 steps, no warm start, each engine's start).

    python -m benchmarks.bench_checkpoint                   # measure, write JSON, render the table
    python -m benchmarks.bench_checkpoint --render FILE     # re-render from a JSON

Both runs are the embedded default's command (its preset) with --sft_warmup_steps 0 and the same seed, so they
sample and train alike; `none` passes --auto_checkpoint_minutes 0, `every step` --save_steps 1 (the same save
the clock triggers: DeepSpeed's states of the policy, trainer_state.json, written to a .tmp directory and
renamed). The first 5 steps of each run are left out (start-up). A save's cost is the difference of the two
runs' median step times, read against the mean seconds each `[checkpoint]` line reports; at the default cadence
a run saves once per 300 s of training, so a step pays cost x step time / 300.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from benchmarks.common import arms_main, run_cli

ARMS = {"none": ["--auto_checkpoint_minutes", "0"], "every step": ["--save_steps", "1", "--max_ckpt_num", "2"]}
DEFAULT_INTERVAL_S = 300.0  # --auto_checkpoint_minutes 5
SKIP = 5  # start-up steps left out of the medians


def run_arm(name: str, steps: int, seed: int, workdir: Path) -> dict:
    """One run of the embedded default: its per-step times, each save's reported seconds, a checkpoint's size."""
    run_dir, ckpt = workdir / name.replace(" ", "_"), workdir / f"{name.replace(' ', '_')}_ckpt"
    rows, output = run_cli(["--sft_warmup_steps", "0", "--seed", str(seed), "--max_samples", str(32 * steps),
                            "--ckpt_path", str(ckpt), *ARMS[name]], run_dir)  # fmt: skip
    step_s = [r["time/step"] for r in rows if r.get("step", 0) > SKIP]
    saves = [float(s) for s in re.findall(r"\[checkpoint\] \S+ \(([\d.]+) s", output)]
    newest = sorted(ckpt.glob("global_step*"))
    size = sum(f.stat().st_size for f in newest[-1].rglob("*") if f.is_file()) if newest else 0
    return {"arm": name, "steps": len(rows), "step_s": step_s, "median_step_s": statistics.median(step_s),
            "saves": len(saves), "save_s_mean": statistics.fmean(saves) if saves else None,
            "checkpoint_mb": size / 2**20}  # fmt: skip


def render(payload: dict, out_dir: Path) -> str:
    arms = {r["arm"]: r for r in payload["results"]["arms"]}
    none, every = arms["none"], arms["every step"]
    cost = every["median_step_s"] - none["median_step_s"]
    per_step = max(cost, 0.0) * none["median_step_s"] / DEFAULT_INTERVAL_S
    lines = [
        "| arm | steps | median step (s) | saves | mean save, as reported (s) | checkpoint on disk (MB) |",
        "|---|---|---|---|---|---|",
    ]
    for r in (none, every):
        save = f"{r['save_s_mean']:.3f}" if r["save_s_mean"] is not None else "-"
        lines.append(f"| {r['arm']} | {r['steps']} | {r['median_step_s']:.3f} | {r['saves']} | {save} | "
                     f"{r['checkpoint_mb']:.1f} |")  # fmt: skip
    reading = (
        f"A save costs {cost:+.3f} s of step time (median with a save every step minus without). At the "
        f"default cadence (one save per {DEFAULT_INTERVAL_S:.0f} s of training) a step pays "
        f"{per_step * 1000:.2f} ms on average ({per_step / none['median_step_s']:.2%} of a step)."
    )
    if cost <= 0:
        reading = (
            f"A save costs less than these runs resolve: the median step with a save every step is "
            f"{cost:+.3f} s from the one without; each save took {every['save_s_mean'] or 0:.2f} s as "
            f"reported, so at the default cadence (one save per {DEFAULT_INTERVAL_S:.0f} s of training) "
            "nothing measurable."
        )
    lines += ["", reading, "",
              f"_{payload['machine'].get('cpu', '?')}, commit {payload['commit'][:9]}, {payload['created']}; "
              f"first {SKIP} steps of each run left out._"]  # fmt: skip
    text = "\n".join(lines)
    (out_dir / "bench_checkpoint.md").write_text(text + "\n")
    return text


def main(argv=None) -> int:
    config = {"skip": SKIP, "interval_s": DEFAULT_INTERVAL_S}
    return arms_main(argv, "bench_checkpoint", __doc__, ARMS, run_arm, render, 60, config)


if __name__ == "__main__":
    raise SystemExit(main())
