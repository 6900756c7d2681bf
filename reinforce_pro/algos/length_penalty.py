"""Reward penalties on response length, with OpenRLHF's flags; applied to the sequence rewards before the
advantage estimator (so before group shaping, clipping and normalisation).

- DAPO's overlong penalty (`--overlong_buffer_len B --overlong_penalty_factor F`, G = max_new_tokens):
  a response of L tokens loses F * min(L - (G - B), B) / B when L > G - B: nothing up to G - B tokens, then
  a linear ramp to -F at the token limit.
- ProRL's stop-properly penalty (`--stop_properly_penalty_coef c`), for responses that hit the token limit
  instead of stopping: with c in [0, 1] their reward is multiplied by c; with c < 0 it is replaced by c.
"""

from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, max_new_tokens: int, buffer_len: float, factor: float) -> torch.Tensor:
    """(N,) penalties (<= 0) for responses of `lengths` tokens."""
    exceed = (lengths.float() - (max_new_tokens - buffer_len)).clamp(min=0, max=buffer_len)
    return -factor * exceed / buffer_len


def stop_properly(rewards: torch.Tensor, truncated: torch.Tensor, coef: float) -> torch.Tensor:
    """Rewards with those of truncated responses scaled by `coef` (coef >= 0) or set to it (coef < 0)."""
    penalised = rewards * coef if coef >= 0 else torch.full_like(rewards, coef)
    return torch.where(truncated.bool(), penalised, rewards)


def apply_length_penalties(
    rewards: torch.Tensor, lengths: torch.Tensor, truncated: torch.Tensor, max_new_tokens: int,
    buffer_len: float | None, factor: float, stop_coef: float | None,
) -> tuple[torch.Tensor, dict[str, float]]:  # fmt: skip
    """(rewards after the configured penalties, metrics: the fraction of rows each one changed)."""
    metrics = {}
    if buffer_len is not None:
        penalty = overlong_penalty(lengths, max_new_tokens, buffer_len, factor)
        rewards = rewards + penalty
        metrics["length_penalty/overlong_frac"] = float((penalty < 0).float().mean())
    if stop_coef is not None:
        rewards = stop_properly(rewards, truncated, stop_coef)
        metrics["length_penalty/truncated_frac"] = float(truncated.float().mean())
    return rewards, metrics
