"""How far each arm's policy moves per staleness window, read from a study's JSON (exploratory, no new run).

    python -m studies.drift_reading studies/results/is_long_confirmation.json   # writes <name>_movement.{json,md}

Under `staleK` every step samples with the policy of K updates before, so the mismatch a step logs
(`rollout/logprob_abs_diff_mean`: mean |old - rollout log-prob| over the trained tokens) is how far the trained
policy moved over its last K updates, measured on the tokens it sampled. The arms of a seed start from one warm
start with the same prompts, so a paired difference in that movement is a difference in how far each
correction lets an update go. This reads it per arm in windows of steps (the first, before any run of the first
confirmation had collapsed; then longer), paired by seed against one design, over every seed and over the seeds
where neither arm collapsed (study_stats.collapse_kinds), with the seed-by-seed direction and the exact
sign-flip test. It is a reading of runs already made: it says which arms move further, not why.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from benchmarks.common import write_result
from studies.study_stats import collapse_kinds, direction

ROOT = Path(__file__).resolve().parent.parent

KEY = "rollout/logprob_abs_diff_mean"
WINDOWS = ((1, 10), (1, 20), (1, 101))  # steps [first, last): the first ten, the first twenty, the whole run
DESIGN = "reinforce_pro"


def window_drift(run: dict, first: int, last: int) -> float | None:
    """Mean of the run's logged mismatch over steps [first, last) (its series keeps every `series_step_every`-th
    step from step 1); None where the window holds no finite value."""
    every = run["series_step_every"]
    found = [v for i, v in enumerate(run["series"][KEY]) if first <= 1 + i * every < last and math.isfinite(v)]
    return statistics.fmean(found) if found else None


def collapsed(run: dict) -> bool:
    return bool(collapse_kinds(run["rewards"], run["grad_norms"]))


def arm_rows(runs: list[dict], regime: str) -> list[dict]:
    """Per arm of `regime`: its seeds, how many collapsed, and the median over seeds of each window's drift."""
    rows = []
    for arm in sorted({r["correction"] for r in runs if r["regime"] == regime}):
        sel = [r for r in runs if (r["regime"], r["correction"]) == (regime, arm)]
        medians = []
        for first, last in WINDOWS:
            found = [d for d in (window_drift(r, first, last) for r in sel) if d is not None]
            medians.append(statistics.median(found) if found else None)
        rows.append({"arm": arm, "seeds": len(sel), "collapsed": sum(map(collapsed, sel)), "median_drift": medians})
    return sorted(rows, key=lambda r: -(r["median_drift"][0] or 0.0))


def paired_rows(runs: list[dict], regime: str, design: str = DESIGN) -> list[dict]:
    """`design` against every other arm of `regime`, per window: how many seeds it moved further at, the exact
    sign-flip p of the differences and the median ratio, over all paired seeds and over those where neither
    arm collapsed."""
    by = {(r["correction"], r["seed"]): r for r in runs if r["regime"] == regime}
    rows = []
    for other in sorted({a for a, _ in by} - {design}):
        seeds = sorted(s for a, s in by if a == design and (other, s) in by)
        calm = [s for s in seeds if not collapsed(by[design, s]) and not collapsed(by[other, s])]
        for label, chosen in (("all", seeds), ("neither collapsed", calm)):
            for first, last in WINDOWS:
                pairs = [(window_drift(by[design, s], first, last), window_drift(by[other, s], first, last))
                         for s in chosen]  # fmt: skip
                pairs = [(a, b) for a, b in pairs if a is not None and b]
                if len(pairs) < 2:
                    continue
                side = direction([a - b for a, b in pairs])
                rows.append({"other": other, "seeds": label, "n": len(pairs), "window": [first, last],
                             "higher": side.higher, "lower": side.lower, "p_sign_flip": side.p_sign_flip,
                             "median_ratio": statistics.median(a / b for a, b in pairs)})  # fmt: skip
    return rows


def render(result: dict) -> str:
    regime, design = result["regime"], result["design"]
    spans = [f"steps {a}-{b - 1}" for a, b in WINDOWS]
    lines = [f"How far each arm's policy moved per staleness window ({regime}): median over seeds of the mean "
             f"`{KEY}`, by window (exploratory, from the study's JSON).", "",
             f"| arm | seeds | collapsed | {' | '.join(spans)} |", "|---|---|---|" + "---|" * len(spans)]  # fmt: skip
    for r in result["arms"]:
        cells = " | ".join(f"{m:.4f}" if m is not None else "-" for m in r["median_drift"])
        lines.append(f"| {r['arm']} | {r['seeds']} | {r['collapsed']} | {cells} |")
    lines += ["", f"`{design}` against each arm, paired by seed: seeds where `{design}`'s policy moved further / "
              "less far, the exact sign-flip p (unadjusted) and the median ratio of the two movements:", "",
              "| other | seeds | window | n | further / less | sign-flip p | median ratio |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in result["paired"]:
        first, last = r["window"]
        lines.append(f"| {r['other']} | {r['seeds']} | steps {first}-{last - 1} | {r['n']} | {r['higher']} / "
                     f"{r['lower']} | {r['p_sign_flip']:.4f} | {r['median_ratio']:.2f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("study", type=Path, help="a study's JSON (is_long_study.py's)")
    p.add_argument("--regime", default="stale4")
    p.add_argument("--design", default=DESIGN)
    args = p.parse_args(argv)
    runs = json.loads(args.study.read_text())["results"]["runs"]
    result = {"regime": args.regime, "design": args.design, "arms": arm_rows(runs, args.regime),
              "paired": paired_rows(runs, args.regime, args.design)}  # fmt: skip
    name = f"{args.study.stem}_movement"
    config = {"study": args.study.name, "key": KEY, "windows": WINDOWS}
    write_result(name, config, result, args.study.parent)
    text = render(result)
    (args.study.parent / f"{name}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
