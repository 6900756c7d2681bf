"""What the code sandbox's isolation costs per call: the sandbox at a baseline commit against the current one.

Runs on: Linux (the current sandbox needs its kernel layers; the baseline needs nothing).
Takes:   ~30 s on 2 cores with the defaults.

    python -m benchmarks.bench_sandbox                          # baseline = 633e66a (before kernel layers)
    python -m benchmarks.bench_sandbox --baseline REV --calls 100
    python -m benchmarks.bench_sandbox --render FILE            # re-render the table from a JSON

The baseline's `sandbox.py` and `_sandbox_child.py` are read from git at REV into a temporary directory and
imported from there, so both run in this one process, one after the other, on the same programs: a trivial
function and the code_output task's seed programs, `run_once` (one process) and `run_deterministic` (the
self-play unit: two). Per-call wall times are reported as median and 90th percentile.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import bench_main
from reinforce_pro.selfplay import sandbox as current
from reinforce_pro.selfplay.code_task import CODE_SEEDS

ROOT = Path(__file__).resolve().parent.parent

PROGRAMS = [("def f(x):\n    return x", "1")] + CODE_SEEDS


def load_baseline(rev: str, into: Path):
    """The sandbox module as it was at `rev`, importable on its own (it only imports the standard library)."""
    for name in ("sandbox.py", "_sandbox_child.py"):
        text = subprocess.check_output(["git", "show", f"{rev}:reinforce_pro/selfplay/{name}"], cwd=ROOT, text=True)
        (into / name).write_text(text)
    spec = importlib.util.spec_from_file_location("baseline_sandbox", into / "sandbox.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def time_calls(module, calls: int) -> dict:
    limits = module.SandboxLimits()
    module.run_once(PROGRAMS[0][0], "f", PROGRAMS[0][1], limits)  # warm-up (and the current one's probe)
    once, twice, failures = [], [], 0
    for i in range(calls):
        code, argument = PROGRAMS[i % len(PROGRAMS)]
        start = time.perf_counter()
        failures += not module.run_once(code, "f", argument, limits).ok
        once.append(time.perf_counter() - start)
        start = time.perf_counter()
        failures += not module.run_deterministic(code, "f", argument, limits).ok
        twice.append(time.perf_counter() - start)
    return {"run_once_ms": _summary(once), "run_deterministic_ms": _summary(twice), "failures": failures}


def _summary(seconds: list[float]) -> dict:
    ms = sorted(1000 * s for s in seconds)
    return {"median": statistics.median(ms), "p90": ms[int(0.9 * (len(ms) - 1))], "calls": len(ms)}


def render(payload: dict, out_dir: Path) -> str:
    r, cfg = payload["results"], payload["config"]
    lines = [
        "| sandbox | layers | run_once ms (median / p90) | run_deterministic ms (median / p90) | failures |",
        "|---|---|---|---|---|",
    ]
    for name in ("baseline", "current"):
        x = r[name]
        lines.append(
            f"| {x['label']} | {x['layers']} | {x['run_once_ms']['median']:.1f} / {x['run_once_ms']['p90']:.1f} "
            f"| {x['run_deterministic_ms']['median']:.1f} / {x['run_deterministic_ms']['p90']:.1f} | {x['failures']} |"
        )
    cost = r["current"]["run_once_ms"]["median"] - r["baseline"]["run_once_ms"]["median"]
    lines += ["", f"Isolation cost: {cost:+.1f} ms per process ({cfg['calls']} calls of each kind per sandbox, "
              f"{payload['machine'].get('cpu', '')}, commit {payload['commit'][:12]})."]  # fmt: skip
    text = "\n".join(lines) + "\n"
    (out_dir / "bench_sandbox.md").write_text(text)
    return text


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--baseline", default="633e66a", help="git revision of the sandbox to compare against")
    p.add_argument("--calls", type=int, default=60, help="calls of run_once and of run_deterministic per sandbox")


def measured(args) -> tuple[dict, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        baseline = load_baseline(args.baseline, Path(tmp))
        results = {"baseline": {"label": f"{args.baseline} (Python checks only)", "layers": "rlimits",
                                **time_calls(baseline, args.calls)}}  # fmt: skip
    layers = ", ".join(current.require_isolation().layers)
    results["current"] = {"label": "current", "layers": layers, **time_calls(current, args.calls)}
    return {"baseline": args.baseline, "calls": args.calls, "programs": len(PROGRAMS)}, results


def main(argv=None) -> int:
    return bench_main(argv, "bench_sandbox", __doc__, options, measured, render)


if __name__ == "__main__":
    sys.exit(main())
