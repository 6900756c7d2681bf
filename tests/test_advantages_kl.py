"""Hand-computed cases for every advantage estimator and KL estimator, and the KL controllers."""

import math

import pytest
import torch

from reinforce_pro.algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    compute_advantages,
    token_level_rewards,
)
from reinforce_pro.algos.kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    build_kl_controller,
    compute_approx_kl,
    kl_loss,
)

# Two prompts x three samples; response lengths 3, 2, 1 | 3, 3, 2.
LENGTHS = [3, 2, 1, 3, 3, 2]
REWARDS = [1.0, 0.0, 2.0, 3.0, 3.0, 0.0]  # group means 1 and 2; group stds 1 and sqrt(3)
MASK = torch.arange(3)[None, :] < torch.tensor(LENGTHS)[:, None]


def broadcast(per_seq):
    """Expected (N, T) tensor: each sequence's value on its action tokens (gamma = 1, reward at the end)."""
    rows = [[v if t < n else 0.0 for t in range(3)] for v, n in zip(per_seq, LENGTHS, strict=True)]
    return torch.tensor(rows, dtype=torch.float64)


def whitened(per_seq, std_norm=True):
    tokens = [v for v, n in zip(per_seq, LENGTHS, strict=True) for _ in range(n)]
    mean = sum(tokens) / len(tokens)
    std = math.sqrt(sum((x - mean) ** 2 for x in tokens) / len(tokens)) if std_norm else 1.0
    return [(v - mean) / std for v in per_seq]


SQ3 = math.sqrt(3)
GROUP_SHAPED = {
    "rloo": [0.0, -1.5, 1.5, 1.5, 1.5, -3.0],  # r - mean of the other two
    "reinforce_baseline": whitened([0.0, -1.0, 1.0, 1.0, 1.0, -2.0]),
    "group_norm": [0.0, -1 / (1 + 1e-9), 1 / (1 + 1e-9), 1 / (SQ3 + 1e-9), 1 / (SQ3 + 1e-9), -2 / (SQ3 + 1e-9)],
    "dr_grpo": [0.0, -1.0, 1.0, 1.0, 1.0, -2.0],
    "reinforce": whitened(REWARDS),
    # OpenRLHF 0.11.2 experience_maker.py: `rewards - rewards.mean()` over the whole batch (mean 1.5), no whitening
    "flash_reinforce": [-0.5, -1.5, 0.5, 1.5, 1.5, -1.5],
}


@pytest.mark.parametrize("name", [pytest.param(n, id=n) for n in GROUP_SHAPED])
def test_outcome_estimators_hand_computed(name):
    inp = AdvantageInputs(rewards=torch.tensor(REWARDS, dtype=torch.float64), action_mask=MASK, group_size=3)
    adv, returns = compute_advantages(name, inp)
    torch.testing.assert_close(adv, broadcast(GROUP_SHAPED[name]).to(adv.dtype), atol=1e-9, rtol=0)
    if name != "reinforce_baseline" and name != "reinforce":
        torch.testing.assert_close(returns, adv, atol=0, rtol=0)


def test_reinforce_with_kl_penalty_discount_and_no_std_norm():
    # one sequence, reward 1, kl [0.1, 0.2, 0.3], kl_coef 0.5 -> token rewards [-0.05, -0.1, 0.85];
    # gamma 0.5 -> returns [0.1125, 0.325, 0.85]; whitening without std subtracts their mean.
    inp = AdvantageInputs(
        rewards=torch.tensor([1.0], dtype=torch.float64),
        action_mask=torch.ones(1, 3),
        kl=torch.tensor([[0.1, 0.2, 0.3]], dtype=torch.float64),
        kl_coef=0.5,
        gamma=0.5,
        std_norm=False,
    )
    adv, returns = compute_advantages("reinforce", inp)
    expected_returns = torch.tensor([[0.1125, 0.325, 0.85]], dtype=torch.float64)
    torch.testing.assert_close(returns, expected_returns, atol=1e-9, rtol=0)
    torch.testing.assert_close(adv, expected_returns - expected_returns.mean(), atol=1e-9, rtol=0)


@pytest.mark.parametrize("std_norm", [False, True])
def test_gae_hand_computed(std_norm):
    # values [0.5, 0.2, 0.1], reward 1 at the end, gamma 1, lambda 0.9:
    # deltas [-0.3, -0.1, 0.9]; A = [-0.3 + 0.9 * 0.71, -0.1 + 0.9 * 0.9, 0.9] = [0.339, 0.71, 0.9]
    values = torch.tensor([[0.5, 0.2, 0.1, 7.0]], dtype=torch.float64)
    inp = AdvantageInputs(
        rewards=torch.tensor([1.0], dtype=torch.float64),
        action_mask=torch.tensor([[1, 1, 1, 0]]),
        values=values,
        lambd=0.9,
        std_norm=std_norm,
    )
    adv, returns = compute_advantages("gae", inp)
    raw = [0.339, 0.71, 0.9]
    mean = sum(raw) / 3
    std = math.sqrt(sum((a - mean) ** 2 for a in raw) / 3) if std_norm else 1.0
    torch.testing.assert_close(
        adv, torch.tensor([[(a - mean) / std for a in raw] + [0.0]], dtype=torch.float64), atol=1e-9, rtol=0
    )
    torch.testing.assert_close(returns, torch.tensor([[0.839, 0.91, 1.0, 0.0]], dtype=torch.float64), atol=1e-9, rtol=0)


def test_token_level_rewards_clip_and_placement():
    mask = torch.tensor([[1, 1, 0], [0, 1, 1], [0, 0, 0]])
    out = token_level_rewards(torch.tensor([20.0, -3.0, 5.0]), mask, reward_clip_range=(-10.0, 10.0))
    torch.testing.assert_close(out, torch.tensor([[0.0, 10.0, 0.0], [0.0, 0.0, -3.0], [0.0, 0.0, 0.0]]))


def test_every_estimator_is_tested():
    assert set(GROUP_SHAPED) | {"gae"} == set(ADVANTAGE_ESTIMATORS)


@pytest.mark.parametrize(
    "name, inp_kwargs, match",
    [
        pytest.param("ppo", {}, "valid: gae, reinforce, rloo", id="unknown"),
        pytest.param("rloo", {"group_size": 1}, "n_samples_per_prompt >= 2", id="rloo-n1"),
        pytest.param("group_norm", {"group_size": 4}, "do not split into groups of 4", id="indivisible"),
        pytest.param("dr_grpo", {"group_size": 2, "gamma": 0.9}, "gamma == 1.0", id="gamma"),
        pytest.param("gae", {}, "needs critic values", id="gae-no-values"),
        pytest.param("flash_reinforce", {"gamma": 0.9}, "gamma == 1.0", id="flash-gamma"),
        pytest.param("reinforce", {"rewards": torch.zeros(6, 1)}, r"rewards must be \(N,\)", id="rewards-shape"),
    ],
)
def test_advantage_bad_input(name, inp_kwargs, match):
    args = {"rewards": torch.zeros(6), "action_mask": MASK, "group_size": 3}
    args.update(inp_kwargs)
    with pytest.raises(ValueError, match=match):
        compute_advantages(name, AdvantageInputs(**args))


# ------------------------------------------------------------------------------------- KL

LOGP = torch.tensor([[-1.0, -2.0, -1.0]], dtype=torch.float64)
REF = torch.tensor([[-1.5, -1.0, -31.0]], dtype=torch.float64)  # log ratios [0.5, -1.0, 30.0]


@pytest.mark.parametrize(
    "name, expected",
    [
        pytest.param("k1", [0.5, -1.0, 10.0], id="k1"),  # 30 clamped to 10
        pytest.param("k2", [0.125, 0.5, 10.0], id="k2"),
        # k3 = e^-x - 1 + x: 29 at x = 30, clamped to 10
        pytest.param("k3", [math.exp(-0.5) - 0.5, math.e - 2.0, 10.0], id="k3"),
    ],
)
def test_kl_estimators_hand_computed(name, expected):
    kl = compute_approx_kl(name, LOGP, REF)
    torch.testing.assert_close(kl, torch.tensor([expected], dtype=torch.float64), atol=1e-9, rtol=0)


def test_every_kl_estimator_is_tested():
    assert set(KL_ESTIMATORS) == {"k1", "k2", "k3"}


def test_kl_masked_and_loss():
    mask = torch.tensor([[1, 1, 0]])
    kl = compute_approx_kl("k2", LOGP, REF, mask)
    assert kl[0, 2] == 0
    loss, m = kl_loss("k2", LOGP, REF, mask, kl_coef=0.1)
    assert float(m["kl/loss_kl"]) == pytest.approx((0.125 + 0.5) / 2, abs=1e-12)
    assert float(loss) == pytest.approx(0.1 * (0.125 + 0.5) / 2, abs=1e-12)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_unbiased_gradient_keeps_the_value_and_gives_the_reverse_kl_gradient(estimator):
    """--kl_unbiased_gradient: the loss value is the estimator's; d loss / d log pi_t = w_t * (log pi_t - log ref_t)
    / tokens with w = pi / pi_old clipped at 10, for every estimator."""
    lp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -4.0, -1.0]], dtype=torch.float64)
    ref = lp + torch.tensor([[0.2, -0.4, 1.0], [0.0, 0.5, -3.0]], dtype=torch.float64)
    old = lp - torch.tensor([[0.1, -0.2, 3.0], [0.0, 0.0, 0.0]], dtype=torch.float64)  # w = e^.1, e^-.2, 10 (clipped)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    leaf = lp.clone().requires_grad_(True)
    loss, _ = kl_loss(estimator, leaf, ref, mask, 1.0, old_log_probs=old, unbiased_gradient=True)
    plain, _ = kl_loss(estimator, lp, ref, mask, 1.0)
    assert loss.item() == pytest.approx(plain.item(), abs=1e-12)
    (grad,) = torch.autograd.grad(loss, leaf)
    w = torch.tensor([[math.exp(0.1), math.exp(-0.2), 10.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    expected = torch.where(mask, w * (lp - ref), 0.0) / 5
    torch.testing.assert_close(grad, expected, atol=1e-12, rtol=0)


def test_kl_bad_input():
    with pytest.raises(ValueError, match="valid: k1, k2, k3"):
        compute_approx_kl("k4", LOGP, REF)
    with pytest.raises(ValueError, match=r"ref_log_probs=\(1, 2\)"):
        compute_approx_kl("k1", LOGP, REF[:, :2])


def test_adaptive_kl_controller_hand_computed():
    ctl = AdaptiveKLController(0.1, target=6.0, horizon=10000)
    ctl.update(current_kl=12.0, n_steps=256)  # error clipped to +0.2
    assert ctl.value == pytest.approx(0.1 * (1 + 0.2 * 256 / 10000), abs=1e-15)
    ctl.update(current_kl=5.4, n_steps=100)  # error -0.1
    assert ctl.value == pytest.approx(0.1 * (1 + 0.2 * 256 / 10000) * (1 - 0.1 * 100 / 10000), abs=1e-15)


def test_build_kl_controller():
    fixed = build_kl_controller(0.01, None, 10000)
    assert isinstance(fixed, FixedKLController)
    fixed.update(100.0, 1000)
    assert fixed.value == 0.01
    assert isinstance(build_kl_controller(0.01, 0.1, 10000), AdaptiveKLController)
    with pytest.raises(ValueError, match="kl_target > 0"):
        build_kl_controller(0.01, 0.0, 10000)


def test_length_penalties_follow_dapo_and_prorl():
    from reinforce_pro.algos.length_penalty import apply_length_penalties, overlong_penalty, stop_properly

    lengths = torch.tensor([4, 6, 7, 8, 10])  # max_new_tokens 8, buffer 4: the ramp starts after 4 tokens
    assert overlong_penalty(lengths, 8, 4, 2.0).tolist() == [0.0, -1.0, -1.5, -2.0, -2.0]  # capped at -factor
    rewards, truncated = torch.tensor([1.0, -1.0, 0.5]), torch.tensor([True, True, False])
    assert stop_properly(rewards, truncated, 0.5).tolist() == [0.5, -0.5, 0.5]
    assert stop_properly(rewards, truncated, -0.3).tolist() == pytest.approx([-0.3, -0.3, 0.5])
    shaped, metrics = apply_length_penalties(
        torch.ones(5), lengths, lengths >= 8, max_new_tokens=8, buffer_len=4, factor=1.0, stop_coef=0.0
    )
    assert shaped.tolist() == [1.0, 0.5, 0.25, 0.0, 0.0]  # ramp first, then the truncated ones scaled by 0
    assert metrics == pytest.approx({"length_penalty/overlong_frac": 0.8, "length_penalty/truncated_frac": 0.4})
    unchanged, none = apply_length_penalties(torch.ones(5), lengths, lengths >= 8, 8, None, 1.0, None)
    assert torch.equal(unchanged, torch.ones(5)) and none == {}
