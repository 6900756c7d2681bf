"""The estimator study's ground truth: the exact gradient, and unbiasedness of the uncorrected estimator."""

import pytest
import torch

from reinforce_pro.algos.is_correction import default_band
from reinforce_pro.algos.losses import DEFAULT_IS_THRESHOLD, PolicyLoss
from studies.is_estimator_study import (
    CORRECTIONS,
    DRIFTS,
    batch_gradient,
    exact_gradient,
    exact_objective,
    make_problem,
    token_log_probs,
)


def test_exact_gradient_matches_finite_differences():
    problem = make_problem(None, symbols=2, horizon=3, seed=5)
    g = exact_gradient(problem)
    eps, fd = 1e-6, torch.zeros_like(problem.theta)
    for idx in itertools_product(problem.theta.shape):
        plus, minus = problem.theta.clone(), problem.theta.clone()
        plus[idx] += eps
        minus[idx] -= eps
        fd[idx] = -(exact_objective(plus, problem) - exact_objective(minus, problem)) / (2 * eps) / problem.horizon
    torch.testing.assert_close(g, fd, atol=1e-8, rtol=1e-6)


def itertools_product(shape):
    import itertools

    return itertools.product(*(range(n) for n in shape))


def test_sequence_probabilities_sum_to_one():
    problem = make_problem("progressive", symbols=3, horizon=4, seed=1)
    for theta in (problem.theta, problem.rollout_theta):
        total = token_log_probs(theta, problem.sequences).sum(-1).exp().sum()
        assert float(total) == pytest.approx(1.0, abs=1e-12)


def _mean_and_stderr(problem, batches=400, batch_size=32, seed=0):
    loss_fn = PolicyLoss()
    mu = token_log_probs(problem.rollout_theta, problem.sequences).sum(-1).exp()
    gen = torch.Generator().manual_seed(seed)
    grads = torch.stack(
        [
            batch_gradient(problem, torch.multinomial(mu, batch_size, replacement=True, generator=gen), loss_fn)[0]
            for _ in range(batches)
        ]
    )
    return grads.mean(0), grads.std(0) / batches**0.5


def test_uncorrected_estimator_is_unbiased_on_policy():
    """rollout == policy: every gradient component lies within 5 standard errors of the exact value."""
    problem = make_problem(None, symbols=3, horizon=4, seed=0)
    mean, se = _mean_and_stderr(problem)
    z = ((mean - exact_gradient(problem)).abs() / se.clamp(min=1e-12)).max()
    assert z < 5.0, z


def test_the_unbiasedness_check_detects_a_drifted_rollout():
    """The same check fails when the rollout policy drifts: the test above is able to fail."""
    problem = make_problem("sequence_temperature", symbols=3, horizon=4, seed=0)
    mean, se = _mean_and_stderr(problem)
    z = ((mean - exact_gradient(problem)).abs() / se.clamp(min=1e-12)).max()
    assert z > 5.0, z


@pytest.mark.parametrize("correction", CORRECTIONS)
def test_every_correction_equals_none_on_policy(correction):
    problem = make_problem(None, symbols=3, horizon=4, seed=2)
    index = torch.arange(0, 81, 3)
    g_none, _ = batch_gradient(problem, index, PolicyLoss())
    loss = PolicyLoss(
        enable_vllm_is_correction=correction != "none",
        vllm_is_correction_type="tis" if correction == "none" else correction,
        vllm_is_truncated_threshold=default_band(correction, DEFAULT_IS_THRESHOLD),
    )
    g, kept = batch_gradient(problem, index, loss)
    torch.testing.assert_close(g, g_none, atol=1e-12, rtol=0)
    assert kept == 1.0


@pytest.mark.parametrize("drift", list(DRIFTS))
def test_every_drift_pattern_moves_the_sequence_distribution(drift):
    problem = make_problem(drift, symbols=3, horizon=5, seed=0)
    pi = token_log_probs(problem.theta, problem.sequences).sum(-1).exp()
    mu = token_log_probs(problem.rollout_theta, problem.sequences).sum(-1).exp()
    assert float((pi - mu).abs().sum()) / 2 > 0.01  # total variation distance
