"""Advantage estimators, with OpenRLHF v0.9.10's meaning of `--advantage_estimator`.

Each estimator maps one rollout batch to (advantages, returns), both (N, T) over response tokens. The
batch holds N = num_prompts * group_size samples, ordered so that the `group_size`
(`--n_samples_per_prompt`) samples of one prompt are consecutive. The pipeline is OpenRLHF's:

1. group shaping of the sequence rewards (rloo, reinforce_baseline, group_norm, dr_grpo);
2. token rewards: clip to `reward_clip_range`, put the reward on the last action token, add the
   per-token KL penalty -kl_coef * KL;
3. returns: GAE with the critic's values (gae) or discounted cumulative sums (all others);
4. batch whitening over all action tokens for gae, reinforce and reinforce_baseline (mean, and std
   unless `--no_advantage_std_norm`).

| name               | shaping                          | returns    | batch whitening |
|--------------------|----------------------------------|------------|-----------------|
| gae                | -                                | GAE        | yes             |
| reinforce          | -                                | cumulative | yes             |
| rloo               | r - mean of the other samples    | cumulative | no              |
| reinforce_baseline | r - group mean                   | cumulative | yes             |
| group_norm (GRPO)  | (r - group mean) / (std + 1e-9)  | cumulative | no              |
| dr_grpo            | r - group mean                   | cumulative | no              |
| flash_reinforce    | r - mean of the whole batch      | cumulative | no              |

`flash_reinforce` is OpenRLHF 0.11.2's estimator for one sample per prompt (FlashREINFORCE): with no group, the
baseline is the rollout batch's mean reward.

Group estimators need gamma == 1 (OpenRLHF forces it with a warning; here it is an error).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from reinforce_pro.algos.masked import masked_mean, masked_sum

GROUP_STD_EPS = 1e-9
WHITEN_VAR_EPS = 1e-8


@dataclass(frozen=True)
class AdvantageInputs:
    rewards: torch.Tensor  # (N,) one scalar reward per sample, groups of `group_size` consecutive samples
    action_mask: torch.Tensor  # (N, T) 1 on response tokens that are trained
    group_size: int = 1  # --n_samples_per_prompt
    kl: torch.Tensor | None = None  # (N, T) per-token KL(policy || ref) estimate for the reward penalty
    kl_coef: float = 0.0  # --init_kl_coef (current value of the controller); 0 with --use_kl_loss
    values: torch.Tensor | None = None  # (N, T) critic values, gae only
    gamma: float = 1.0
    lambd: float = 1.0
    std_norm: bool = True  # False with --no_advantage_std_norm
    reward_clip_range: tuple[float, float] | None = None  # --reward_clip_range
    # (N, T) extra token rewards, e.g. a multi-turn episode's per-turn rewards on each turn's last model
    # token (--agent_reward_mode per_turn). Added after clipping; reinforce and gae only.
    turn_rewards: torch.Tensor | None = None


Estimator = Callable[[AdvantageInputs], tuple[torch.Tensor, torch.Tensor]]


def token_level_rewards(
    rewards: torch.Tensor,
    action_mask: torch.Tensor,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    reward_clip_range: tuple[float, float] | None = None,
) -> torch.Tensor:
    """(N,) sequence rewards -> (N, T) token rewards: the clipped reward on each sequence's last action
    token, plus -kl_coef * kl on every action token."""
    mask = action_mask.bool()
    if reward_clip_range is not None:
        rewards = rewards.clamp(min=reward_clip_range[0], max=reward_clip_range[1])
    t = mask.size(1)
    last = t - 1 - mask.flip(dims=[1]).to(torch.int8).argmax(dim=1)  # (N,) index of the last action token
    dtype = torch.promote_types(rewards.dtype, torch.float32)
    out = torch.zeros(mask.shape, dtype=dtype, device=rewards.device)
    out.scatter_(1, last.unsqueeze(1), rewards.to(dtype).unsqueeze(1))
    out = torch.where(mask, out, torch.zeros((), dtype=dtype, device=out.device))  # rows with no action
    if kl is not None and kl_coef > 0:
        out = out - kl_coef * torch.where(mask, kl.to(dtype), torch.zeros((), dtype=dtype, device=out.device))
    return out


def discounted_returns(token_rewards: torch.Tensor, action_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """returns_t = sum_{s >= t} gamma^(s - t) r_s over action tokens, (N, T)."""
    r = torch.where(action_mask.bool(), token_rewards, torch.zeros_like(token_rewards))
    returns = torch.zeros_like(r)
    running = torch.zeros_like(r[:, 0])
    for t in reversed(range(r.size(1))):
        running = r[:, t] + gamma * running
        returns[:, t] = running
    return returns


def gae(values: torch.Tensor, token_rewards: torch.Tensor, action_mask: torch.Tensor, gamma: float, lambd: float):
    """Generalised advantage estimation (Schulman et al., 2015); returns (advantages, returns), (N, T)."""
    mask = action_mask.bool()
    v = torch.where(mask, values, torch.zeros_like(values)).to(token_rewards.dtype)
    r = torch.where(mask, token_rewards, torch.zeros_like(token_rewards))
    advantages = torch.zeros_like(r)
    last_gae = torch.zeros_like(r[:, 0])
    for t in reversed(range(r.size(1))):
        next_value = v[:, t + 1] if t + 1 < r.size(1) else torch.zeros_like(last_gae)
        delta = r[:, t] + gamma * next_value - v[:, t]
        last_gae = delta + gamma * lambd * last_gae
        advantages[:, t] = last_gae
    return advantages, advantages + v


def whiten(advantages: torch.Tensor, action_mask: torch.Tensor, std_norm: bool = True) -> torch.Tensor:
    """Subtract the mean over all action tokens of the batch and, if std_norm, divide by their std."""
    mask = action_mask.bool()
    mean = masked_mean(advantages, mask)
    centered = advantages - mean
    if not std_norm:
        return centered
    var = masked_sum(centered.square(), mask) / mask.sum().clamp(min=1)
    return centered * var.clamp(min=WHITEN_VAR_EPS).rsqrt()


def _groups(inp: AdvantageInputs, name: str) -> torch.Tensor:
    """(N,) rewards -> (N / group_size, group_size), checking what the group estimators need."""
    n = inp.group_size
    if inp.turn_rewards is not None:
        raise ValueError(f"advantage_estimator {name!r} shapes one reward per sample: per-turn token rewards need "
                         "reinforce or gae")  # fmt: skip
    if n < 2:
        raise ValueError(f"advantage_estimator {name!r} needs n_samples_per_prompt >= 2, got {n}")
    if inp.rewards.numel() % n != 0:
        raise ValueError(f"advantage_estimator {name!r}: {inp.rewards.numel()} rewards do not split into groups of {n}")
    if inp.gamma != 1.0:
        raise ValueError(f"advantage_estimator {name!r} needs gamma == 1.0, got {inp.gamma}")
    return inp.rewards.reshape(-1, n)


def _returns_from(shaped: torch.Tensor, inp: AdvantageInputs) -> torch.Tensor:
    rewards = token_level_rewards(shaped.reshape(-1), inp.action_mask, inp.kl, inp.kl_coef, inp.reward_clip_range)
    return discounted_returns(_with_turn_rewards(rewards, inp), inp.action_mask, inp.gamma)


def _with_turn_rewards(token_rewards: torch.Tensor, inp: AdvantageInputs) -> torch.Tensor:
    if inp.turn_rewards is None:
        return token_rewards
    mask = inp.action_mask.bool()
    return token_rewards + torch.where(mask, inp.turn_rewards.to(token_rewards.dtype), torch.zeros_like(token_rewards))


def _gae(inp: AdvantageInputs):
    if inp.values is None:
        raise ValueError("advantage_estimator 'gae' needs critic values (set --critic_pretrain)")
    rewards = token_level_rewards(inp.rewards, inp.action_mask, inp.kl, inp.kl_coef, inp.reward_clip_range)
    advantages, returns = gae(inp.values, _with_turn_rewards(rewards, inp), inp.action_mask, inp.gamma, inp.lambd)
    return whiten(advantages, inp.action_mask, inp.std_norm), returns


def _reinforce(inp: AdvantageInputs):
    returns = _returns_from(inp.rewards, inp)
    return whiten(returns, inp.action_mask, inp.std_norm), returns


def _rloo(inp: AdvantageInputs):
    g = _groups(inp, "rloo")
    baseline = (g.sum(dim=-1, keepdim=True) - g) / (g.size(1) - 1)  # mean of the other samples
    returns = _returns_from(g - baseline, inp)
    return returns.clone(), returns


def _reinforce_baseline(inp: AdvantageInputs):
    g = _groups(inp, "reinforce_baseline")
    returns = _returns_from(g - g.mean(dim=-1, keepdim=True), inp)
    return whiten(returns, inp.action_mask, inp.std_norm), returns


def _group_norm(inp: AdvantageInputs):
    g = _groups(inp, "group_norm")
    shaped = (g - g.mean(dim=-1, keepdim=True)) / (g.std(dim=-1, keepdim=True) + GROUP_STD_EPS)
    returns = _returns_from(shaped, inp)
    return returns.clone(), returns


def _dr_grpo(inp: AdvantageInputs):
    g = _groups(inp, "dr_grpo")
    returns = _returns_from(g - g.mean(dim=-1, keepdim=True), inp)
    return returns.clone(), returns


def _flash_reinforce(inp: AdvantageInputs):
    if inp.gamma != 1.0:
        raise ValueError(f"advantage_estimator 'flash_reinforce' needs gamma == 1.0, got {inp.gamma}")
    returns = _returns_from(inp.rewards - inp.rewards.mean(), inp)
    return returns.clone(), returns


ADVANTAGE_ESTIMATORS: dict[str, Estimator] = {
    "gae": _gae,
    "reinforce": _reinforce,
    "rloo": _rloo,
    "reinforce_baseline": _reinforce_baseline,
    "group_norm": _group_norm,
    "dr_grpo": _dr_grpo,
    "flash_reinforce": _flash_reinforce,
}


def compute_advantages(estimator: str, inp: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Look up `estimator` in ADVANTAGE_ESTIMATORS and run it: (advantages, returns), (N, T), detached."""
    if estimator not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"unknown advantage_estimator {estimator!r}; valid: {', '.join(ADVANTAGE_ESTIMATORS)}")
    if inp.rewards.dim() != 1 or inp.rewards.size(0) != inp.action_mask.size(0):
        raise ValueError(
            f"rewards must be (N,) with N = action_mask.size(0); got rewards={tuple(inp.rewards.shape)}, "
            f"action_mask={tuple(inp.action_mask.shape)}"
        )
    for name in ("kl", "values", "turn_rewards"):
        t = getattr(inp, name)
        if t is not None and t.shape != inp.action_mask.shape:
            raise ValueError(f"{name}={tuple(t.shape)} must match action_mask={tuple(inp.action_mask.shape)}")
    with torch.no_grad():
        advantages, returns = ADVANTAGE_ESTIMATORS[estimator](inp)
    zero = torch.zeros((), dtype=advantages.dtype, device=advantages.device)
    mask = inp.action_mask.bool()
    return torch.where(mask, advantages, zero), torch.where(mask, returns, zero)
