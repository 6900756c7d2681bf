"""Self-play curriculum study: the README's `--absolute_zero` command at several seeds, to its end.

    python -m studies.selfplay_study --seeds 1-5                 # 5 runs of 300 steps (~6-10 min each on 2 cores)
    python -m studies.selfplay_study --seeds 1-5 --arm no-repetition-penalty   # the same without the remedy
    python -m studies.selfplay_study --seeds 6-8                 # more seeds: appended to the same JSON
    python -m studies.selfplay_study --render studies/results/selfplay_study.json

Each run is `python -m reinforce_pro.cli.train_ppo_ray --absolute_zero --seed S` (the embedded default:
tiny model, open-ended arithmetic task, held-out ladder every 25 steps and before the first). From its
metrics.jsonl the study keeps, per step, the learnable ratio, the proposer's reward, the solver's score and
the proposals' difficulty and diversity, and the ladder's accuracy per level at each evaluation.

Results accumulate in one JSON (machine, commit, configuration, one record per run); a seed already there
with the same step count is not run again, so the study can be stopped and continued in another sitting.
Rendered from the JSON: the issue's criteria per seed (learnable ratio over the last third, the longest
stretch below 0.2), the ladder's accuracy before and after with a 95% bootstrap interval over seeds, and plots.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import git_commit
from reinforce_pro.selfplay.builtin_tasks import LADDER_LEVELS
from studies.runner import study_main
from studies.study_stats import longest_run, paired_bootstrap, thirds

NAME = "selfplay_study"
TASK = "arithmetic"
SERIES = {  # what the study keeps of each step: short name -> metrics.jsonl key
    "learnable": "unified_filter/learnable_ratio",
    "proposer_reward": "proposer/reward_mean",
    "solver_score": f"selfplay/{TASK}/score_completion_mean",
    "valid": f"selfplay/{TASK}/valid_ratio",
    "unique": f"selfplay/{TASK}/proposal_unique_frac",
    "entropy": f"selfplay/{TASK}/proposal_entropy",
    "digits": f"selfplay/{TASK}/proposed_digits_mean",
    "terms": f"selfplay/{TASK}/proposed_terms_mean",
    "sub": f"selfplay/{TASK}/proposed_sub_mean",
    "mul": f"selfplay/{TASK}/proposed_mul_mean",
    "answer_digits": f"selfplay/{TASK}/proposed_answer_digits_mean",
    "learnable_digits": f"selfplay/{TASK}/learnable_digits_mean",
    "learnable_answer_digits": f"selfplay/{TASK}/learnable_answer_digits_mean",
}
ARMS = {  # name -> train_ppo_ray flags on top of the README command
    "default": [],
    "no-repetition-penalty": [
        "--proposer_repetition_penalty",
        "0",
    ],  # the embedded default before the repetition penalty
    "reference-buffer": ["--selfplay_reference_buffer", "64"],
    "difficulty-reward": ["--proposer_reward", "difficulty"],  # Absolute Zero's 1 - solve rate for learnable ones
    # Absolute Zero's whole proposer: references from past learnable questions and the 1 - solve rate reward
    "buffer-difficulty": ["--selfplay_reference_buffer", "64", "--proposer_reward", "difficulty"],
}
# Arms that differ in code, not flags: recorded runs of the README command at another commit. Not offered by
# --arm (at HEAD it would run the default under their name); the table header prints each run's commit.
CODE_ARMS = {
    "copies": "none; the warm start of 43308d8, which added copies (4893+0=4893) and was reverted",
}
LOW_RATIO, LOW_STRETCH = 0.2, 20  # the issue: no seed below 0.2 for more than 20 consecutive steps
TARGET_LAST_THIRD = 0.4  # ... and a mean learnable ratio >= 0.4 over the last third


def run_seed(seed: int, steps: int, arm: str) -> dict:
    """One README run at `seed`; its per-step series and ladder evaluations."""
    with tempfile.TemporaryDirectory(prefix=f"selfplay_study_{seed}_") as tmp:
        save = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "reinforce_pro.cli.train_ppo_ray", "--absolute_zero", "--seed", str(seed),
               "--max_samples", str(16 * steps), "--save_path", str(save), *ARMS[arm]]  # fmt: skip
        start = time.perf_counter()
        with open(Path(tmp) / "log.txt", "w") as log:
            code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
        wall = time.perf_counter() - start
        if code != 0:
            tail = (Path(tmp) / "log.txt").read_text()[-3000:]
            raise RuntimeError(f"seed {seed}: exit {code}\n{tail}")
        rows = [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines() if line.strip()]
    series = {name: [] for name in SERIES}
    ladder: dict[str, list[list[float]]] = {level: [] for level in LADDER_LEVELS}  # level -> [[step, accuracy]]
    for row in rows:
        step = row.get("step", 0)
        for key, value in row.items():
            if key.startswith("eval/ladder/") and key.endswith("/accuracy"):
                ladder[key.split("/")[2]].append([step, value])
        if step > 0 and SERIES["learnable"] in row:
            for name, key in SERIES.items():
                series[name].append(row.get(key))
    return {"arm": arm, "seed": seed, "steps": steps, "commit": git_commit(), "wall_s": round(wall, 1),
            "series": series, "ladder": ladder}  # fmt: skip


def run_study(seeds: list[int], steps: int, arm: str, runs: list[dict], save) -> list[dict]:
    done = {(r["arm"], r["seed"], r["steps"]) for r in runs}
    for seed in seeds:
        if (arm, seed, steps) in done:
            print(f"[study] {arm} seed {seed}: already measured, skipped", flush=True)
            continue
        print(f"[study] {arm} seed {seed}: {steps} steps ...", flush=True)
        record = run_seed(seed, steps, arm)
        runs = [*runs, record]
        save(runs)
        s = summarise(record)
        print(f"[study] {arm} seed {seed}: {record['wall_s']:.0f} s, learnable ratio last third {s['last_third']:.3f}, "
              f"longest stretch below {LOW_RATIO}: {s['low_stretch']} steps", flush=True)  # fmt: skip
    return runs


def summarise(run: dict) -> dict:
    ratio = run["series"]["learnable"]
    by_third = thirds(ratio)
    return {
        "last_third": by_third[-1] if by_third else float("nan"),
        "thirds": by_third,
        "low_stretch": longest_run(ratio, lambda r: r < LOW_RATIO),
        "ladder_first": {level: points[0][1] for level, points in run["ladder"].items()},
        "ladder_last": {level: points[-1][1] for level, points in run["ladder"].items()},
    }


def ladder_gains(runs: list[dict]) -> list[dict]:
    """Per level: the accuracy before RL (the warm start's, step 0) and at the end, and the paired gain
    over seeds with its 95% bootstrap interval."""
    summaries = [summarise(r) for r in runs]
    rows = []
    for level in _levels(runs):
        first = [s["ladder_first"][level] for s in summaries]
        last = [s["ladder_last"][level] for s in summaries]
        gain, low, high = paired_bootstrap([b - a for a, b in zip(first, last, strict=True)])
        rows.append({"level": level, "first": statistics.fmean(first), "last": statistics.fmean(last),
                     "gain": gain, "low": low, "high": high})  # fmt: skip
    return rows


def _levels(runs: list[dict]) -> list[str]:
    """The ladder's levels in the task's order (easy to hard per operation)."""
    present = set(runs[0]["ladder"]) if runs else set()
    return [level for level in LADDER_LEVELS if level in present] + sorted(present - set(LADDER_LEVELS))


def render(payload: dict, out_dir: Path) -> str:
    every = payload["results"]["runs"]
    arms = [a for a in (*ARMS, *CODE_ARMS) if any(r["arm"] == a for r in every)]
    lines = [f"# Self-play study: `--absolute_zero` to its end (commit {payload['commit'][:12]})", ""]
    for arm in arms:
        runs = sorted((r for r in every if r["arm"] == arm), key=lambda r: r["seed"])
        flags = CODE_ARMS[arm] if arm in CODE_ARMS else " ".join(ARMS[arm]) or "none"
        commits = ", ".join(sorted({r.get("commit", "unrecorded")[:12] for r in runs}))
        lines += [f"## {arm} ({len(runs)} seeds at commit {commits}; flags on top of the README command: {flags})", ""]
        lines += _arm_section(runs, payload, out_dir / f"{NAME}_{arm}.png")
    if len(arms) > 1:
        lines += _comparison(every, arms)
    text = "\n".join(lines) + "\n"
    (out_dir / f"{NAME}.md").write_text(text)
    return text


def _comparison(every: list[dict], arms: list[str]) -> list[str]:
    """Each arm against `default` at the seeds both ran: paired differences with 95% bootstrap intervals."""
    lines = ["## Arms compared with `default` (paired by seed)", "",
             "| arm | seeds | learnable ratio, last third | unique proposals, last third | ladder mean, step 0 "
             "| ladder mean, end |", "|---|---|---|---|---|---|"]  # fmt: skip
    by = {(r["arm"], r["seed"]): r for r in every}
    for arm in arms[1:]:
        seeds = sorted(s for a, s in by if a == arm and ("default", s) in by)
        cells = []
        last_thirds = (lambda r: thirds(r["series"]["learnable"])[-1], lambda r: thirds(r["series"]["unique"])[-1])
        for measure in (*last_thirds, _ladder_start, _ladder_end):
            diffs = [measure(by[("default", s)]) - measure(by[(arm, s)]) for s in seeds]
            mean, low, high = paired_bootstrap(diffs) if diffs else (float("nan"),) * 3
            cells.append(f"default {mean:+.3f} [{low:+.3f}, {high:+.3f}]")
        lines.append(f"| {arm} | {len(seeds)} | " + " | ".join(cells) + " |")
    return ["", *lines]


def _ladder_start(run: dict) -> float:
    return statistics.fmean(points[0][1] for points in run["ladder"].values())


def _ladder_end(run: dict) -> float:
    return statistics.fmean(points[-1][1] for points in run["ladder"].values())


def _arm_section(runs: list[dict], payload: dict, plot_path: Path) -> list[str]:
    warm = set(payload["config"].get("warm_start_levels", []))
    lines = [
        "| seed | steps | wall (s) | learnable ratio by thirds | last third (>= 0.4) | longest < 0.2 (<= 20) |",
        "|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in runs:
        s = summarise(r)
        thirds = " / ".join(f"{t:.3f}" for t in s["thirds"])
        lines.append(f"| {r['seed']} | {r['steps']} | {r['wall_s']:.0f} | {thirds} | {s['last_third']:.3f} | "
                     f"{s['low_stretch']} |")  # fmt: skip
    if runs:
        lasts = [summarise(r)["last_third"] for r in runs]
        mean = statistics.fmean(lasts)
        lines += [
            "",
            f"Mean learnable ratio over the last third: {mean:.3f} (min {min(lasts):.3f}, max {max(lasts):.3f}).",
        ]
        header = "| ladder level | warm start covers | accuracy at step 0 | at the end | gain [95% CI over seeds] |"
        lines += ["", header, "|---|---|---|---|---|"]
        for row in ladder_gains(runs):
            covered = "yes" if row["level"] in warm else "no"
            lines.append(f"| {row['level']} | {covered} | {row['first']:.3f} | {row['last']:.3f} | "
                         f"{row['gain']:+.3f} [{row['low']:+.3f}, {row['high']:+.3f}] |")  # fmt: skip
        lines += ["", _difficulty_table(runs)]
        _plot(runs, plot_path)
        lines += ["", f"![self-play study]({plot_path.name})", ""]
    return lines


def _difficulty_table(runs: list[dict]) -> str:
    """Means over seeds of the proposals' difficulty and diversity, by thirds of the run."""
    names = ["learnable", "solver_score", "proposer_reward", "digits", "terms", "sub", "mul", "answer_digits",
             "unique", "entropy"]  # fmt: skip
    lines = ["| thirds | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for i, label in enumerate(("first", "second", "last")):
        cells = []
        for name in names:
            values = [by_third[i] for r in runs if (by_third := thirds(r["series"][name]))]
            cells.append(f"{statistics.fmean(values):.3f}" if values else "-")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for r in runs:
        ratio = r["series"]["learnable"]
        smooth = [statistics.fmean(ratio[max(0, i - 9) : i + 1]) for i in range(len(ratio))]
        axes[0].plot(range(1, len(smooth) + 1), smooth, label=f"seed {r['seed']}", lw=1)
        unique = [v if v is not None else float("nan") for v in r["series"]["unique"]]
        smooth_u = [statistics.fmean(unique[max(0, i - 9) : i + 1]) for i in range(len(unique))]
        axes[1].plot(range(1, len(smooth_u) + 1), smooth_u, lw=1)
    axes[0].axhline(LOW_RATIO, color="grey", ls=":")
    axes[0].set(title="learnable ratio (10-step mean)", xlabel="step", ylim=(0, 1))
    axes[0].legend(fontsize=7)
    axes[1].set(title="unique proposals / valid (10-step mean)", xlabel="step", ylim=(0, 1))
    colors = plt.get_cmap("tab20").colors
    for k, level in enumerate(_levels(runs)):
        steps = [p[0] for p in runs[0]["ladder"][level]]
        acc = [statistics.fmean(r["ladder"][level][k][1] for r in runs) for k in range(len(steps))]
        axes[2].plot(steps, acc, marker=".", label=level, color=colors[k % len(colors)])
    axes[2].set(title=f"held-out ladder: greedy accuracy (mean of {len(runs)} seeds)", xlabel="step", ylim=(0, 1))
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args, study) -> None:
    from reinforce_pro.selfplay.builtin_tasks import ArithmeticTask

    config = {"command": "train_ppo_ray --absolute_zero --seed S", "arms": ARMS,
              "warm_start_levels": list(ArithmeticTask.warm_start_levels)}  # fmt: skip
    # after each run, atomically: a stop mid-study keeps every finished run
    run_study(args.seeds, args.steps, args.arm, study.stored(), lambda current: study.save(current, config))


def main(argv=None) -> int:
    options = lambda p: p.add_argument(  # noqa: E731
        "--arm", choices=list(ARMS), default="default", help="which variant of the command to run"
    )
    return study_main(argv, __doc__, NAME, run, render, options=options, seeds="1-5", steps=300,
                      steps_help="RL steps per run (the README's 300)")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
