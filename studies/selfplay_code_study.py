"""Absolute Zero's code task on SmolLM2-135M-Instruct: the recipe at several seeds, to its end.

    python -m studies.selfplay_code_study --seeds 1-2 --steps 30     # ~35 min per run on 2 cores
    python -m studies.selfplay_code_study --render studies/results/selfplay_code_study.json

Each run is `examples/scripts/train_absolute_zero_code.sh` with SEED and STEPS (the model is prepared once
under ~/.cache/reinforce_pro). From its metrics.jsonl the study keeps, per step, the valid-program rate, the
learnable ratio, the proposer's reward, the solver's score on the questions it was given and the proposals'
size, and the held-out ladder's greedy accuracy per program kind at each evaluation (before training and
every EVAL_STEPS steps).

Results accumulate in one JSON (machine, commit, configuration, one record per run); a seed already there
with the same step count is not run again, so the study can be stopped and continued in another sitting.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from reinforce_pro.selfplay.code_task import CODE_LADDER
from studies.runner import study_main
from studies.study_stats import paired_bootstrap, thirds

NAME = "selfplay_code_study"
RECIPE = Path(__file__).resolve().parent.parent / "examples" / "scripts" / "train_absolute_zero_code.sh"
TASK = "code_output"
SERIES = {  # short name -> metrics.jsonl key, kept for every step
    "valid": f"selfplay/{TASK}/valid_ratio",
    "first_round_learnable": f"selfplay/{TASK}/first_round_learnable_ratio",
    "learnable": "unified_filter/learnable_ratio",
    "proposer_reward": "proposer/reward_mean",
    "solver_score": f"selfplay/{TASK}/score_completion_mean",
    "solver_format": f"selfplay/{TASK}/format_mean",
    "unique": f"selfplay/{TASK}/proposal_unique_frac",
    "lines": f"selfplay/{TASK}/proposed_lines_mean",
    "loops": f"selfplay/{TASK}/proposed_loops_mean",
    "answer_chars": f"selfplay/{TASK}/proposed_answer_chars_mean",
    "step_s": "time/step",
}


def run_seed(seed: int, steps: int) -> dict:
    """One recipe run; its per-step series and ladder evaluations."""
    with tempfile.TemporaryDirectory(prefix=f"selfplay_code_{seed}_") as tmp:
        save = Path(tmp) / "run"
        env = {**os.environ, "SEED": str(seed), "STEPS": str(steps), "OUT": str(save)}
        start = time.perf_counter()
        with open(Path(tmp) / "log.txt", "w") as log:
            code = subprocess.run(["bash", str(RECIPE)], env=env, stdout=log, stderr=subprocess.STDOUT).returncode
        wall = time.perf_counter() - start
        if code != 0:
            raise RuntimeError(f"seed {seed}: exit {code}\n{(Path(tmp) / 'log.txt').read_text()[-3000:]}")
        rows = [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines() if line.strip()]
    series = {name: [] for name in SERIES}
    ladder: dict[str, list[list[float]]] = {level: [] for level in CODE_LADDER}  # level -> [[step, accuracy]]
    for row in rows:
        step = row.get("step", 0)
        for level in CODE_LADDER:
            if (key := f"eval/ladder/{level}/accuracy") in row:
                ladder[level].append([step, row[key]])
        if step > 0 and SERIES["learnable"] in row:
            for name, key in SERIES.items():
                series[name].append(row.get(key))
    return {"seed": seed, "steps": steps, "wall_s": round(wall, 1), "series": series, "ladder": ladder}


def run_study(seeds: list[int], steps: int, runs: list[dict], save) -> list[dict]:
    done = {(r["seed"], r["steps"]) for r in runs}
    for seed in seeds:
        if (seed, steps) in done:
            print(f"[code study] seed {seed}: already measured, skipped", flush=True)
            continue
        print(f"[code study] seed {seed}: {steps} steps ...", flush=True)
        record = run_seed(seed, steps)
        runs = [*runs, record]
        save(runs)
        valid = thirds(record["series"]["valid"])
        print(f"[code study] seed {seed}: {record['wall_s']:.0f} s, valid-program rate by thirds "
              + " / ".join(f"{v:.3f}" for v in valid), flush=True)  # fmt: skip
    return runs


def ladder_mean(run: dict, at: int) -> float:
    """Mean accuracy over the ladder's kinds at evaluation `at` (0: before training, -1: the last)."""
    return statistics.fmean(points[at][1] for points in run["ladder"].values())


def render(payload: dict, out_dir: Path) -> str:
    runs = sorted(payload["results"]["runs"], key=lambda r: r["seed"])
    lines = [f"# Absolute Zero's code task on SmolLM2-135M-Instruct (commit {payload['commit'][:12]})", "",
             f"Recipe: `{payload['config']['recipe']}`; {len(runs)} seeds.", "",
             "| seed | steps | wall (s) | median step (s) | valid-program rate by thirds | learnable ratio by thirds "
             "| solver format by thirds | ladder mean before -> after |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in runs:
        cells = [" / ".join(f"{v:.3f}" for v in thirds(r["series"][name])) or "-"
                 for name in ("valid", "learnable", "solver_format")]  # fmt: skip
        step_s = statistics.median(v for v in r["series"]["step_s"] if v is not None)
        lines.append(f"| {r['seed']} | {r['steps']} | {r['wall_s']:.0f} | {step_s:.1f} | " + " | ".join(cells)
                     + f" | {ladder_mean(r, 0):.3f} -> {ladder_mean(r, -1):.3f} |")  # fmt: skip
    if runs:
        lines += ["", "| ladder kind | accuracy before (mean over seeds) | after | gain [95% CI over seeds] |",
                  "|---|---|---|---|"]  # fmt: skip
        for level in CODE_LADDER:
            first = [r["ladder"][level][0][1] for r in runs]
            last = [r["ladder"][level][-1][1] for r in runs]
            gain, low, high = paired_bootstrap([b - a for a, b in zip(first, last, strict=True)])
            lines.append(f"| {level} | {statistics.fmean(first):.3f} | {statistics.fmean(last):.3f} | "
                         f"{gain:+.3f} [{low:+.3f}, {high:+.3f}] |")  # fmt: skip
        _plot(runs, out_dir / f"{NAME}.png")
        lines += ["", f"![code study]({NAME}.png)"]
    text = "\n".join(lines) + "\n"
    (out_dir / f"{NAME}.md").write_text(text)
    return text


def _plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for r in runs:
        for ax, name in zip(axes[:2], ("valid", "learnable"), strict=True):
            values = [v if v is not None else float("nan") for v in r["series"][name]]
            smooth = [statistics.fmean(values[max(0, i - 4) : i + 1]) for i in range(len(values))]
            ax.plot(range(1, len(smooth) + 1), smooth, lw=1, label=f"seed {r['seed']}")
        steps = [p[0] for p in r["ladder"]["arith"]]
        means = [statistics.fmean(points[k][1] for points in r["ladder"].values()) for k in range(len(steps))]
        axes[2].plot(steps, means, marker=".", label=f"seed {r['seed']}")
    axes[0].set(title="valid-program rate (5-step mean)", xlabel="step", ylim=(0, 1))
    axes[1].set(title="learnable ratio (5-step mean)", xlabel="step", ylim=(0, 1))
    axes[2].set(title="held-out ladder: mean greedy accuracy", xlabel="step", ylim=(0, 1))
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args, study) -> None:
    config = {"recipe": str(RECIPE.relative_to(RECIPE.parents[2])), "model": "smollm2-135m-instruct"}
    # after each run, atomically: a stop mid-study keeps every finished run
    run_study(args.seeds, args.steps, study.stored(), lambda current: study.save(current, config))


def main(argv=None) -> int:
    return study_main(argv, __doc__, NAME, run, render, seeds="1-2", steps=30)


if __name__ == "__main__":
    sys.exit(main())
