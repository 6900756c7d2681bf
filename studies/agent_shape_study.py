"""Does an agent written to the OpenAI SDK learn like the same agent written as an AgentInstance? The calculator
agent in both shapes, trained by train_ppo_ray on the embedded default at paired seeds, scored on held-out
additions before and after RL.

Runs on: CPU (the `cpu` extra).
Takes:   ~3 minutes a run on 2 cores alone (start-up, the warm start, `--steps` RL steps, two evaluations).

    python -m studies.agent_shape_study --seeds 1-4            # run (resumable), write JSON, render
    python -m studies.agent_shape_study --render FILE          # re-render from a JSON

The arms: `AgentInstance` (examples/python/agent_calculator.py, --agent_max_turns 4) and `OpenAI SDK`
(examples/python/agent_calculator_openai.py, 4 turns in its own loop): the same task, tool, reward and turn
budget. Everything else is the embedded default (the same warm start per seed, reinforce_baseline,
reinforce_pro, a bf16 engine), with `--steps` RL steps. The endpoint: eval/held_out/score_mean (exact answers,
with or without the tool) over 64 held-out additions x 4 episodes at temperature 0.6, after the last step;
its gain over the evaluation before RL is reported beside it. The comparison is paired by seed: the per-seed
difference SDK - AgentInstance, its 95% t-interval, and equivalence within `--margin` (two one-sided t-tests).
The two shapes do not sample the same tokens at a seed (the endpoint batches requests as they arrive, the
runner by turn), so equal means are the question, not equal runs. Each run records its commit, host and wall
time, and the median seconds of its generate phase; these are learning runs, which may share the cores with
other work: the endpoint's cost is measured alone by benchmarks/bench_agent_endpoint.py.
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

from benchmarks.common import run_provenance
from studies.runner import study_main
from studies.study_stats import direction, paired_test, tost

ROOT = Path(__file__).resolve().parent.parent

NAME = "agent_shape_study"
EXAMPLES = ROOT / "examples" / "python"
ARMS = {
    "AgentInstance": ["--agent_func_path", str(EXAMPLES / "agent_calculator.py"), "--agent_max_turns", "4"],
    "OpenAI SDK": ["--agent_func_path", str(EXAMPLES / "agent_calculator_openai.py")],
}
EVAL_KEY = "eval/held_out/score_mean"
HELD_OUT_SEED = 1234  # the embedded default draws its training additions with seed 42 (data/arithmetic.py)


def held_out(path: Path) -> Path:
    from reinforce_pro.data.arithmetic import arithmetic_records

    path.write_text("".join(json.dumps(r) + "\n" for r in arithmetic_records(64, HELD_OUT_SEED)))
    return path


def run_one(arm: str, seed: int, steps: int, workdir: Path, eval_data: Path, outputs: tuple[Path, ...]) -> dict:
    run_dir = workdir / f"{arm.replace(' ', '_')}_{seed}"
    command = [
        sys.executable, "-m", "reinforce_pro.cli.train_ppo_ray", *ARMS[arm], "--seed", str(seed),
        "--max_samples", str(32 * steps), "--eval_dataset", str(eval_data),
        "--label_key", "label", "--eval_steps", str(steps), "--eval_before_training", "--save_path", str(run_dir),
    ]  # fmt: skip
    start = time.time()
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, env={**os.environ})
    wall = time.time() - start
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if EVAL_KEY in r]
    steps_rows = [r for r in rows if "time/step" in r]
    return {
        "arm": arm, "seed": seed, "steps": len(steps_rows), "before": evals[0][EVAL_KEY], "after": evals[-1][EVAL_KEY],
        "train_score_last20": statistics.fmean(r["rollout/score_mean"] for r in steps_rows[-20:]),
        "generate_s": statistics.median(r["time/generate"] for r in steps_rows), "wall_s": wall,
        "forks": sum(r.get("agent/segment_forks", 0.0) for r in steps_rows),
        "dropped": sum(r.get("agent/dropped_episodes", 0.0) for r in steps_rows),
        **run_provenance(ROOT, ignore=outputs),
    }  # fmt: skip


def analyse(runs: list[dict], margin: float) -> dict:
    by = {(r["arm"], r["seed"]): r for r in runs}
    seeds = sorted({s for a, s in by if (("AgentInstance", s) in by and ("OpenAI SDK", s) in by)})
    diffs = [by[("OpenAI SDK", s)]["after"] - by[("AgentInstance", s)]["after"] for s in seeds]
    out = {"seeds": seeds, "diffs": diffs, "margin": margin}
    if len(diffs) >= 2:
        t, d = paired_test(diffs), direction(diffs)
        out.update(mean=t.mean, low=t.low, high=t.high, sd=t.sd, p_t=t.p_t, lower=d.lower, higher=d.higher,
                   p_sign_flip=d.p_sign_flip)  # fmt: skip
        try:
            out["p_tost"] = tost(diffs, margin)
        except ValueError:
            out["p_tost"] = None
    return out


def render(payload: dict, out_dir: Path) -> str:
    runs, config = payload["results"]["runs"], payload["config"]
    a = analyse(runs, config["margin"])
    by = {(r["arm"], r["seed"]): r for r in runs}
    lines = ["| seed | AgentInstance: before -> after | OpenAI SDK: before -> after | SDK - AgentInstance | "
             "generate s / step (AI / SDK), not alone on the cores |", "|---|---|---|---|---|"]  # fmt: skip
    for s, d in zip(a["seeds"], a["diffs"], strict=True):
        x, y = by[("AgentInstance", s)], by[("OpenAI SDK", s)]
        lines.append(f"| {s} | {x['before']:.3f} -> {x['after']:.3f} | {y['before']:.3f} -> {y['after']:.3f} | "
                     f"{d:+.3f} | {x['generate_s']:.2f} / {y['generate_s']:.2f} |")  # fmt: skip
    lines.append("")
    if "mean" in a:
        verdict = ("equivalent within the margin" if a["p_tost"] is not None and a["p_tost"] < 0.05 else
                   "not shown equivalent within the margin")  # fmt: skip
        tost_text = "n/a" if a["p_tost"] is None else f"{a['p_tost']:.3f}"
        lines.append(
            f"Held-out score after RL, SDK - AgentInstance over {len(a['seeds'])} paired seeds: {a['mean']:+.3f} "
            f"[{a['low']:+.3f}, {a['high']:+.3f}] (95% t-interval; sd {a['sd']:.3f}); SDK lower at {a['lower']}, "
            f"higher at {a['higher']} seeds (exact sign-flip p {a['p_sign_flip']:.3f}); TOST at +/-{a['margin']}: p "
            f"{tost_text}, {verdict}."
        )
    hosts = sorted({r["host_id"] for r in runs})
    commits = sorted({r["commit"][:12] for r in runs})
    clean = sum(r["clean"] for r in runs)
    lines.append(
        f"\n{config['steps']} RL steps of the embedded default per run; {EVAL_KEY} on 64 held-out additions x 4 "
        f"episodes at temperature 0.6. {len(runs)} runs ({clean} from a clean tree) on host(s) {', '.join(hosts)}; "
        f"commits {', '.join(commits)}. Forks: {sum(r['forks'] for r in runs):.0f}; dropped episodes: "
        f"{sum(r['dropped'] for r in runs):.0f}."
    )
    table = "\n".join(lines)
    (out_dir / f"{NAME}.md").write_text(table + "\n")
    return table


def options(p) -> None:
    p.add_argument("--margin", type=float, default=0.05, help="equivalence margin on the held-out score")


def run(args, study) -> None:
    runs = [r for r in study.stored() if r["steps"] == args.steps]
    done = {(r["arm"], r["seed"]) for r in runs}
    config = {"steps": args.steps, "margin": args.margin, "arms": {k: v[2:] for k, v in ARMS.items()}}
    with tempfile.TemporaryDirectory() as tmp:
        eval_data = held_out(Path(tmp) / "held_out.jsonl")
        for seed in args.seeds:
            for arm in ARMS:
                if (arm, seed) in done:
                    continue
                print(f"[{NAME}] seed {seed}, {arm} ...", flush=True)
                outputs = (study.path, study.path.with_suffix(".md"))
                runs.append(run_one(arm, seed, args.steps, Path(tmp), eval_data, outputs))
                print(f"[{NAME}] seed {seed}, {arm}: {runs[-1]['before']:.3f} -> {runs[-1]['after']:.3f} "
                      f"({runs[-1]['wall_s']:.0f} s)", flush=True)  # fmt: skip
                study.save(runs, config)  # after every run: resumable


def main(argv=None) -> int:
    return study_main(argv, __doc__, NAME, run, render, options=options, seeds="1-4", steps=150)


if __name__ == "__main__":
    sys.exit(main())
