"""Paired statistics for training studies run at several seeds (benchmarks/is_study.py).

Every correction of a study runs at the same seeds with the same warm start and prompts, so the unit of
comparison is the per-seed difference between two corrections (paired), not two independent means: the
seed-to-seed spread that swamped the older 3-seed study cancels in the difference.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path

Z_95, Z_80_POWER = 1.959964, 0.841621  # two-sided 5% test, 80% power


def paired_bootstrap(diffs: list[float], resamples: int = 10_000, seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high): the mean paired difference and its 95% percentile-bootstrap interval (seeds
    resampled with replacement)."""
    if not diffs:
        raise ValueError("no paired differences")
    rng, n = random.Random(seed), len(diffs)
    means = sorted(statistics.fmean(rng.choices(diffs, k=n)) for _ in range(resamples))
    return statistics.fmean(diffs), means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def detectable_difference(diffs: list[float]) -> float:
    """The smallest mean difference these seeds could have detected (two-sided 5%, 80% power) given the
    spread of the paired differences: (z_0.975 + z_0.8) * sd / sqrt(n). inf with fewer than 2 seeds."""
    if len(diffs) < 2:
        return math.inf
    return (Z_95 + Z_80_POWER) * statistics.stdev(diffs) / math.sqrt(len(diffs))


def verdict(diffs: list[float]) -> str:
    """ "better" / "worse" when the interval excludes 0, else "no difference at N seeds (detectable: D)"."""
    mean, low, high = paired_bootstrap(diffs)
    if low > 0:
        return "better"
    if high < 0:
        return "worse"
    return f"no difference at {len(diffs)} seeds (detectable: {detectable_difference(diffs):.3f})"


def collapsed(
    rewards: list[float], grad_norms: list[float], window: int = 10, margin: float = 0.05, blowup: float = 5.0
) -> bool:
    """A run collapsed when its reward, as a `window`-step moving average, stays more than `margin` below its
    start (the mean of the first `window` steps) for `window` or more consecutive steps, or its gradient norm
    blows up: non-finite, or a `window`-step moving average above `blowup` x the run's median. Moving averages
    and the margin keep single steps from counting: a flat run's raw reward is below its start half of the
    time, and on the embedded task one step's gradient norm reaches 10x the median in healthy runs."""
    if len(rewards) < 2 * window:
        return False
    start = statistics.fmean(rewards[:window])
    if longest_run(_moving(rewards, window), lambda m: m < start - margin) >= window:
        return True
    norms = [g if g is not None else math.nan for g in grad_norms]
    if not all(math.isfinite(g) for g in norms):
        return True
    median = statistics.median(norms) if norms else 0.0
    return median > 0 and any(m > blowup * median for m in _moving(norms, window))


def _moving(values: list[float], window: int) -> list[float]:
    """Means of every `window` consecutive values."""
    return [statistics.fmean(values[i - window : i]) for i in range(window, len(values) + 1)]


def longest_run(values: list[float], holds) -> int:
    """The most consecutive values for which `holds(value)` is true."""
    longest = run = 0
    for v in values:
        run = run + 1 if holds(v) else 0
        longest = max(longest, run)
    return longest


def parse_seeds(text: str) -> list[int]:
    """`--seeds` of a study: a range "1-8" or a list "1,3,5"."""
    if "-" in text:
        low, high = map(int, text.split("-"))
        return list(range(low, high + 1))
    return [int(x) for x in text.split(",")]


def stored_runs(path: Path) -> list[dict]:
    """The runs a study's JSON already holds (none before its first run): what a resumed study skips."""
    return json.loads(path.read_text())["results"]["runs"] if path.exists() else []
