"""reinforce_pro in verl: `rollout_is=prefix`, a third level of verl's rollout-correction weights.

    python -m reinforce_pro.integrations.verl <verl.trainer.main_ppo overrides> \\
        algorithm.rollout_correction.rollout_is=prefix algorithm.rollout_correction.rollout_is_threshold=0.5_5.0

verl computes its rollout-correction weights in `rollout_corr_helper.compute_rollout_correction_weights`: level
`token` or `sequence`, and a "lower_upper" threshold zeroes the ratios outside the band (IcePop). Level `prefix`
zeroes each token whose prefix has drifted: the geometric mean of the ratios of the response tokens up to and
including it must lie in [lower, upper]; a kept token keeps its own ratio. Its weights are
`algos.is_correction.compute_is_weights("reinforce_pro", ...)`, this project's function; they go where verl's
token weights go (`rollout_is_weights`, multiplied into the per-token loss by every registered policy loss),
so the response mask and the loss's denominators stay verl's, as for token-level IcePop. verl's rejection
options (`rollout_rs`) combine with it as with any level.

The launcher runs verl's own `verl.trainer.main_ppo` as `__main__` with the level registered in this process
and, through a `worker_process_setup_hook` added to verl's `ray.init`, in every Ray worker (verl's trainer loop
runs in a Ray actor) that imports `rollout_corr_helper`. reinforce_pro must be installed on every node.

Why not verl's extension point: verl has one for policy losses (`register_policy_loss`), but a registered loss
receives verl's finished `rollout_is_weights`, not the rollout log-probs; a prefix mask needs the per-token
log-ratios, which only the weight function sees.
What differs from verl's levels: a single-number threshold (an upper clamp for token / sequence) is refused for
prefix, which masks; `rollout_is_batch_normalize` is refused too; a token whose log-ratio is NaN/inf gets weight
0 and ends its prefix.
"""

from __future__ import annotations

import functools
import math
import sys
from types import ModuleType

import torch

from reinforce_pro.algos.is_correction import compute_is_weights
from reinforce_pro.integrations.releases import UnsupportedRelease, after_import, installed_release, run_trainer

SUPPORTED = ("0.9.1",)
LEVEL = "prefix"
HELPER = "verl.trainer.ppo.rollout_corr_helper"
WORKER_HOOK = "reinforce_pro.integrations.verl.register"
# is/* metrics, reported under verl's prefix: is/token_masked_frac -> rollout_corr/rollout_is_token_masked_frac
LOGGED = ("is/token_masked_frac", "is/seq_masked_frac", "is/weight_mean", "is/ess", "is/prefix_is_mean")


def band(threshold) -> tuple[float, float]:
    """verl's "lower_upper" threshold string as (lower, upper); prefix masks, so both bounds are required."""
    parts = str(threshold).split("_") if isinstance(threshold, str) else []
    try:
        low, high = (float(p) for p in parts)
    except ValueError:
        raise ValueError(
            f"rollout_is=prefix masks tokens outside a band: rollout_is_threshold must be 'lower_upper' "
            f"(e.g. '0.5_5.0'), got {threshold!r}"
        ) from None
    if not (0 <= low < high and math.isfinite(low)):
        raise ValueError(f"rollout_is_threshold must satisfy 0 <= lower < upper, got {threshold!r}")
    return low, high


def prefix_weights(log_ratio: torch.Tensor, response_mask: torch.Tensor, threshold, batch_normalize: bool = False):
    """verl's weight function at level prefix: (B, T) weights and metrics (floats), from (B, T) log(pi_train /
    pi_rollout) and the response mask."""
    if batch_normalize:
        raise ValueError("rollout_is=prefix does not batch-normalize its weights: set rollout_is_batch_normalize=False")
    low, high = band(threshold)
    zero = torch.zeros_like(log_ratio)  # old - rollout = log_ratio - 0
    weights, metrics = compute_is_weights("reinforce_pro", log_ratio, zero, response_mask, low, high)
    return weights.to(log_ratio.dtype), {f"rollout_is_{k.removeprefix('is/')}": float(metrics[k]) for k in LOGGED}


def register() -> None:
    """Add level `prefix` to verl's rollout-correction weights in this process, when the helper module is
    imported (now if it already is). Idempotent. The launcher calls it in the driver; Ray in every worker."""
    installed_release("verl", SUPPORTED)
    after_import(HELPER, _patch_helper)


def _patch_helper(helper: ModuleType) -> None:
    original = helper.compute_rollout_correction_weights
    if getattr(original, "reinforce_pro_registered", False):
        return

    @functools.wraps(original)
    def weights(
        log_ratio, response_mask, rollout_is="token", rollout_is_threshold=2.0, rollout_is_batch_normalize=False
    ):
        if rollout_is != LEVEL:
            return original(log_ratio, response_mask, rollout_is, rollout_is_threshold, rollout_is_batch_normalize)
        return prefix_weights(log_ratio, response_mask, rollout_is_threshold, rollout_is_batch_normalize)

    weights.reinforce_pro_registered = True
    helper.compute_rollout_correction_weights = weights


def main(argv: list[str] | None = None) -> int:
    """Run verl's main_ppo with `argv` (hydra overrides), level prefix registered."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        installed_release("verl", SUPPORTED)
    except UnsupportedRelease as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    run_trainer("verl.trainer.main_ppo", argv, register, WORKER_HOOK)
    return 0


if __name__ == "__main__":
    sys.exit(main())
