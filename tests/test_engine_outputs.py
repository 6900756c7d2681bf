"""What the trainer does with the engine's odd outputs, from recorded vLLM output shapes: a missing or NaN
log-prob becomes NaN (weight 0 under IS, counted), a -inf passes through, and the first-step gap metrics
count such tokens instead of turning into NaN or inf; the same metrics by response position (the drift
picture's rows)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from reinforce_pro.rollout.vllm_engine import sampled_log_probs


def completion(token_ids, logprobs):
    """A vLLM CompletionOutput's two fields the engine reads: token ids and, per position, {token: Logprob}."""
    return SimpleNamespace(token_ids=token_ids, logprobs=logprobs)


def entry(value):
    return SimpleNamespace(logprob=value)


def test_each_sampled_token_gets_its_log_prob_or_nan():
    out = completion([5, 7, 9], [{5: entry(-0.5)}, {7: entry(-1.25), 3: entry(-0.1)}, {9: entry(-2.0)}])
    assert sampled_log_probs(out) == [-0.5, -1.25, -2.0]
    odd = completion(
        [5, 7, 9, 4, 2], [{5: entry(float("nan"))}, {3: entry(-0.1)}, None, {4: entry(-math.inf)}]
    )  # NaN returned, token missing from its entry, no entry, -inf (a token its own filter removed), too short
    got = sampled_log_probs(odd)
    assert math.isnan(got[0]) and math.isnan(got[1]) and math.isnan(got[2]) and got[3] == -math.inf
    assert math.isnan(got[4])
    assert all(math.isnan(v) for v in sampled_log_probs(completion([1, 2], None)))  # no log-probs at all


def gap_metrics(old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """The first-step gap metrics (ExperienceBuilder.old_log_prob_metrics) of one batch of (B, T) log-probs."""
    from reinforce_pro.algos.kl import build_kl_controller
    from reinforce_pro.experience import Experience
    from reinforce_pro.trainer.experience_builder import ExperienceBuilder, ExperienceConfig

    rows, width = old.shape
    exp = Experience(
        sequences=torch.zeros(rows, width + 2, dtype=torch.long),
        attention_mask=torch.ones(rows, width + 2, dtype=torch.long), action_mask=mask, old_log_probs=old,
        rollout_log_probs=rollout, advantages=torch.zeros(rows, width), returns=torch.zeros(rows, width),
        rewards=torch.zeros(rows),
    )  # fmt: skip
    builder = ExperienceBuilder([], None, None, None, ExperienceConfig(), build_kl_controller(0.0, None, 1))
    return builder.old_log_prob_metrics(exp)


def test_the_gap_metrics_count_nonfinite_engine_log_probs_and_skip_them():
    old = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-1.0, -1.0, -1.0, -1.0]])
    rollout = torch.tensor([[-1.5, float("nan"), -0.5, 0.0], [-1.0, -math.inf, -0.75, -9.0]])
    mask = torch.tensor([[True, True, True, False], [True, True, True, False]])
    m = gap_metrics(old, rollout, mask)
    # finite action gaps: 0.5, 0, 0, 0.25 (the masked column's 8.0 is no action token)
    assert m["rollout/logprob_abs_diff_mean"] == 0.1875 and m["rollout/logprob_abs_diff_max"] == 0.5
    assert abs(m["rollout/logprob_nonfinite_frac"] - 2 / 6) < 1e-7
    assert all(math.isfinite(v) for v in m.values())


def test_the_gap_by_position_is_the_mean_over_each_buckets_tokens():
    old = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5], [0.3, 0.1, 0.5, 0.0, 9.0]])
    mask = torch.tensor([[True] * 5, [True] * 4 + [False]])
    m = gap_metrics(old, torch.zeros(2, 5), mask)
    # buckets [0, 2), [2, 4), [4, 8): (0.1 + 0.2 + 0.3 + 0.1) / 4, (0.3 + 0.4 + 0.5 + 0.0) / 4, 0.5 (9.0 is masked)
    assert m["rollout_pos/logprob_abs_diff/0-1"] == pytest.approx(0.175)
    assert m["rollout_pos/logprob_abs_diff/2-3"] == pytest.approx(0.3)
    assert m["rollout_pos/logprob_abs_diff/4-7"] == pytest.approx(0.5)
