"""Paired statistics for training studies run at several seeds (studies/is_study.py, is_long_study.py).

Every correction of a study runs at the same seeds with the same warm start and prompts, so the unit of
comparison is the per-seed difference between two corrections (paired), not two independent means: the
seed-to-seed spread that swamped the older 3-seed study cancels in the difference.

The tests are the well-kept implementations: scipy's one-sample t-test on the differences (= `ttest_rel`) and
its Wilcoxon signed-rank test, statsmodels' Holm correction, and two one-sided t-tests for equivalence (TOST).
The exact sign-flip test is computed here (sign_flip_p) because scipy's enumeration takes minutes at 24 seeds;
it equals scipy's to the last bit.
The percentile bootstrap is kept for the older study's tables; under ~20 seeds it is too narrow to test with.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from dataclasses import dataclass
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
    return bool(collapse_kinds(rewards, grad_norms, window, margin, blowup))


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


def thirds(values: list[float | None]) -> list[float]:
    """Means of the first, second and last third of a run's series (steps without a value left out); [] when
    it has fewer than 3 values."""
    seq = [v for v in values if v is not None]
    third = len(seq) // 3
    return [statistics.fmean(seq[i * third : (i + 1) * third]) for i in range(3)] if third else []


def parse_seeds(text: str) -> list[int]:
    """`--seeds` of a study: a range "1-8" or a list "1,3,5"."""
    if "-" in text:
        low, high = map(int, text.split("-"))
        return list(range(low, high + 1))
    return [int(x) for x in text.split(",")]


def stored_results(path: Path) -> dict:
    """The `results` of a study's JSON (empty before its first run): what a resumed study starts from."""
    return json.loads(path.read_text())["results"] if path.exists() else {}


def stored_runs(path: Path, config: dict | None = None) -> list[dict]:
    """The runs a study's JSON already holds (none before its first run): what a resumed study skips. With
    `config`, only when the JSON was written with that configuration: runs of other settings never join a table."""
    same = path.exists() and (config is None or json.loads(path.read_text())["config"] == config)
    return stored_results(path)["runs"] if same else []


@dataclass(frozen=True)
class PairedTest:
    """A paired comparison over seeds: the mean difference, its 95% t-interval, the two tests' p-values."""

    n: int
    mean: float
    low: float  # the 95% t-interval of the mean difference
    high: float
    sd: float  # standard deviation of the per-seed differences
    p_t: float | None  # two-sided paired t-test; None when the differences do not vary (nothing to scale by)
    p_wilcoxon: float | None  # two-sided Wilcoxon signed-rank (None when every difference is 0)


def varies(diffs: list[float]) -> bool:
    """Whether paired differences spread at all: at least 2 of them, with a standard deviation above rounding
    (held-out accuracies come back from float32, ~1e-8 off their grid of 0.005). A t-test or TOST of differences
    that do not vary has nothing to scale by."""
    if len(diffs) < 2:
        return False
    return statistics.stdev(diffs) > 1e-6 * max(1.0, abs(statistics.fmean(diffs)))


def paired_test(diffs: list[float]) -> PairedTest:
    """The paired t-interval and t-test of `diffs` (per-seed a - b), with the Wilcoxon signed-rank test beside
    it. Needs at least 2 differences. Differences that do not vary give no t-test (p_t None): the t statistic
    divides by their spread, and on the held-out grid (steps of 0.005) two seeds can differ by exactly the same
    amount by chance, which says nothing a t-test can weigh."""
    from scipy import stats

    if len(diffs) < 2:
        raise ValueError(f"a paired test needs at least 2 seeds, got {len(diffs)}")
    n, mean = len(diffs), statistics.fmean(diffs)
    sd = statistics.stdev(diffs) if varies(diffs) else 0.0
    half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    p_t = float(stats.ttest_1samp(diffs, 0.0).pvalue) if sd > 0 else None
    p_w = float(stats.wilcoxon(diffs).pvalue) if any(d != 0 for d in diffs) else None
    return PairedTest(n, mean, mean - half, mean + half, sd, p_t, p_w)


@dataclass(frozen=True)
class Direction:
    """Which side of 0 the per-seed differences fall on, with two tests that hold for heavy-tailed differences
    (runs that collapse make them so, and a t-test then loses its power)."""

    lower: int  # seeds with a < b
    higher: int
    ties: int
    p_sign: float  # exact two-sided sign test over the untied seeds (scipy's binomtest)
    p_sign_flip: float  # exact two-sided sign-flip permutation test of the mean difference


def direction(diffs: list[float]) -> Direction:
    """Seed by seed: how many differences are below, above and at 0, the exact sign test and the exact sign-flip
    permutation test of their mean (every one of the 2^n sign patterns, sign_flip_p)."""
    from scipy import stats

    lower, higher = sum(d < 0 for d in diffs), sum(d > 0 for d in diffs)
    p_sign = float(stats.binomtest(lower, lower + higher).pvalue) if lower + higher else 1.0
    return Direction(lower, higher, len(diffs) - lower - higher, p_sign, sign_flip_p(diffs))


def sign_flip_p(diffs: list[float]) -> float:
    """The exact two-sided sign-flip permutation test of the mean paired difference: the share of the 2^n sign
    patterns whose sum lies as far from 0 as the observed one, doubled from one tail as scipy's permutation_test
    does (its p-value to the last bit; tests/test_stats.py checks it against scipy's). scipy enumerates the
    patterns one by one (~20 s at 20 seeds, ~100 s at 24); here the sums of the two halves' patterns are met in
    the middle (2 x 2^(n/2) sums, a sort and a search): milliseconds at the 24 seeds a confirmation takes."""
    import numpy as np

    d = np.asarray(diffs, dtype=np.float64)
    if len(d) > 40:  # each half's 2^(n/2) x n/2 sign matrix: 160 MB at 40 seeds
        raise ValueError(f"the exact sign-flip test enumerates 2^n patterns: {len(d)} seeds is beyond its 40")
    if not d.any():
        return 1.0
    observed = abs(d.sum())
    tol = 1e-12 * max(1.0, float(np.abs(d).sum()))  # equal sums reached by another order of additions

    def sums(half: np.ndarray) -> np.ndarray:
        signs = 1 - 2 * ((np.arange(2 ** len(half))[:, None] >> np.arange(len(half))) & 1)
        return signs @ half

    left, right = sums(d[: len(d) // 2]), np.sort(sums(d[len(d) // 2 :]))
    at_least = len(right) - np.searchsorted(right, observed - tol - left, side="left")
    return min(1.0, 2.0 * float(at_least.sum()) / 2.0 ** len(d))


def on_grid(value: float, count: int) -> float:
    """An accuracy over `count` questions put back on its grid k/count. Stored as float32 it is ~1e-8 off the
    grid, so two paired differences that are equal on it (a tie a sign, rank or sign-flip test must count as
    one) compare unequal, and the exact tests then read ties as wins or drop tying sign patterns. A value
    further than 1e-4 of a step from the grid is no such accuracy (a mean, a hand-made value) and stays as it is."""
    steps = value * count
    return round(steps) / count if abs(steps - round(steps)) <= 1e-4 else value


def paired_rate_test(a: list[bool], b: list[bool]) -> float:
    """The exact McNemar test of two paired binary outcomes (a seed collapsed under arm a / under arm b): the
    two-sided sign test over the discordant seeds (scipy's binomtest); 1.0 where none is discordant."""
    from scipy import stats

    only_a = sum(x and not y for x, y in zip(a, b, strict=True))
    only_b = sum(y and not x for x, y in zip(a, b, strict=True))
    return float(stats.binomtest(only_a, only_a + only_b).pvalue) if only_a + only_b else 1.0


def detectable_at(diffs: list[float], alpha: float, power: float = 0.8) -> float:
    """The smallest mean difference a two-sided paired t-test at level `alpha` detects with `power`, given the
    spread and number of `diffs` (statsmodels' exact power of the t-test, not the normal approximation)."""
    from statsmodels.stats.power import TTestPower

    if len(diffs) < 2:
        return math.inf
    effect = TTestPower().solve_power(nobs=len(diffs), alpha=alpha, power=power, alternative="two-sided")
    return float(effect) * statistics.stdev(diffs)


def holm(pvalues: list[float | None]) -> list[float | None]:
    """Holm-adjusted p-values over one family of comparisons (statsmodels' multipletests), in the given order. A
    comparison without a test (None: see paired_test) stays in the family as a p of 1, so the others are adjusted
    for it, and comes back None."""
    from statsmodels.stats.multitest import multipletests

    if not pvalues:
        return []
    adjusted = multipletests([1.0 if p is None else p for p in pvalues], method="holm")[1]
    return [None if p is None else float(a) for p, a in zip(pvalues, adjusted, strict=True)]


def tost(diffs: list[float], margin: float) -> float:
    """The p-value of two one-sided t-tests that the mean difference lies within (-margin, +margin): small
    means equivalent within the margin (the larger of the two one-sided p-values)."""
    from scipy import stats

    if not varies(diffs):
        raise ValueError("TOST needs at least 2 seeds whose differences vary")
    lower = stats.ttest_1samp(diffs, -margin, alternative="greater").pvalue
    upper = stats.ttest_1samp(diffs, margin, alternative="less").pvalue
    return float(max(lower, upper))


def seeds_needed(sd: float, delta: float, alpha: float = 0.05, power: float = 0.8) -> int:
    """Seeds for a paired two-sided test at level `alpha` to detect a mean difference `delta` with `power`,
    given the paired differences' spread `sd`: ((z_{1-alpha/2} + z_power) sd / delta)^2, rounded up."""
    from scipy import stats

    z = stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)
    return math.ceil((z * sd / delta) ** 2)


def collapse_kinds(rewards: list[float], grad_norms: list[float], window: int = 10, margin: float = 0.05,
                   blowup: float = 5.0) -> list[str]:  # fmt: skip
    """Which collapses a run had, by kind: "reward" (its `window`-step moving average more than `margin` below
    its start for `window` or more consecutive steps) and "grad_norm" (non-finite, or a `window`-step moving
    average above `blowup` x the run's median). `collapsed` is true when this is not empty."""
    kinds = []
    if len(rewards) >= 2 * window:
        start = statistics.fmean(rewards[:window])
        if longest_run(_moving(rewards, window), lambda m: m < start - margin) >= window:
            kinds.append("reward")
    norms = [g if g is not None else math.nan for g in grad_norms]
    if len(rewards) >= 2 * window and norms:
        median = statistics.median(norms) if all(math.isfinite(g) for g in norms) else math.nan
        if not math.isfinite(median) or (median > 0 and any(m > blowup * median for m in _moving(norms, window))):
            kinds.append("grad_norm")
    return kinds
