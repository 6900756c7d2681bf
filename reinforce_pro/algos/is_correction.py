"""Importance-sampling corrections for the rollout/training mismatch.

The rollout engine (vLLM) samples with pi_rollout; the trainer's "old" policy pi_old should be the same
distribution but is not (kernels, precision, stale weights). With r_t = log pi_old - log pi_rollout and
rho_t = exp(r_t), each correction turns rho into a per-token weight w_t that multiplies the per-token
policy loss. `IS_CORRECTIONS` maps the `--vllm_is_correction_type` names to their weight functions:

| name          | weight                                                           | source                    |
|---------------|------------------------------------------------------------------|---------------------------|
| tis           | clamp(rho_t, low, high)                                          | TIS (Yao et al., 2025)    |
| icepop        | rho_t if low <= rho_t <= high else 0                             | IcePop (Ring-1T, 2025)    |
| seq-mask-tis  | rho_t if low <= exp(mean_t r_t) <= high (whole sequence) else 0  | MIS / geometric seq mask  |
| reinforce_pro | rho_t if low <= exp(mean_{s<=t} r_s) <= high else 0              | REINFORCE Pro (this repo) |
| reinforce_pro-tis | clamp(rho_t, low, high) where reinforce_pro keeps, else 0    | this repo                 |

the published rivals (is_rivals.py): minpro, ctpo, cppo, dppo-tv, kpop, trm, opsm, geo-seq-mask, and
OpenRLHF 0.11.2's divergence gates token-tv, token-binary-kl, seq-tv, seq-binary-kl; and the mechanism variants
(is_mechanisms.py), each moving one ingredient between reinforce_pro and cppo / dppo-tv: reinforce_pro-tv,
reinforce_pro-sign, reinforce_pro-pos, dppo-ratio, cppo-nosign, cppo-flat.

The anchor: r compares the trainer's old policy with the rollout policy (`--vllm_is_anchor old`, the default);
under `--vllm_is_anchor rollout` it compares the current policy (detached) with the rollout policy, as DPPO,
CPPO and verl's bypass mode do, and the surrogate's own ratio pi / pi_rollout carries the IS weight: the
correction then contributes only its mask (`mask_only`, losses.py).

A user's own correction: `--vllm_is_correction_path file.py` defining `correction(inp: ISInputs) -> (weights,
keep, metrics)`, the signature of the functions below (`load_user_correction`; docs/algorithms.md). Its output
is checked on every call, and the safety rules below apply to it as to the built-ins.

`reinforce_pro` gates each token on the geometric mean of the ratios of the action tokens up to and
including it (a causal, prefix-level filter): once the prefix has drifted out of the band, the tokens
that follow were generated from a context the trainer would not have produced, so they are dropped until
the running mean comes back inside. Only action tokens enter the running mean: prompt, padding and
environment tokens between turns never move it.

Safety, common to all types: r is clamped to [-LOG_RATIO_BOUND, LOG_RATIO_BOUND] before exp; a token
whose old or rollout log-prob is NaN/inf gets weight exactly 0 (selected, never multiplied) and is counted
in `is/nonfinite_tokens`; for the prefix-level corrections (reinforce_pro, minpro, ctpo, cppo) it also breaks
the prefix, so it and every later token of its sequence get weight 0. Weights are computed under no_grad and
are 0 wherever action_mask is 0.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from itertools import pairwise

import torch

from reinforce_pro.algos.is_inputs import LOG_RATIO_BOUND, ISInputs, in_band, is_inputs, prefix_geomean, prefix_live
from reinforce_pro.algos.is_mechanisms import MECHANISM_BANDS, MECHANISM_NEEDS_ADVANTAGES, MECHANISM_PARAMS, MECHANISMS
from reinforce_pro.algos.is_rivals import DIVERGENCE_BANDS as RIVAL_BANDS
from reinforce_pro.algos.is_rivals import FRACTION_PARAMS, RIVAL_PARAMS, RIVALS
from reinforce_pro.algos.is_rivals import NEEDS_ADVANTAGES as RIVALS_NEEDING_ADVANTAGES
from reinforce_pro.algos.masked import masked_mean
from reinforce_pro.algos.stats import Stat, extreme_stat, mean_stat
from reinforce_pro.userfile import import_user_file

__all__ = ["DIVERGENCE_BANDS", "IS_CORRECTIONS", "LOG_RATIO_BOUND", "NEEDS_ADVANTAGES", "ISInputs",
           "compute_is_weights", "is_inputs", "position_metrics"]  # fmt: skip


# A correction returns (weights (B, T), keep (B, T) bool: the filter's decision, extra metrics).
Correction = Callable[[ISInputs], tuple[torch.Tensor, torch.Tensor, dict[str, Stat]]]


def _tis(inp: ISInputs):
    return inp.ratio.clamp(min=inp.low, max=inp.high), inp.valid, {}


def _icepop(inp: ISInputs):
    keep = inp.valid & in_band(inp.ratio, inp.low, inp.high)
    return inp.ratio, keep, {}


def _seq_mask_tis(inp: ISInputs):
    seq_is = masked_mean(inp.log_ratio, inp.valid, dim=-1).exp()  # (B,)
    keep = inp.valid & in_band(seq_is, inp.low, inp.high).unsqueeze(-1)
    return inp.ratio, keep, {}


def _reinforce_pro(inp: ISInputs):
    prefix_is = prefix_geomean(inp)  # (B, T) geometric mean of rho_{<=t}
    live = prefix_live(inp)  # a non-finite action token poisons every later prefix of its sequence
    keep = live & in_band(prefix_is, inp.low, inp.high)
    metrics = {
        "is/prefix_is_mean": mean_stat(prefix_is, live),
        "is/prefix_is_min": extreme_stat(prefix_is, live, "min"),
        "is/prefix_is_max": extreme_stat(prefix_is, live, "max"),
    }
    return inp.ratio, keep, metrics


def _reinforce_pro_tis(inp: ISInputs):
    # reinforce_pro passes an isolated spike inside an in-band prefix with its raw ratio (one token of ratio 30
    # after ten of ratio 1 keeps weight 30 at [0.5, 5]: the estimator study, docs/benchmarks.md); truncating the
    # kept weights to the band as tis does bounds it. The mask is reinforce_pro's, unchanged.
    _, keep, metrics = _reinforce_pro(inp)
    return inp.ratio.clamp(min=inp.low, max=inp.high), keep, metrics


IS_CORRECTIONS: dict[str, Correction] = {
    "tis": _tis,
    "icepop": _icepop,
    "seq-mask-tis": _seq_mask_tis,
    "reinforce_pro": _reinforce_pro,
    "reinforce_pro-tis": _reinforce_pro_tis,
    **RIVALS,
    **MECHANISMS,
}
# Over the whole table: each correction's own settings, the gates that read the advantage's sign, and the
# divergence gates' suggested bands [0, HIGH].
CORRECTION_PARAMS = {**RIVAL_PARAMS, **MECHANISM_PARAMS}
NEEDS_ADVANTAGES = RIVALS_NEEDING_ADVANTAGES | MECHANISM_NEEDS_ADVANTAGES
DIVERGENCE_BANDS = {**RIVAL_BANDS, **MECHANISM_BANDS}


def load_user_correction(path: str) -> Correction:
    """`correction(inp)` of a user's file (slime's custom-function pattern), wrapped so that whatever it returns
    or raises becomes one ValueError naming the file. Tried once on a small input here, so a broken file
    fails at start-up rather than at the first training step."""
    flag = f"--vllm_is_correction_path {path}"
    module = import_user_file(path, "--vllm_is_correction_path", ValueError, "correction(inp)")
    fn = getattr(module, "correction", None)
    if not callable(fn):
        raise ValueError(f"{flag}: define correction(inp: ISInputs) -> (weights, keep, metrics)")

    def checked(inp: ISInputs):
        try:
            out = fn(inp)
        except Exception as e:  # the user's code
            raise ValueError(f"{flag}: correction raised {type(e).__name__}: {e}") from e
        shape = tuple(inp.ratio.shape)
        if not (isinstance(out, tuple) and len(out) == 3):
            raise ValueError(f"{flag}: correction must return (weights, keep, metrics), got {type(out).__name__}")
        weights, keep, metrics = out
        if not (isinstance(weights, torch.Tensor) and tuple(weights.shape) == shape and weights.is_floating_point()):
            raise ValueError(f"{flag}: weights must be a float tensor of shape {shape}")
        if not (isinstance(keep, torch.Tensor) and tuple(keep.shape) == shape and keep.dtype == torch.bool):
            raise ValueError(f"{flag}: keep must be a bool tensor of shape {shape}")
        if not (isinstance(metrics, dict) and all(isinstance(v, Stat) for v in metrics.values())):
            raise ValueError(f"{flag}: metrics must be a dict of algos.stats.Stat (mean_stat, extreme_stat, ...)")
        return weights, keep, metrics

    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, float("nan"), -1.0]])
    checked(is_inputs(old, old - 0.1, torch.tensor([[1, 1, 1], [1, 1, 0]]), *DEFAULT_BAND))
    return checked


DEFAULT_BAND = (0.5, 5.0)  # the band of the start-up try of a user's correction


def correction_params(correction_type: str | Correction, overrides: Mapping[str, float] | None = None) -> dict:
    """The correction's own settings (CORRECTION_PARAMS) with `overrides` applied; ValueError naming
    --vllm_is_correction_args for a key the correction does not have or a value that is not a finite number >= 0."""
    defaults = CORRECTION_PARAMS.get(correction_type, {}) if isinstance(correction_type, str) else {}
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        name = correction_type if isinstance(correction_type, str) else "a user's correction"
        known = ", ".join(defaults) or "none"
        raise ValueError(
            f"--vllm_is_correction_args: {name} has no setting {', '.join(unknown)} (its settings: {known})"
        )
    for key, value in overrides.items():
        if not (isinstance(value, int | float) and 0.0 <= value < float("inf")):
            raise ValueError(f"--vllm_is_correction_args: {key} must be a finite number >= 0, got {value!r}")
        if key in FRACTION_PARAMS and value > 1.0:
            raise ValueError(f"--vllm_is_correction_args: {key} is a fraction: it must be <= 1, got {value!r}")
    return {**defaults, **{k: float(v) for k, v in overrides.items()}}


def validate_is_config(
    correction_type: str | Correction, low: float, high: float, params: Mapping[str, float] | None = None
) -> None:
    """Raise ValueError for an unknown correction name, a threshold band that is not 0 <= low < high (a divergence
    gate: low must be 0, OpenRLHF's rule), or settings the correction does not have."""
    if not callable(correction_type) and correction_type not in IS_CORRECTIONS:
        raise ValueError(f"unknown vllm_is_correction_type {correction_type!r}; valid: {', '.join(IS_CORRECTIONS)}")
    if not (0.0 <= low < high):
        raise ValueError(f"vllm_is_truncated_threshold must satisfy 0 <= low < high, got [{low}, {high}]")
    if correction_type in DIVERGENCE_BANDS and low > 0:
        raise ValueError(
            f"vllm_is_correction_type {correction_type} gates a divergence, which takes an upper bound only: give "
            f"--vllm_is_truncated_threshold (--algo.advantage.is_correction_threshold) HIGH, e.g. "
            f"{DIVERGENCE_BANDS[correction_type][1]}, got [{low}, {high}]"
        )
    correction_params(correction_type, params)


# OpenRLHF 0.11.2's --algo.advantage.is_correction_level / _mode / _gating -> the correction with the same loss
# (openrlhf/models/loss.py PolicyLoss; tests/test_integrations.py checks every entry against it). `prefix` is the
# level this project's OpenRLHF integration adds.
OPENRLHF_LEVELS = ("off", "token", "seq", "prefix")
OPENRLHF_CORRECTIONS = {
    ("token", "clip", "ratio"): "tis",
    ("token", "mask", "ratio"): "icepop",
    ("seq", "mask", "ratio"): "seq-mask-tis",
    ("token", "mask", "tv"): "token-tv",
    ("token", "mask", "binary_kl"): "token-binary-kl",
    ("seq", "mask", "tv"): "seq-tv",
    ("seq", "mask", "binary_kl"): "seq-binary-kl",
    ("prefix", "mask", "ratio"): "reinforce_pro",
    ("prefix", "clip", "ratio"): "reinforce_pro-tis",
}


def openrlhf_correction(level: str, mode: str, gating: str) -> str | None:
    """The correction OpenRLHF 0.11.2's level / mode / gating select (None: level off); the combinations OpenRLHF
    refuses raise its error, naming the flags."""
    if level == "off":
        return None
    if mode == "clip" and (level == "seq" or gating != "ratio"):
        raise ValueError("--algo.advantage.is_correction_mode clip requires is_correction_level token (or prefix) and "
                         f"is_correction_gating ratio, got level {level}, gating {gating}")  # fmt: skip
    if (level, mode, gating) not in OPENRLHF_CORRECTIONS:
        raise ValueError(f"--algo.advantage.is_correction_level prefix gates the ratio's running geometric mean: "
                         f"is_correction_gating must be ratio, got {gating}")  # fmt: skip
    return OPENRLHF_CORRECTIONS[(level, mode, gating)]


def default_band(correction_type: str, band: tuple[float, float]) -> tuple[float, float]:
    """`band`, or for a divergence gate (which reads [0, HIGH]) its own suggested band: what a caller that tries
    every correction with one ratio band passes."""
    return DIVERGENCE_BANDS.get(correction_type, band)


def compute_is_weights(
    correction_type: str | Correction,
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    action_mask: torch.Tensor,
    low: float,
    high: float,
    *,
    advantages: torch.Tensor | None = None,
    params: Mapping[str, float] | None = None,
    mask_only: bool = False,
) -> tuple[torch.Tensor, dict[str, Stat]]:
    """Per-token IS weights (B, T), detached, 0 where action_mask is 0, and the `is/*` metrics.

    correction_type: a name of IS_CORRECTIONS, or a Correction function (a user's: load_user_correction).
    old_log_probs: (B, T) log-probs of the sampled tokens under the gated policy (the trainer's old policy, or the
    current one under the rollout anchor); rollout_log_probs: the rollout engine's; action_mask: (B, T) 1 on
    trained tokens. advantages: (B, T) or (B,), needed by the gates that read the advantage's sign
    (NEEDS_ADVANTAGES). params: overrides of the correction's settings. mask_only: return the keep
    decision as 0/1 weights (the rollout anchor, whose surrogate ratio already carries the IS weight). Metrics are
    Stats of 0-dim tensors (`float(m[key])` reads one), merged over micro-batches and ranks by algos/stats.py.
    """
    validate_is_config(correction_type, low, high)
    settings = correction_params(correction_type, params)  # raises on a setting the correction does not have
    if advantages is None and correction_type in NEEDS_ADVANTAGES:
        raise ValueError(f"vllm_is_correction_type {correction_type} gates on the advantage's sign: pass advantages")
    with torch.no_grad():
        inp = is_inputs(old_log_probs, rollout_log_probs, action_mask, low, high, advantages, settings)
        correction = correction_type if callable(correction_type) else IS_CORRECTIONS[correction_type]
        raw_weights, keep, extra = correction(inp)
        keep = keep & inp.valid
        if mask_only:
            raw_weights = torch.ones_like(inp.ratio)
        weights = torch.where(keep, raw_weights, torch.zeros((), dtype=raw_weights.dtype, device=keep.device))
        metrics = _is_metrics(inp, weights, keep)
        metrics.update(extra)
    return weights, metrics


# Response-position buckets of the position diagnostics: [0, 2), [2, 4), [4, 8), ... [1024, inf).
POSITION_BUCKET_STARTS = (0, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def position_metrics(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    action_mask: torch.Tensor,
    low: float,
    high: float,
    advantages: torch.Tensor | None = None,
) -> dict[str, Stat]:
    """Where in a response the drift is and where each correction cuts (`--is_position_metrics`).

    Positions count from each sequence's first action token (as `is/first_masked_pos_mean`). For each bucket b
    of POSITION_BUCKET_STARTS that the responses reach, named `<lo>-<hi>` (`1024+` for the last):
    - `is_pos/abs_log_ratio/<b>`: mean |old - rollout log-prob| over the bucket's valid action tokens;
    - `is_pos/masked/<correction>/<b>`: fraction of the bucket's action tokens that correction gives weight 0;
    - `is_pos/first_masked/<correction>/<b>`: of the sequences that correction masks anywhere, the fraction
      whose first masked token lies in the bucket.
    Every correction of IS_CORRECTIONS is evaluated, whichever one trains, with the band [low, high] (a divergence
    gate with its own, `default_band`) and its default settings; those that read the advantage's sign only when
    `advantages` is given."""
    if action_mask.size(-1) == 0:
        return {}
    with torch.no_grad():
        inp = is_inputs(old_log_probs, rollout_log_probs, action_mask, low, high, advantages)
        action, dtype = inp.action_mask, inp.log_ratio.dtype
        bucket, names = position_buckets(action)
        m = {}
        for b, name in enumerate(names):
            m[f"is_pos/abs_log_ratio/{name}"] = mean_stat(inp.log_ratio.abs(), inp.valid & (bucket == b))
        for correction, fn in IS_CORRECTIONS.items():
            if correction in NEEDS_ADVANTAGES and advantages is None:
                continue
            band = default_band(correction, (low, high))
            _, keep, _ = fn(replace(inp, low=band[0], high=band[1], params=correction_params(correction)))
            masked = action & ~(keep & inp.valid)
            has_masked = masked.any(dim=-1)
            first_bucket = bucket.gather(-1, masked.to(torch.int8).argmax(dim=-1, keepdim=True)).squeeze(-1)
            for b, name in enumerate(names):
                in_b = bucket == b
                m[f"is_pos/masked/{correction}/{name}"] = mean_stat(masked.to(dtype), action & in_b)
                m[f"is_pos/first_masked/{correction}/{name}"] = mean_stat((first_bucket == b).to(dtype), has_masked)
    return m


def position_buckets(action_mask: torch.Tensor) -> tuple[torch.Tensor, list[str]]:
    """(B, T) index of each column's bucket of POSITION_BUCKET_STARTS, positions counted from the row's first
    action token, and the names (`<lo>-<hi>`, `<lo>+` for the last) of the buckets the columns reach."""
    action = action_mask.bool()
    columns = torch.arange(action.size(-1), device=action.device)
    pos = columns - action.to(torch.int8).argmax(dim=-1, keepdim=True)  # (B, T) offset from the first action
    starts = [s for s in POSITION_BUCKET_STARTS if s < action.size(-1)]
    bucket = torch.bucketize(pos, torch.tensor(starts[1:], device=pos.device), right=True)
    return bucket, [f"{lo}-{hi - 1}" for lo, hi in pairwise(starts)] + [_last_bucket(starts)]


def _last_bucket(starts: list[int]) -> str:
    """The name of the last bucket the responses reach: open-ended only past the last start."""
    i = POSITION_BUCKET_STARTS.index(starts[-1])
    if i + 1 == len(POSITION_BUCKET_STARTS):
        return f"{starts[-1]}+"
    return f"{starts[-1]}-{POSITION_BUCKET_STARTS[i + 1] - 1}"


def _is_metrics(inp: ISInputs, weights: torch.Tensor, keep: torch.Tensor) -> dict[str, Stat]:
    """The `is/*` metrics, each a Stat with its reduction over micro-batches and ranks (algos/stats.py)."""
    action, valid, ratio = inp.action_mask, inp.valid, inp.ratio
    masked = action & ~keep  # action tokens the filter gave weight 0 (non-finite ones included)
    dtype = weights.dtype
    n_action = action.sum()
    w_mean, w_sq_mean = mean_stat(weights, action), mean_stat(weights.square(), action)
    ess = torch.where(w_sq_mean.value > 0, w_mean.value.square() / w_sq_mean.value.clamp(min=1e-30), 0.0)
    return {
        "is/vllm_kl": mean_stat(-inp.log_ratio, valid),  # mean(rollout - old)
        "is/ratio_mean": mean_stat(ratio, valid),
        "is/ratio_min": extreme_stat(ratio, valid, "min"),
        "is/ratio_max": extreme_stat(ratio, valid, "max"),
        "is/weight_mean": w_mean,
        "is/weight_sq_mean": w_sq_mean,
        "is/token_masked_frac": mean_stat(masked.to(dtype), action),
        "is/seq_masked_frac": mean_stat(masked.any(dim=-1).to(dtype), action.any(dim=-1)),
        "is/ess": Stat(ess, n_action, "derived"),  # weight_mean^2 / weight_sq_mean (stats.DERIVED)
        "is/nonfinite_tokens": Stat(inp.nonfinite.sum().to(dtype), n_action, "sum"),
        "is/first_masked_pos_mean": _first_masked_position_mean(action, masked, dtype),
    }


def _first_masked_position_mean(action: torch.Tensor, masked: torch.Tensor, dtype: torch.dtype) -> Stat:
    """Mean, over sequences with a masked token, of that token's index counted from the first action
    token of its sequence (so left context does not shift it); -1 when no sequence has one."""
    has_masked = masked.any(dim=-1)
    offset = masked.to(torch.int8).argmax(dim=-1) - action.to(torch.int8).argmax(dim=-1)
    mean = mean_stat(offset.to(dtype), has_masked)
    return Stat(torch.where(has_masked.any(), mean.value, -1.0), mean.weight, "mean")
