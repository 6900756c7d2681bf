"""What every importance-sampling correction reads: `ISInputs`, built once per call by `is_inputs`.

The trainer gates one policy against the rollout engine's: the trainer's old policy (the `old` anchor, this
project's default) or the current policy being optimised (the `rollout` anchor: DPPO, CPPO, verl's bypass
mode). `is_inputs` takes that numerator policy's log-probs and the engine's, and sanitises both once: a token
whose log-probs are not both finite is left out (`valid` is False there), ratios are clamped before `exp`, and
everything is 0 or 1 off the valid tokens so that no correction has to select with the mask again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

LOG_RATIO_BOUND = 20.0  # exp(20) ~ 4.9e8: far outside any useful band, still finite in float32


@dataclass(frozen=True)
class ISInputs:
    """Sanitised inputs shared by every correction. "numerator" is the policy gated against the rollout policy:
    the trainer's old policy, or the current one under the rollout anchor."""

    log_ratio: torch.Tensor  # (B, T) numerator - rollout, clamped to +-LOG_RATIO_BOUND, 0 where not `valid`
    ratio: torch.Tensor  # (B, T) exp(log_ratio): 1 where not `valid`
    action_mask: torch.Tensor  # (B, T) bool, the tokens that are trained
    valid: torch.Tensor  # (B, T) bool, action tokens whose numerator and rollout log-probs are both finite
    nonfinite: torch.Tensor  # (B, T) bool, action tokens with a NaN/inf numerator or rollout log-prob
    any_nonfinite: bool  # nonfinite.any(), read once so the common case skips the prefix-break scan
    low: float
    high: float
    prob: torch.Tensor  # (B, T) numerator probability of the sampled token, 1 where not `valid`
    rollout_prob: torch.Tensor  # (B, T) the rollout policy's, 1 where not `valid`
    advantages: torch.Tensor | None = None  # (B, T) 0 off the action tokens; None when the caller has none
    params: Mapping[str, float] = field(default_factory=dict)  # the correction's own settings, defaults filled in


def in_band(x: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """low <= x <= high, elementwise (NaN is out of band); two passes instead of three."""
    return x.clamp(min=low, max=high) == x


def prefix_live(inp: ISInputs) -> torch.Tensor:
    """(B, T) valid tokens before any non-finite one of their sequence: a prefix ends at the first unknown ratio
    (what every prefix-level correction gates on)."""
    if not inp.any_nonfinite:
        return inp.valid
    return inp.valid & ~(torch.cumsum(inp.nonfinite, dim=-1, dtype=torch.int32) > 0)


def prefix_geomean(inp: ISInputs) -> torch.Tensor:
    """(B, T) geometric mean of rho over the valid action tokens up to and including each column (1 before the
    first): reinforce_pro's prefix statistic."""
    # log_ratio is already 0 off the valid tokens, so its cumsum is the sum over valid tokens <= t.
    count = torch.cumsum(inp.valid, dim=-1, dtype=torch.int32).clamp_(min=1)  # int cumsum: faster on CPU
    return torch.cumsum(inp.log_ratio, dim=-1).div_(count).exp_()


def is_inputs(
    numerator_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    action_mask: torch.Tensor,
    low: float,
    high: float,
    advantages: torch.Tensor | None = None,
    params: Mapping[str, float] | None = None,
) -> ISInputs:
    """The sanitised inputs every correction reads; every tensor (B, T). advantages: per-token advantages, or
    (B,) / (B, 1) per sequence (broadcast), or None."""
    check_same_shape(old_log_probs=numerator_log_probs, rollout_log_probs=rollout_log_probs, action_mask=action_mask)
    dtype = torch.promote_types(numerator_log_probs.dtype, torch.float32)
    num, rollout = numerator_log_probs.detach().to(dtype), rollout_log_probs.detach().to(dtype)
    action = action_mask.bool()
    finite = torch.isfinite(num) & torch.isfinite(rollout)
    valid = action & finite
    nonfinite = action & ~finite
    zero = torch.zeros((), dtype=dtype, device=num.device)
    log_ratio = torch.where(valid, num - rollout, zero).clamp_(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    return ISInputs(
        log_ratio=log_ratio,
        ratio=log_ratio.exp(),
        action_mask=action,
        valid=valid,
        nonfinite=nonfinite,
        any_nonfinite=bool(nonfinite.any()),
        low=float(low),
        high=float(high),
        prob=torch.where(valid, num, zero).exp(),
        rollout_prob=torch.where(valid, rollout, zero).exp(),
        advantages=_token_advantages(advantages, action, dtype),
        params=dict(params or {}),
    )


def _token_advantages(advantages: torch.Tensor | None, action: torch.Tensor, dtype: torch.dtype):
    """(B, T) advantages, 0 off the action tokens (where they may hold junk); None stays None."""
    if advantages is None:
        return None
    adv = advantages.detach().to(dtype)
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1)
    adv = adv.expand(action.shape)
    return torch.where(action, adv, torch.zeros((), dtype=dtype, device=adv.device))


def check_same_shape(**tensors: torch.Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError("shape mismatch: " + ", ".join(f"{k}={v}" for k, v in shapes.items()))
    if len(next(iter(shapes.values()))) != 2:
        raise ValueError("expected (B, T) tensors, got " + ", ".join(f"{k}={v}" for k, v in shapes.items()))
