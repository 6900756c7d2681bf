"""studies/is_length_study.py: its exact gradient, its closed-form batch gradients and what its bias measures,
each checked by enumerating every response of a short horizon."""

import itertools
import json

import pytest
import torch

from reinforce_pro.algos.losses import PolicyLoss
from studies import is_length_study as study

S = study.SYMBOLS


def all_responses(horizon: int) -> torch.Tensor:
    return torch.tensor(list(itertools.product(range(S), repeat=horizon)), dtype=torch.long)


def setup(profile: str, horizon: int = 5, seed: int = 3):
    gen = torch.Generator().manual_seed(seed)
    theta, g = study.make_theta(gen), torch.rand(S, generator=gen, dtype=torch.float64)
    fresh, stale = study.drift(profile, theta, horizon, gen)
    return theta, g, fresh, stale


def test_exact_gradient_is_the_enumerated_one():
    theta, g, _, _ = setup("none", horizon=5)
    seq = all_responses(5)

    def enumerated(t):
        return (study.policy_log_probs(t, seq).sum(-1).exp() * g[seq].mean(-1)).sum()

    leaf = theta.clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(-enumerated(leaf) / 5, leaf)
    torch.testing.assert_close(study.exact_gradient(theta, g, 5), expected, rtol=0, atol=1e-12)
    assert float(study.exact_objective(theta, g, 5)) == pytest.approx(float(enumerated(theta)), abs=1e-12)


@pytest.mark.parametrize("correction", ["none", "icepop", "reinforce_pro", "cppo", "minpro"])
def test_closed_form_batch_gradients_are_policy_loss_gradients(correction):
    """The study's batch gradient equals autograd through the real PolicyLoss (old = pi, rollout = mu)."""
    theta, g, fresh, stale = setup("early_burst", horizon=7)
    gen = torch.Generator().manual_seed(0)
    seq = study.sample(fresh, stale, torch.zeros(8, dtype=torch.long), gen)
    log_mu = study.rollout_log_probs(fresh, stale, seq, torch.zeros(8, dtype=torch.long))
    adv = g[seq].mean(-1, keepdim=True) - 0.4
    log_pi = study.policy_log_probs(theta, seq)
    variant = None if correction == "none" else correction
    w, _ = study.correction_weights(variant, {}, log_pi, log_mu, adv)
    closed = study.batch_gradients(theta, seq, -w * adv, batch_size=4)
    loss_fn = PolicyLoss(enable_vllm_is_correction=variant is not None, vllm_is_correction_type=variant or "tis")
    for b in range(2):
        leaf = theta.clone().requires_grad_(True)
        lp = study.policy_log_probs(leaf, seq[4 * b : 4 * b + 4])
        loss, _ = loss_fn(
            lp, lp.detach(), adv[4 * b : 4 * b + 4].expand_as(lp), rollout_log_probs=log_mu[4 * b : 4 * b + 4]
        )
        (grad,) = torch.autograd.grad(loss, leaf)
        torch.testing.assert_close(closed[b], grad.flatten(), rtol=0, atol=1e-12)


def expected_estimate(variant: str, profile: str, horizon: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """(E_mu[the variant's estimate], g*), the expectation taken exactly over every response."""
    theta, g, fresh, stale = setup(profile, horizon)
    seq = all_responses(horizon)
    zero = torch.zeros(len(seq), dtype=torch.long)
    log_pi, log_mu = study.policy_log_probs(theta, seq), study.rollout_log_probs(fresh, stale, seq, zero)
    adv = g[seq].mean(-1, keepdim=True) - float(study.exact_objective(theta, g, horizon))
    _, correction, params = next(v for v in study.VARIANTS if v[0] == variant)
    w, _ = study.correction_weights(correction, params, log_pi, log_mu, adv)
    per_response = study.batch_gradients(theta, seq, -w * adv, batch_size=1)  # (N, P)
    mean = (log_mu.sum(-1).exp().unsqueeze(-1) * per_response).sum(0)
    return mean, study.exact_gradient(theta, g, horizon).flatten()


def test_the_sequence_product_is_unbiased_and_the_others_are_not():
    """Under an early burst the whole response's ratio recovers g* exactly; a token-level ratio (tis, nothing
    clamped at this drift) and the prefix product do not, since the reward also reads the tokens after t, which
    stay drawn from mu: the bias the study reports is real, and the sequence product is its floor."""
    mean, target = expected_estimate("sequence-product", "early_burst")
    torch.testing.assert_close(mean, target, rtol=0, atol=1e-12)
    for biased in ("tis", "prefix-product", "none"):
        estimate, _ = expected_estimate(biased, "early_burst")
        assert float((estimate - target).norm() / target.norm()) > 0.01, biased
    none, undrifted = expected_estimate("none", "none")  # no drift: plain REINFORCE is unbiased too
    torch.testing.assert_close(none, undrifted, rtol=0, atol=1e-12)


def test_a_quick_case_writes_every_variant_and_renders(tmp_path):
    rows = []
    for profile in ("none", "version_switch"):
        rows += study.case(16, profile, batches=4, batch_size=32, seed=1)
    assert {r["correction"] for r in rows} == set(study.CORRECTIONS)
    assert all(r["response_length"] == 16 and 0.0 <= r["kept_frac"] <= 1.0 for r in rows)
    control = {r["correction"]: r for r in rows if r["profile"] == "none"}
    assert control["none"]["mean_abs_log_ratio"] == 0.0
    payload = {
        "commit": "c" * 40,
        "machine": {"cpu": "x"},
        "results": {"rows": rows},
        "config": {"lengths": [16], "profiles": ["none", "version_switch"], "batches": 4, "batch_size": 32},
    }
    text = study.render(json.loads(json.dumps(payload)), tmp_path)
    assert "#### version_switch, strength 1" in text and "| prefix-product |" in text
    assert "| version_switch | 1 |" in text  # the summary row
    assert (tmp_path / "is_length_study.png").stat().st_size > 1000
    assert (tmp_path / "is_length_study.md").read_text().startswith("### Every correction")
