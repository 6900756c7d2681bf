"""Policy and value losses.

`PolicyLoss` follows OpenRLHF's `PolicyLoss` (constructor keywords, forward arguments, and for finite
inputs the same loss value): PPO with optional dual clip, or GSPO, optionally multiplied by the
importance-sampling weight of `is_correction.IS_CORRECTIONS`. Differences from OpenRLHF, all for safety:
- masked positions are selected out with `torch.where`, so a NaN/inf under action_mask == 0 changes
  neither the loss nor its gradient;
- the IS weights come from `compute_is_weights` (non-finite log-probs get weight 0, reinforce_pro added);
- the sequence-level mean divides by the exact token count (OpenRLHF adds 1e-8 to it);
- `forward` returns `(loss, metrics)` instead of a tuple of loose tensors.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from reinforce_pro.algos.is_correction import (
    compute_is_weights,
    correction_params,
    load_user_correction,
    position_metrics,
    validate_is_config,
)
from reinforce_pro.algos.masked import aggregate_loss, masked_mean
from reinforce_pro.algos.stats import Stat, loss_stat, mean_stat
from reinforce_pro.flagspec import flag

PPO_LOG_RATIO_BOUND = 20.0
DEFAULT_IS_THRESHOLD = (0.5, 5.0)
# What the correction gates against the rollout policy: the trainer's old policy (the surrogate's ratio is
# pi / pi_old, the correction's weight multiplies it), or the current policy (the surrogate's ratio is
# pi / pi_rollout, verl's bypass mode, DPPO, CPPO; the correction contributes only its mask).
IS_ANCHORS = ("old", "rollout")


def _ppo_ratio(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-level ratio pi / pi_old, (B, T)."""
    return log_ratio.clamp(-PPO_LOG_RATIO_BOUND, PPO_LOG_RATIO_BOUND).exp()


def _gspo_ratio(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO (Zheng et al., 2025, arXiv:2507.18071): the length-normalised sequence ratio
    exp(mean_t log_ratio), broadcast to the sequence's tokens, (B, T). The mean is bounded before `exp`, as the
    token ratio is: an unbounded one overflows to inf on a far-drifted sequence, and the loss and gradient with
    it. The mean, not each token: a sequence of log-ratios (100, -100) keeps its ratio of 1."""
    seq_log_ratio = masked_mean(log_ratio, mask, dim=-1).clamp(-PPO_LOG_RATIO_BOUND, PPO_LOG_RATIO_BOUND)
    return seq_log_ratio.exp().unsqueeze(-1) * mask.to(log_ratio.dtype)


# --policy_loss_type -> the ratio entering the clipped surrogate.
POLICY_LOSSES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "ppo": _ppo_ratio,
    "gspo": _gspo_ratio,
}


@dataclass
class SurrogateConfig:
    """What the policy loss is: its one definition of defaults and checks. The CLI builds it from the flags
    (cli/flags_to_config.py), the policy worker hands it to PolicyLoss unchanged."""

    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    # fmt: off
    dual_clip: float | None = flag(None, "dual-clip constant (> 1)", dotted="actor.dual_clip", above=1.0,
        group="training")
    token_level_loss: bool = True
    policy_loss_type: str = flag("ppo", "policy loss", dotted="actor.policy_loss_type", choices=POLICY_LOSSES,
        group="training")
    enable_vllm_is_correction: bool = False
    vllm_is_truncated_threshold: tuple[float, float] = DEFAULT_IS_THRESHOLD
    vllm_is_correction_type: str = "tis"
    vllm_is_correction_path: str | None = flag(None,
        "[reinforce_pro] with --enable_vllm_is_correction: a .py file defining correction(inp: ISInputs) -> (weights,"
        " keep, metrics), used instead of --vllm_is_correction_type (docs/algorithms.md)", group="engines")
    vllm_is_correction_args: dict[str, float] = field(default_factory=dict)  # the correction's own settings
    vllm_is_anchor: str = flag("old",
        "[reinforce_pro] what the correction gates against the rollout policy: old (the trainer's old policy; the "
        "surrogate's ratio is pi / pi_old) or rollout (the current policy, as DPPO, CPPO and verl's bypass mode: the "
        "surrogate's ratio is pi / pi_rollout and the correction adds only its mask)", choices=IS_ANCHORS,
        group="engines")
    # fmt: on
    position_metrics: bool = False  # with IS: also is_pos/* (is_correction.position_metrics), every correction

    def __post_init__(self) -> None:
        if self.policy_loss_type not in POLICY_LOSSES:
            raise ValueError(f"unknown policy_loss_type {self.policy_loss_type!r}; valid: {', '.join(POLICY_LOSSES)}")
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1.0 (Dual-clip PPO, arXiv:1912.09729), got {self.dual_clip}")
        low, high = self.vllm_is_truncated_threshold
        if self.vllm_is_anchor not in IS_ANCHORS:
            raise ValueError(f"unknown vllm_is_anchor {self.vllm_is_anchor!r}; valid: {', '.join(IS_ANCHORS)}")
        correction = self.vllm_is_correction_path or self.vllm_is_correction_type
        validate_is_config(self.vllm_is_correction_type, low, high)
        correction_params(correction, self.vllm_is_correction_args)  # a setting the correction lacks stops here
        self.vllm_is_truncated_threshold = (float(low), float(high))
        if self.vllm_is_correction_path is not None:
            if not self.enable_vllm_is_correction:
                raise ValueError("--vllm_is_correction_path needs --enable_vllm_is_correction")
            load_user_correction(self.vllm_is_correction_path)  # fails here, at start-up, if it is broken

    def correction(self):
        """What compute_is_weights applies: the user's function (loaded in this process) or the type's name."""
        if self.vllm_is_correction_path is None:
            return self.vllm_is_correction_type
        return load_user_correction(self.vllm_is_correction_path)


class PolicyLoss(nn.Module):
    """Clipped policy-gradient loss with optional rollout/training-mismatch IS correction."""

    def __init__(self, settings: SurrogateConfig | None = None, **fields) -> None:
        """`PolicyLoss(settings)`, or `PolicyLoss(**fields)` as shorthand for
        `PolicyLoss(SurrogateConfig(**fields))`."""
        super().__init__()
        if settings is not None and fields:
            raise TypeError("give PolicyLoss a SurrogateConfig or its fields, not both")
        self.settings = s = settings if settings is not None else SurrogateConfig(**fields)
        self.correction = s.correction() if s.enable_vllm_is_correction else None
        # Rollout anchor: the surrogate's ratio is pi / pi_rollout (ppo only; GSPO under IS always is).
        self.rollout_anchored = s.enable_vllm_is_correction and s.vllm_is_anchor == "rollout"
        self.rollout_anchored &= s.policy_loss_type == "ppo"
        # GSPO is defined on sequences: its loss is always the mean of per-sequence means (as in OpenRLHF).
        self.token_level_loss = s.token_level_loss and s.policy_loss_type != "gspo"
        if s.enable_vllm_is_correction and s.policy_loss_type == "gspo" and self.correction != "tis":
            warnings.warn(
                f"policy_loss_type=gspo corrects the mismatch through its sequence ratio against the rollout "
                f"log-probs; vllm_is_correction_type={s.vllm_is_correction_type!r} is not applied",
                stacklevel=2,
            )

    def forward(
        self,
        log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        action_mask: torch.Tensor | None = None,
        rollout_log_probs: torch.Tensor | None = None,
        dp_size: int = 1,
        batch_num_tokens: float | None = None,
        global_batch_size: float | None = None,
    ) -> tuple[torch.Tensor, dict[str, Stat]]:
        """log_probs (B, T) with grad; old_log_probs, rollout_log_probs, advantages, action_mask (B, T).

        Returns the scalar loss and metrics (`policy/clip_frac`, `policy/ppo_kl`, `is/*`): Stats of 0-dim
        tensors, each with its reduction over micro-batches and ranks (algos/stats.py).
        """
        if action_mask is None:
            action_mask = torch.ones_like(log_probs, dtype=torch.bool)
        self._check_inputs(log_probs, old_log_probs, advantages, action_mask, rollout_log_probs)
        mask = action_mask.bool()
        use_is = self.settings.enable_vllm_is_correction
        zero = torch.zeros((), dtype=log_probs.dtype, device=log_probs.device)
        # Sanitise before any arithmetic: torch.where keeps a NaN out of the value but not out of the
        # gradient (d exp(x) = 0 * exp(NaN) = NaN), so nothing non-finite may enter the graph at all.
        # Under IS a token with a non-finite old/rollout log-prob is dropped by its weight of 0.
        live = mask
        if use_is:
            live = mask & torch.isfinite(old_log_probs) & torch.isfinite(rollout_log_probs)
        advantages = torch.where(mask, advantages, zero)
        base = rollout_log_probs if self.rollout_anchored else old_log_probs  # the surrogate's behaviour policy
        raw_log_ratio = torch.where(live, log_probs - base, zero)  # log pi / pi_old (pi / pi_rollout: rollout anchor)

        if self.settings.policy_loss_type == "gspo" and use_is:
            # GSPO with a mismatched engine: the behaviour policy is the rollout policy itself.
            ratio = _gspo_ratio(torch.where(live, log_probs - rollout_log_probs, zero), live)
        else:
            ratio = POLICY_LOSSES[self.settings.policy_loss_type](raw_log_ratio, live)

        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - self.settings.clip_eps_low, 1 + self.settings.clip_eps_high) * advantages
        loss = -torch.min(surr1, surr2)
        if self.settings.dual_clip is not None:
            # Dual clip bounds the loss of negative-advantage tokens whose ratio exploded.
            loss = torch.where(advantages < 0, torch.min(loss, -self.settings.dual_clip * advantages), loss)

        metrics: dict[str, Stat] = {}
        if use_is:
            gated = log_probs.detach() if self.rollout_anchored else old_log_probs
            loss, metrics = self._correct(loss, gated, rollout_log_probs, advantages, mask)
        loss = aggregate_loss(
            loss,
            mask,
            token_level_loss=self.token_level_loss,
            dp_size=dp_size,
            batch_num_tokens=batch_num_tokens,
            global_batch_size=global_batch_size,
        )
        metrics["policy/clip_frac"] = mean_stat((surr2 < surr1).to(log_probs.dtype).detach(), mask)
        metrics["policy/ppo_kl"] = mean_stat(-raw_log_ratio.detach(), live)
        return loss, metrics

    def _correct(self, loss, gated, rollout_log_probs, advantages, mask) -> tuple[torch.Tensor, dict[str, Stat]]:
        """The per-token loss (B, T) times the IS weights of the chosen correction, which gates `gated` (the old
        policy's log-probs, or the current policy's under the rollout anchor: then only the mask) against the
        rollout's; ppo only: GSPO corrects through its own ratio and only logs the mismatch. Also the `is/*`
        (and `is_pos/*`) metrics."""
        s = self.settings
        if s.policy_loss_type != "ppo":
            live = mask & torch.isfinite(gated) & torch.isfinite(rollout_log_probs)
            return loss, {"is/vllm_kl": mean_stat((rollout_log_probs - gated).detach(), live)}
        low, high = s.vllm_is_truncated_threshold
        weights, metrics = compute_is_weights(
            self.correction, gated, rollout_log_probs, mask, low, high, advantages=advantages,
            params=s.vllm_is_correction_args, mask_only=self.rollout_anchored,
        )  # fmt: skip
        loss = torch.where(weights > 0, weights.to(loss.dtype) * loss, torch.zeros_like(loss))
        if s.position_metrics:
            metrics.update(position_metrics(gated, rollout_log_probs, mask, low, high, advantages))
        return loss, metrics

    def _check_inputs(self, log_probs, old_log_probs, advantages, action_mask, rollout_log_probs) -> None:
        tensors = {"log_probs": log_probs, "old_log_probs": old_log_probs, "action_mask": action_mask}
        if advantages.dim() == 2:
            tensors["advantages"] = advantages
        if self.settings.enable_vllm_is_correction:
            if rollout_log_probs is None:
                raise ValueError(
                    "enable_vllm_is_correction needs rollout_log_probs (the engine's per-token log-probs) "
                    f"of shape {tuple(log_probs.shape)}, got None"
                )
            tensors["rollout_log_probs"] = rollout_log_probs
        shapes = {k: tuple(v.shape) for k, v in tensors.items()}
        if len(set(shapes.values())) != 1:
            raise ValueError("PolicyLoss shape mismatch: " + ", ".join(f"{k}={v}" for k, v in shapes.items()))


class ValueLoss(nn.Module):
    """0.5 * squared error of the critic, with PPO-style value clipping when `clip_eps` is set."""

    def __init__(self, clip_eps: float | None = None, token_level_loss: bool = True) -> None:
        super().__init__()
        self.clip_eps = clip_eps
        self.token_level_loss = token_level_loss

    def forward(
        self,
        values: torch.Tensor,
        old_values: torch.Tensor,
        returns: torch.Tensor,
        action_mask: torch.Tensor | None = None,
        dp_size: int = 1,
        batch_num_tokens: float | None = None,
        global_batch_size: float | None = None,
    ) -> tuple[torch.Tensor, dict[str, Stat]]:
        """values (B, T) with grad; old_values, returns, action_mask (B, T). Returns (loss, metrics: Stats)."""
        shapes = {"values": values.shape, "old_values": old_values.shape, "returns": returns.shape}
        if action_mask is None:
            action_mask = torch.ones_like(values, dtype=torch.bool)
        shapes["action_mask"] = action_mask.shape
        if len({tuple(s) for s in shapes.values()}) != 1:
            raise ValueError("ValueLoss shape mismatch: " + ", ".join(f"{k}={tuple(v)}" for k, v in shapes.items()))
        mask = action_mask.bool()
        unclipped = (values - returns).square()
        if self.clip_eps is not None:
            clipped_values = old_values + (values - old_values).clamp(-self.clip_eps, self.clip_eps)
            clipped = (clipped_values - returns).square()
            loss = torch.max(clipped, unclipped)
            clip_frac = mean_stat((clipped > unclipped).to(values.dtype).detach(), mask)
        else:
            loss = unclipped
            clip_frac = mean_stat(torch.zeros_like(values.detach()), mask)
        loss = 0.5 * aggregate_loss(loss, mask, self.token_level_loss, dp_size, batch_num_tokens, global_batch_size)
        metrics = {
            "critic/value_clip_frac": clip_frac,
            "critic/values_mean": mean_stat(values.detach(), mask),
            "critic/value_loss": loss_stat(
                loss, mask, self.token_level_loss, dp_size, batch_num_tokens, global_batch_size
            ),
        }
        return loss, metrics
