"""Other trainers' reported breakages of the rollout-correction path, written from their descriptions, as
regression tests here. Each check runs on this project's loss and on a deliberately broken copy written the
way the reported code was, and must pass on the first and fail on the second (so the check can fail).

- OpenRLHF: ICEPOP's weight computed as exp(log ratio) * mask: a ratio that overflows to inf times its mask 0
  is NaN, and the whole step's loss with it.
- OpenRLHF: seq-mask-tis multiplied the loss by the raw exp(log ratio) of each token: an accepted sequence with
  one far-drifted token had an infinite loss, a rejected one 0 * inf = NaN.
- OpenRLHF: GSPO exponentiated the sequence's mean log ratio unbounded: inf on a far-drifted sequence.
- TRL: under top-k / top-p the trainer scored the full softmax, so every on-policy ratio was the kept mass
  (tests/test_sampling_filter.py: test_without_the_replay_the_ratio_is_the_kept_mass, and the engine case in
  tests/test_e2e.py).
"""

from __future__ import annotations

import pytest
import torch

from reinforce_pro.algos import losses
from reinforce_pro.algos.losses import PolicyLoss, SurrogateConfig
from reinforce_pro.algos.masked import masked_mean

FAR = 200.0  # a log ratio whose exp overflows float32 (exp(89) is already inf)


def finite_step(loss_fn, log_probs, old, rollout, advantages, mask) -> bool:
    """Whether one loss evaluation and its backward stay finite (the property every reported bug broke)."""
    lp = log_probs.clone().requires_grad_(True)
    loss = loss_fn(lp, old, advantages, mask, rollout)
    if not torch.isfinite(loss):
        return False
    loss.backward()
    return bool(torch.isfinite(lp.grad).all())


def ours(correction: str | None, policy_loss_type: str = "ppo"):
    cfg = SurrogateConfig(
        policy_loss_type=policy_loss_type, enable_vllm_is_correction=correction is not None,
        vllm_is_correction_type=correction or "tis", vllm_is_truncated_threshold=(0.5, 5.0),
    )  # fmt: skip
    loss = PolicyLoss(cfg)

    def fn(lp, old, adv, mask, rollout):
        return loss(lp, old, adv, action_mask=mask, rollout_log_probs=rollout)[0]

    return fn


def clipped_ppo(lp, old, adv, mask):
    """The per-token clipped surrogate, as every trainer writes it."""
    ratio = (lp - old).clamp(-20, 20).exp()
    return -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv)


def broken_icepop(lp, old, adv, mask, rollout):
    weight = torch.exp(old - rollout)  # unbounded
    keep = ((weight >= 0.5) & (weight <= 5.0)).float()
    return masked_mean(clipped_ppo(lp, old, adv, mask) * (weight * keep), mask)  # inf * 0 = NaN


def broken_seq_mask_tis(lp, old, adv, mask, rollout):
    seq = masked_mean(old - rollout, mask, dim=-1).exp()
    keep = ((seq >= 0.5) & (seq <= 5.0)).unsqueeze(-1).float()
    return masked_mean(clipped_ppo(lp, old, adv, mask) * keep * torch.exp(old - rollout), mask)


def batch(drifted: torch.Tensor, advantage: float):
    """Two rows of three tokens; `drifted` (2, 3): old - rollout log ratios (the engine's log-probs far off)."""
    old = torch.full((2, 3), -1.0)
    return old.clone(), old, old - drifted, torch.full((2, 3), advantage), torch.ones(2, 3, dtype=torch.bool)


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_icepop_never_multiplies_an_overflowed_ratio_by_its_mask(advantage):
    drifted = torch.tensor([[FAR, 0.0, 0.0], [0.0, 0.1, 0.0]])  # one token's ratio overflows: icepop masks it
    args = batch(drifted, advantage)
    assert finite_step(ours("icepop"), *args)
    assert not finite_step(broken_icepop, *args)


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_seq_mask_tis_accepts_and_rejects_far_drifted_tokens_with_a_finite_loss(advantage):
    # row 0: the geometric mean is exp(0) = 1 (accepted) with tokens at +-FAR; row 1: far off (rejected)
    drifted = torch.tensor([[FAR, -FAR, 0.0], [FAR, FAR, FAR]])
    args = batch(drifted, advantage)
    assert finite_step(ours("seq-mask-tis"), *args)
    assert not finite_step(broken_seq_mask_tis, *args)


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_gspo_bounds_the_sequence_ratio_before_exp(advantage, monkeypatch):
    old = torch.zeros(2, 3)
    lp = torch.tensor([[FAR, FAR, FAR], [FAR, -FAR, 0.0]])  # row 0 far off; row 1's mean log ratio is 0
    mask = torch.ones(2, 3, dtype=torch.bool)
    args = (lp, old, old, torch.full((2, 3), advantage), mask)
    assert finite_step(ours(None, "gspo"), *args)
    ratio = losses._gspo_ratio(lp - old, mask)
    assert ratio[1].tolist() == pytest.approx([1.0] * 3)  # the mean is bounded, not each token
    monkeypatch.setitem(
        losses.POLICY_LOSSES, "gspo", lambda lr, m: masked_mean(lr, m, dim=-1).exp().unsqueeze(-1) * m
    )  # the reported code: no bound before exp
    assert not finite_step(ours(None, "gspo"), *args)
