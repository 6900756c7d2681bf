"""KL estimators between the policy and the reference model, and the KL coefficient controllers.

With log_ratio = log pi(a) - log pi_ref(a) for the sampled token a ~ pi (Schulman, "Approximating KL
divergence", 2020):
- k1 = log_ratio: unbiased for KL(pi || pi_ref), high variance, can be negative;
- k2 = log_ratio^2 / 2: biased, low variance, its gradient is the KL gradient to first order;
- k3 = (r - 1) - log r with r = pi_ref / pi: unbiased, always >= 0.
Every estimate is clamped to [-10, 10], as in OpenRLHF, so one outlier token cannot dominate a batch.

KL enters training in one of two ways (`--use_kl_loss` picks): as a per-token reward penalty
-kl_coef * KL (see advantages.token_level_rewards), or as a loss term kl_coef * aggregate(KL).
The coefficient is fixed (`FixedKLController`) or adapted towards `--kl_target`
(`AdaptiveKLController`, Ziegler et al., 2019, arXiv:1909.08593).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from reinforce_pro.algos.masked import aggregate_loss
from reinforce_pro.algos.stats import Stat, loss_stat

KL_CLAMP = 10.0
KL_IS_WEIGHT_CLIP = 10.0  # --kl_unbiased_gradient's bound on pi / pi_old, as OpenRLHF 0.11.2 bounds it


def _k1(log_ratio: torch.Tensor) -> torch.Tensor:
    return log_ratio


def _k2(log_ratio: torch.Tensor) -> torch.Tensor:
    return log_ratio.square() / 2.0


def _k3(log_ratio: torch.Tensor) -> torch.Tensor:
    neg = -log_ratio  # log(pi_ref / pi)
    return neg.exp() - 1.0 - neg


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"k1": _k1, "k2": _k2, "k3": _k3}


def compute_approx_kl(
    estimator: str,
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    action_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token KL estimate (B, T), float32 or wider, clamped to +-KL_CLAMP; 0 where action_mask is 0."""
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown kl_estimator {estimator!r}; valid: {', '.join(KL_ESTIMATORS)}")
    if log_probs.shape != ref_log_probs.shape:
        raise ValueError(
            f"KL shape mismatch: log_probs={tuple(log_probs.shape)}, ref_log_probs={tuple(ref_log_probs.shape)}"
        )
    dtype = torch.promote_types(log_probs.dtype, torch.float32)
    log_ratio = log_probs.to(dtype) - ref_log_probs.to(dtype)
    if action_mask is not None:
        log_ratio = torch.where(action_mask.bool(), log_ratio, torch.zeros((), dtype=dtype, device=log_ratio.device))
    return KL_ESTIMATORS[estimator](log_ratio).clamp(-KL_CLAMP, KL_CLAMP)


def kl_loss(
    estimator: str,
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    action_mask: torch.Tensor,
    kl_coef: float,
    token_level_loss: bool = True,
    dp_size: int = 1,
    batch_num_tokens: float | None = None,
    global_batch_size: float | None = None,
    *,
    old_log_probs: torch.Tensor | None = None,
    unbiased_gradient: bool = False,
) -> tuple[torch.Tensor, dict[str, Stat]]:
    """`--use_kl_loss`: kl_coef * aggregate(KL estimate), same aggregation as the policy loss; the metric
    `kl/loss_kl` is the aggregated estimate before the coefficient.

    unbiased_gradient (OpenRLHF 0.11.2's `--algo.kl.unbiased_gradient`): the value stays the estimator's, the
    gradient becomes the reverse KL's own, importance-weighted for samples of the old policy:
    w * k1 * grad log pi with w = pi / pi_old (detached, at most KL_IS_WEIGHT_CLIP), through the gradient of
    w * log_ratio^2 / 2 (a straight-through term). k1, k2 and k3 then share that gradient."""
    agg = (token_level_loss, dp_size, batch_num_tokens, global_batch_size)
    kl = compute_approx_kl(estimator, log_probs, ref_log_probs, action_mask)
    if unbiased_gradient:
        kl = kl.detach() + _kl_gradient_surrogate(log_probs, ref_log_probs, old_log_probs, action_mask)
    mean_kl = aggregate_loss(kl, action_mask, *agg)
    return kl_coef * mean_kl, {"kl/loss_kl": loss_stat(mean_kl, action_mask, *agg)}


def _kl_gradient_surrogate(log_probs, ref_log_probs, old_log_probs, action_mask) -> torch.Tensor:
    """(B, T), value 0, gradient that of w * log_ratio^2 / 2 (w = pi / pi_old detached and clipped; 1 without
    old log-probs); 0 off the action tokens."""
    dtype = torch.promote_types(log_probs.dtype, torch.float32)
    mask = action_mask.bool()
    zero = torch.zeros((), dtype=dtype, device=log_probs.device)
    log_ratio = torch.where(mask, log_probs.to(dtype) - ref_log_probs.to(dtype), zero)
    w = torch.ones((), dtype=dtype, device=log_probs.device)
    if old_log_probs is not None:
        w = torch.where(mask, log_probs.to(dtype) - old_log_probs.to(dtype), zero).exp().clamp(max=KL_IS_WEIGHT_CLIP)
    surrogate = w.detach() * log_ratio.square() / 2.0
    return surrogate - surrogate.detach()


class FixedKLController:
    """A constant KL coefficient."""

    def __init__(self, kl_coef: float) -> None:
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        pass


class AdaptiveKLController:
    """Moves the coefficient so the observed KL tracks `target`, by at most 20% error per horizon."""

    def __init__(self, init_kl_coef: float, target: float, horizon: int) -> None:
        if target <= 0 or horizon <= 0:
            raise ValueError(f"adaptive KL needs kl_target > 0 and kl_horizon > 0, got {target}, {horizon}")
        self.value = init_kl_coef
        self.target = target
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        proportional_error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon


def build_kl_controller(
    init_kl_coef: float, kl_target: float | None, kl_horizon: int
) -> FixedKLController | AdaptiveKLController:
    """`--kl_target` unset -> fixed coefficient; set -> adaptive."""
    if kl_target is None:
        return FixedKLController(init_kl_coef)
    return AdaptiveKLController(init_kl_coef, kl_target, kl_horizon)
