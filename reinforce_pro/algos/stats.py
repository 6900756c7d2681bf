"""Metrics as partial statistics that merge exactly across micro-batches, mini-batches and ranks.

A loss or weight function sees one micro-batch of one rank; the run logs one number per step for the whole
batch. A plain mean of per-micro-batch values is wrong for most metrics: a maximum becomes a mean of maxima,
a count a mean of counts, and a token mean weighs a micro-batch of 3 tokens like one of 300. So every metric
carries its reduction and, for means, the number of items it averages over (`Stat`), and `reduce_stats`
merges them. The reductions (docs/metrics.md lists the one of every key):

| reduce  | value of one part            | merged                                             |
|---------|------------------------------|----------------------------------------------------|
| mean    | mean over `weight` items     | sum(value * weight) / sum(weight)                  |
| sum     | a total (a count)            | sum over parts, divided by the passes (epochs)     |
| max/min | extreme over `weight` items  | max / min over parts with weight > 0               |
| derived | the value on this part alone | recomputed from other merged metrics (DERIVED)     |

A part with weight 0 saw no item (a micro-batch with no valid token): it is ignored, and when every part
has weight 0 the merged value is the first part's (each metric's "empty" value: 0, or -1 where it says so).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch

from reinforce_pro.algos.masked import masked_mean

REDUCTIONS = ("mean", "sum", "max", "min", "derived")


@dataclass(frozen=True)
class Stat:
    """One metric of one part of a batch. value, weight: 0-dim tensors inside the math, floats once `item()`."""

    value: torch.Tensor | float
    weight: torch.Tensor | float = 1.0  # mean / max / min: items the value is taken over (0: none)
    reduce: str = "mean"

    def __post_init__(self) -> None:
        if self.reduce not in REDUCTIONS:
            raise ValueError(f"unknown reduction {self.reduce!r}; valid: {', '.join(REDUCTIONS)}")

    def __float__(self) -> float:
        return float(self.value)

    def item(self) -> Stat:
        """The same statistic with Python floats: what crosses from a Ray worker to the driver."""
        return Stat(float(self.value), float(self.weight), self.reduce)


def mean_stat(values: torch.Tensor, mask: torch.Tensor) -> Stat:
    """masked_mean of `values` where `mask` holds, weighted by how many entries it holds (value 0 if none)."""
    return Stat(masked_mean(values, mask), mask.bool().sum(), "mean")


def extreme_stat(values: torch.Tensor, mask: torch.Tensor, reduce: str) -> Stat:
    """max or min of `values` where `mask` holds; value 0 when it holds nowhere (keeps metrics finite).
    Written without host syncs so that it costs nothing extra on a GPU."""
    mask = mask.bool()
    op, fill = (torch.amax, -torch.inf) if reduce == "max" else (torch.amin, torch.inf)
    value = op(torch.where(mask, values, torch.tensor(fill, dtype=values.dtype, device=values.device)))
    return Stat(value.nan_to_num(posinf=0.0, neginf=0.0), mask.sum(), reduce)


def loss_stat(
    loss: torch.Tensor,
    loss_mask: torch.Tensor,
    token_level_loss: bool,
    dp_size: int = 1,
    batch_num_tokens: float | None = None,
    global_batch_size: float | None = None,
) -> Stat:
    """The logged form of a loss that `masked.aggregate_loss` computed on one micro-batch of one rank.

    That loss is this part's share of the global loss (sum over the part / global count x dp_size), so a
    mean of shares is the global loss divided by the number of parts. Rewritten as this part's own mean
    (over its tokens, or its sequences with a token) weighted by its count, the merged mean is the loss that
    was optimised, however the batch was split: sum over every part / global count."""
    mask = loss_mask.bool()
    count = mask.sum() if token_level_loss else (mask.sum(-1) > 0).sum()
    total = batch_num_tokens if token_level_loss else global_batch_size
    value = loss.detach()
    if total is not None:  # the part's share -> the part's own mean
        value = value * (max(total, 1) / dp_size) / count.clamp(min=1).to(value.dtype)
    return Stat(value, count, "mean")


# Metrics that no reduction of part values gives: computed from other merged metrics.
# is/ess = (sum w)^2 / (sum w^2) / n = weight_mean^2 / weight_sq_mean, both means over the action tokens.
DERIVED: dict[str, tuple[tuple[str, ...], Callable[..., float]]] = {
    "is/ess": (("is/weight_mean", "is/weight_sq_mean"), lambda mean, sq: mean * mean / sq if sq > 0 else 0.0),
}


def merge_stats(parts: Iterable[Mapping[str, Stat]]) -> dict[str, Stat]:
    """Merge the metrics of disjoint parts of one batch (micro-batches, ranks, mini-batches) into one Stat
    per key, each by its own reduction. A key may be missing from some parts (a rank without a critic)."""
    by_key: dict[str, list[Stat]] = {}
    for part in parts:
        for key, stat in part.items():
            by_key.setdefault(key, []).append(stat)
    return {key: _merge(key, stats) for key, stats in by_key.items()}


def _merge(key: str, stats: list[Stat]) -> Stat:
    kinds = {s.reduce for s in stats}
    if len(kinds) != 1:
        raise ValueError(f"metric {key!r} is reduced in different ways by different parts: {sorted(kinds)}")
    kind = kinds.pop()
    weights = [float(s.weight) for s in stats]
    total = sum(weights)
    if kind == "sum":
        return Stat(sum(float(s.value) for s in stats), total, kind)
    seen = [float(s.value) for s, w in zip(stats, weights, strict=True) if w > 0]
    if kind == "derived" or not seen:  # derived: recomputed by reduce_stats; empty: each part's empty value
        return Stat(float(stats[0].value), total, kind)
    if kind == "mean":
        value = sum(float(s.value) * w for s, w in zip(stats, weights, strict=True)) / total
    else:
        value = max(seen) if kind == "max" else min(seen)
    return Stat(value, total, kind)


def reduce_stats(parts: Iterable[Mapping[str, Stat]], passes: int = 1) -> dict[str, float]:
    """The logged numbers of a step: `parts` merged (merge_stats), sums divided by `passes` (the epochs over
    the same batch, so that a count describes the batch once), derived metrics recomputed."""
    merged = merge_stats(parts)
    out = {k: s.value / passes if s.reduce == "sum" else s.value for k, s in merged.items()}
    out = {k: float(v) for k, v in out.items()}
    for key, (inputs, fn) in DERIVED.items():
        if key in out and all(k in out for k in inputs):
            out[key] = float(fn(*(out[k] for k in inputs)))
    return out
