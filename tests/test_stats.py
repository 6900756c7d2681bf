"""Metrics merged over micro-batches and ranks equal the metrics of the whole batch (algos/stats.py)."""

from __future__ import annotations

import math

import pytest
import torch

from reinforce_pro.algos.is_correction import IS_CORRECTIONS, default_band
from reinforce_pro.algos.kl import kl_loss
from reinforce_pro.algos.losses import DEFAULT_IS_THRESHOLD, PolicyLoss, ValueLoss
from reinforce_pro.algos.stats import Stat, loss_stat, merge_stats, reduce_stats

B, T = 11, 9


def batch(seed: int = 0):
    """Rows of different lengths (one with no action token), drift growing along some rows, one NaN."""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.zeros(B, T, dtype=torch.bool)
    for i in range(B):
        mask[i, : (i * 5) % (T + 1)] = True  # row 0: no action token
    old = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 3
    drift = torch.randn(B, T, generator=gen, dtype=torch.float64).cumsum(-1) * 0.4
    rollout = old - drift
    rollout[3, 1] = float("nan")
    log_probs = old + 0.05 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    adv = torch.randn(B, T, generator=gen, dtype=torch.float64)
    ref = old - 0.3 * torch.rand(B, T, generator=gen, dtype=torch.float64)
    return log_probs, old, rollout, adv, ref, mask


# Two "ranks" with uneven shards, each cut into micro-batches of uneven size, as the trainer may cut them.
SHARDS = [[[0, 1, 2], [3]], [[4, 5, 6, 7], [8, 9, 10]]]
MICRO = [rows for rank in SHARDS for rows in rank]


def global_agg(dp_size: int) -> dict:
    """aggregate_loss's keywords as the trainer passes them: the counts of the whole batch."""
    *_, mask = batch()
    return dict(dp_size=dp_size, batch_num_tokens=float(mask.sum()), global_batch_size=float(mask.any(-1).sum()))


def parts_metrics(fn):
    """(fn on the whole batch as one rank, fn on every micro-batch of every rank); fn(rows, agg) -> metrics."""
    whole = fn(list(range(B)), global_agg(1))
    parts = [fn(rows, global_agg(len(SHARDS))) for rows in MICRO]
    return whole, parts


@pytest.mark.parametrize("token_level", [True, False], ids=["token", "seq"])
@pytest.mark.parametrize("name", list(IS_CORRECTIONS))
def test_policy_metrics_of_two_ranks_equal_the_whole_batch(name, token_level):
    log_probs, old, rollout, adv, ref, mask = batch()
    band = default_band(name, DEFAULT_IS_THRESHOLD)
    loss_fn = PolicyLoss(enable_vllm_is_correction=True, vllm_is_correction_type=name, token_level_loss=token_level,
                         vllm_is_truncated_threshold=band)  # fmt: skip

    def fn(rows, agg):
        loss, m = loss_fn(log_probs[rows], old[rows], adv[rows], mask[rows], rollout[rows], **agg)
        kl, kl_m = kl_loss("k3", log_probs[rows], ref[rows], mask[rows], 0.1, token_level, **agg)
        m["policy/pg_loss"] = loss_stat(loss, mask[rows], token_level, **agg)
        return {**m, **kl_m}

    whole, parts = parts_metrics(fn)
    merged = reduce_stats(parts)
    expected = reduce_stats([whole])
    assert set(merged) == set(expected)
    for key, value in expected.items():
        assert merged[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    # and the logged loss is the loss that was optimised: the sum of the parts' losses / dp_size
    agg = global_agg(len(SHARDS))
    total = sum(float(loss_fn(log_probs[r], old[r], adv[r], mask[r], rollout[r], **agg)[0]) for r in MICRO)
    assert merged["policy/pg_loss"] == pytest.approx(total / len(SHARDS), rel=1e-9)
    assert float(whole["policy/pg_loss"]) == pytest.approx(total / len(SHARDS), rel=1e-9)


def test_value_metrics_of_two_ranks_equal_the_whole_batch():
    log_probs, old, rollout, adv, ref, mask = batch()
    loss_fn = ValueLoss(clip_eps=0.1)
    values, old_values, returns = adv, adv + 0.2 * ref, rollout.nan_to_num()

    whole, parts = parts_metrics(lambda r, agg: loss_fn(values[r], old_values[r], returns[r], mask[r], **agg)[1])
    merged, expected = reduce_stats(parts), reduce_stats([whole])
    for key, value in expected.items():
        assert merged[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


def test_the_old_mean_of_micro_batch_values_was_wrong():
    """What the merge fixes, on the same batch: a mean of per-part maxima, counts and losses differs."""
    log_probs, old, rollout, adv, ref, mask = batch()
    loss_fn = PolicyLoss(enable_vllm_is_correction=True, vllm_is_correction_type="reinforce_pro")
    whole, parts = parts_metrics(lambda r, agg: loss_fn(log_probs[r], old[r], adv[r], mask[r], rollout[r], **agg)[1])
    naive = {k: sum(float(p[k]) for p in parts) / len(parts) for k in parts[0]}
    merged = reduce_stats(parts)
    assert naive["is/ratio_max"] < merged["is/ratio_max"] == pytest.approx(float(whole["is/ratio_max"]))
    assert naive["is/nonfinite_tokens"] == pytest.approx(0.25) and merged["is/nonfinite_tokens"] == 1.0


@pytest.mark.parametrize(
    "stats, expected",
    [
        pytest.param([Stat(2.0, 1), Stat(5.0, 3)], 4.25, id="mean-weighted"),
        pytest.param([Stat(2.0, 0), Stat(5.0, 3)], 5.0, id="mean-skips-empty"),
        pytest.param([Stat(-1.0, 0), Stat(-1.0, 0)], -1.0, id="mean-all-empty-keeps-empty-value"),
        pytest.param([Stat(3.0, 2, "max"), Stat(7.0, 1, "max"), Stat(0.0, 0, "max")], 7.0, id="max"),
        pytest.param([Stat(0.5, 2, "min"), Stat(0.0, 0, "min"), Stat(0.9, 4, "min")], 0.5, id="min-skips-empty"),
        pytest.param([Stat(1.0, 5, "sum"), Stat(2.0, 0, "sum")], 3.0, id="sum"),
    ],
)
def test_each_reduction(stats, expected):
    assert reduce_stats([{"m": s} for s in stats])["m"] == pytest.approx(expected, abs=1e-12)


def test_sums_count_the_batch_once_over_epochs_and_ess_is_derived():
    parts = [
        {"is/nonfinite_tokens": Stat(2.0, 4, "sum"), "is/weight_mean": Stat(1.0, 2), "is/weight_sq_mean": Stat(1.0, 2)},
        {"is/nonfinite_tokens": Stat(2.0, 4, "sum"), "is/weight_mean": Stat(0.5, 2), "is/weight_sq_mean": Stat(0.5, 2)},
    ]
    for p in parts:
        p["is/ess"] = Stat(0.123, 2, "derived")
    out = reduce_stats(parts, passes=2)
    assert out["is/nonfinite_tokens"] == 2.0
    assert out["is/ess"] == pytest.approx(0.75**2 / 0.75)


def test_one_key_reduced_two_ways_is_an_error():
    with pytest.raises(ValueError, match="reduced in different ways"):
        merge_stats([{"m": Stat(1.0)}, {"m": Stat(1.0, 1, "max")}])
    with pytest.raises(ValueError, match="unknown reduction"):
        Stat(1.0, 1, "median")


def test_stats_cross_process_boundaries_as_floats():
    s = Stat(torch.tensor(0.5, dtype=torch.float64), torch.tensor(3), "max").item()
    assert s == Stat(0.5, 3.0, "max") and isinstance(s.value, float) and math.isclose(float(s), 0.5)
