"""The published rivals of `reinforce_pro`: every mismatch correction a user could pick instead, on one footing.

Each is a `Correction` (`ISInputs -> (weights, keep, metrics)`, see is_correction.py) under its own name, with
its own settings in `RIVAL_PARAMS` (overridden with `--vllm_is_correction_args KEY=VALUE`). With p the gated
(numerator) policy's probability of the sampled token, mu the rollout policy's, rho = p / mu and r = log rho:

- minpro (MinPRO, arXiv 2601.22718): weight min(1, rho_s for s < t) * rho_t, no mask;
- ctpo (CTPO, arXiv 2605.07331): weight exp(clip(sum_{s<=t} r_s, -lo t^k, hi t^k)), no mask;
- cppo (CPPO, arXiv 2606.10968): keeps a token moving back toward mu (A (rho - 1) <= 0), or whose position-weighted
  |p - mu| fits the budget its prefix has left;
- dppo-tv (DPPO, arXiv 2602.04879): drops a token with A > 0 and p - mu > high, or A <= 0 and mu - p > low;
- kpop (KPop; AReaL, prime-rl): keeps a token whose binary KL is <= phi in both directions;
- trm (Trust Region Masking, arXiv 2512.23075): drops a sequence whose largest token k3 = rho - 1 - r exceeds delta;
- opsm (DeepSeek-V3.2's off-policy sequence mask; TRL, slime): drops a sequence with A < 0 whose mean log(mu / p)
  exceeds delta;
- geo-seq-mask (the geometric sequence mask; SkyRL, verl's seq_mean_k1): keeps a sequence with exp(mean r) in
  [LOW, HIGH], weight 1 (a rejection only);
- token-tv, token-binary-kl, seq-tv, seq-binary-kl (OpenRLHF 0.11.2's gating tv / binary_kl at level token / seq):
  keep LOW <= |p - mu| (or KL_B(mu || p)) <= HIGH, per token or as the sequence's mean; p and mu clamped to
  [1e-6, 1 - 1e-6]. seq-binary-kl is FlashREINFORCE's trust region.

Every mask weights a kept token by its own ratio rho, as icepop and this project's other masks do. Under the rollout
anchor the surrogate's ratio pi / mu already is that weight, so the loss takes only the mask (losses.py).
Prefix-level rivals (minpro, ctpo, cppo) follow reinforce_pro's rule for a non-finite token: it ends the prefix,
so it and every later token of its sequence get weight 0. Positions count the valid action tokens only, so
prompt, padding and environment tokens between turns never move a prefix or a position weight.
"""

from __future__ import annotations

import torch

from reinforce_pro.algos.is_inputs import ISInputs, in_band, prefix_live
from reinforce_pro.algos.masked import masked_mean
from reinforce_pro.algos.stats import mean_stat

PROB_CLAMP = 1e-6  # OpenRLHF 0.11.2 and KPop clamp probabilities before a binary KL, keeping its logs finite

# Each rival's own settings and their defaults, with where the default comes from.
RIVAL_PARAMS: dict[str, dict[str, float]] = {
    # CTPO's log-space clip bounds at position t: [-lo t^power, hi t^power] (horizon-llm/CTPO acc4021, core_algos.py
    # defaults la_clip_low / la_clip_high, and the cumprod mode's recommended power).
    # `cap`: the reference caps the cumulative log-ratio from above at 10 before the window (it binds only where the
    # window is wider than that: very long responses or a user's wide clip_high).
    "ctpo": {"clip_low": 0.025, "clip_high": 0.05, "power": 0.5, "cap": 10.0},
    # CPPO's delta, w_min, delta_b (Tencent-Hunyuan/UniRL 30899fc, unirl/algorithms/cppo.py CPPOConfig); `quantile`
    # and `budget_scale`: the per-sequence budget delta_b' is that quantile of the divergences clamped to
    # [delta_b, budget_scale x delta_b] (fixed at 0.9 and 2 in UniRL's code, settings in verl's port).
    "cppo": {"delta": 0.2, "w_min": 0.8, "delta_b": 0.02, "quantile": 0.9, "budget_scale": 2.0},
    # DPPO's TV thresholds (PrimeIntellect-ai/prime-rl 559b447, configs/trainer.py dppo_mask_low / dppo_mask_high).
    "dppo-tv": {"low": 0.2, "high": 0.2},
    # KPop's phi (prime-rl pull request 3283: "defaulting to 0.1 as in the paper").
    "kpop": {"phi": 0.1},
    # TRM's bound on the largest token divergence; verl's seq_max_k3 ships no default: this project's choice,
    # about |r| <= 0.6 per token.
    "trm": {"delta": 0.2},
    # OPSM's delta (TRL 1.16 off_policy_mask_threshold's documented example value).
    "opsm": {"delta": 0.5},
}
# Settings that are fractions: refused above 1 (the rest only need to be finite and >= 0).
FRACTION_PARAMS = frozenset({"w_min", "quantile"})
# Rivals whose gate reads the advantage's sign: they need the policy loss's advantages.
NEEDS_ADVANTAGES = frozenset({"cppo", "dppo-tv", "opsm"})
# OpenRLHF 0.11.2's divergence gates read [LOW, HIGH] on a divergence: an upper bound, LOW <= 0 (OpenRLHF refuses
# LOW > 0, which would drop every undrifted token); the band suggested where a caller has none.
DIVERGENCE_BANDS = {"token-tv": (0.0, 0.2), "token-binary-kl": (0.0, 0.1), "seq-tv": (0.0, 0.2),
                    "seq-binary-kl": (0.0, 0.1)}  # fmt: skip


def _positions(live: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, T) 1-based position of each live token among its sequence's live tokens (0 before the first)."""
    return torch.cumsum(live, dim=-1, dtype=torch.int32).to(dtype)


def position_weights(live: torch.Tensor, w_min: float, dtype: torch.dtype) -> torch.Tensor:
    """(B, T) CPPO's w_t: 1 at a sequence's first live token falling linearly to w_min at its last, 0 elsewhere."""
    pos = _positions(live, dtype)
    n = live.sum(dim=-1, keepdim=True).to(dtype)
    return torch.where(live, 1.0 - (1.0 - w_min) * (pos - 1.0) / (n - 1.0).clamp(min=1.0), 0.0)


def _minpro(inp: ISInputs):
    # MinPRO replaces the prefix product prod_{s<t} rho_s by the smallest ratio seen before t. The running
    # minimum starts at the empty prefix's ratio 1, so the factor only ever down-weights: this project's reading
    # of the paper's abstract ("down-weighting the gradient when any ratio in the prefix is small"), not of its
    # equations, which were not available when this was written.
    live = prefix_live(inp)
    inf = torch.full((), float("inf"), dtype=inp.log_ratio.dtype, device=live.device)
    r = torch.where(live, inp.log_ratio, inf)  # tokens outside the prefix never lower the minimum
    before = torch.cat([torch.zeros_like(r[:, :1]), r[:, :-1]], dim=-1)  # log rho of the token before; 0 = log 1
    prefix_min = torch.cummin(before, dim=-1).values.exp()  # (B, T) min(1, rho_s for live s < t)
    return prefix_min * inp.ratio, live, {"is/minpro_prefix_min_mean": mean_stat(prefix_min, live)}


def _ctpo(inp: ISInputs):
    # CTPO's cumulative ratio prod_{s<=t} rho_s, clipped in log space to a window that widens as t^power, the
    # growth of the cumulative log-ratio's spread (arXiv 2605.07331; as a truncated IS weight, as tis truncates).
    p, live = inp.params, prefix_live(inp)
    cum = torch.cumsum(torch.where(live, inp.log_ratio, 0.0), dim=-1)  # (B, T)
    scale = _positions(live, cum.dtype).clamp(min=1.0).pow(p["power"])
    capped = cum.clamp(max=p["cap"])  # the reference's cap, before its window
    clipped = torch.minimum(torch.maximum(capped, -p["clip_low"] * scale), p["clip_high"] * scale)
    return clipped.exp(), live, {"is/cum_log_ratio_mean": mean_stat(cum, live)}


def _cppo(inp: ISInputs, toward_exempt: bool = True):
    # CPPO (arXiv 2606.10968, Eq. 8-11, as UniRL's cppo.py computes it): a Binary-TV divergence D_t = |p - mu|,
    # weighted by w_t falling linearly from 1 to w_min along the response (early drift compounds longest),
    # kept while within c_t = min(delta, delta + delta_b' W_<t - S_<t): the budget the prefix has left, with
    # delta_b' the sequence's `quantile` of D (0.9) clamped to [delta_b, budget_scale delta_b]. A token whose update
    # moves back toward mu (A (rho - 1) <= 0) is always kept (unless not `toward_exempt`: is_mechanisms.py).
    p, live = inp.params, prefix_live(inp)
    dtype = inp.log_ratio.dtype
    w = position_weights(live, p["w_min"], dtype)
    div = torch.where(live, (inp.prob - inp.rollout_prob).abs(), 0.0)
    z = w * div
    spent, weight_before = torch.cumsum(z, dim=-1) - z, torch.cumsum(w, dim=-1) - w  # S_<t, W_<t
    nan = torch.full((), float("nan"), dtype=dtype, device=div.device)
    high = torch.nanquantile(torch.where(live, div, nan), p["quantile"], dim=-1, keepdim=True).nan_to_num(p["delta_b"])
    budget = torch.clamp(high, p["delta_b"], p["budget_scale"] * p["delta_b"])
    limit = torch.clamp(p["delta"] + budget * weight_before - spent, max=p["delta"])
    toward = inp.advantages * (inp.ratio - 1.0) <= 0.0
    keep = live & ((toward & toward_exempt) | (z <= limit))
    return inp.ratio, keep, {"is/cppo_budget_left_mean": mean_stat(limit - z, live)}


def _dppo_tv(inp: ISInputs):
    # DPPO's Binary-TV trust region on the sampled token, one side per advantage sign (prime-rl's default loss):
    # a positive-advantage token may not have gained more than `high` probability, any other lost more than `low`.
    p = inp.params
    diff = inp.prob - inp.rollout_prob
    out = torch.where(inp.advantages > 0, diff > p["high"], diff < -p["low"])
    return inp.ratio, inp.valid & ~out, {}


def _binary_kl(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """KL between Bernoulli(a) and Bernoulli(b): the vocabulary as {this token, everything else}."""
    return a * (a / b).log() + (1.0 - a) * ((1.0 - a) / (1.0 - b)).log()


def _clamped_probs(inp: ISInputs) -> tuple[torch.Tensor, torch.Tensor]:
    return inp.prob.clamp(PROB_CLAMP, 1.0 - PROB_CLAMP), inp.rollout_prob.clamp(PROB_CLAMP, 1.0 - PROB_CLAMP)


def _kpop(inp: ISInputs):
    # KPop: a token-level trust region on the binary KL, both directions: wide in ratio for rare tokens, tight
    # for confident ones.
    p, mu = _clamped_probs(inp)
    div = torch.maximum(_binary_kl(p, mu), _binary_kl(mu, p))
    return inp.ratio, inp.valid & (div <= inp.params["phi"]), {"is/binary_kl_mean": mean_stat(div, inp.valid)}


def _trm(inp: ISInputs):
    # Trust Region Masking: the surrogate's error bound grows with the largest token divergence of a sequence,
    # so a sequence whose largest k3 estimate exceeds delta is dropped whole (verl's seq_max_k3 rejection).
    k3 = inp.ratio - 1.0 - inp.log_ratio  # (B, T), 0 off the valid tokens
    seq_max = torch.where(inp.valid, k3, 0.0).amax(dim=-1, keepdim=True)
    return (
        inp.ratio,
        inp.valid & (seq_max <= inp.params["delta"]),
        {"is/seq_max_k3_mean": mean_stat(seq_max.squeeze(-1), inp.valid.any(dim=-1))},
    )


def _opsm(inp: ISInputs):
    # DeepSeek-V3.2's off-policy sequence mask (TRL's get_off_policy_mask): a negative-advantage sequence whose
    # mean log(mu / p) exceeds delta is dropped; positive-advantage tokens are always kept.
    seq_kl = masked_mean(-inp.log_ratio, inp.valid, dim=-1).unsqueeze(-1)  # (B, 1)
    keep = inp.valid & ((inp.advantages >= 0) | (seq_kl <= inp.params["delta"]))
    return inp.ratio, keep, {}


def _geo_seq_mask(inp: ISInputs):
    # The geometric sequence mask as a pure rejection (SkyRL's examples default, verl's seq_mean_k1): the gate of
    # seq-mask-tis, weight 1. Equal to seq-mask-tis under the rollout anchor, where both give the mask alone.
    seq = masked_mean(inp.log_ratio, inp.valid, dim=-1).exp().unsqueeze(-1)
    return torch.ones_like(inp.ratio), inp.valid & in_band(seq, inp.low, inp.high), {}


def _openrlhf_gate(divergence: str, seq: bool):
    """OpenRLHF 0.11.2's `is_correction_gating tv|binary_kl` at `level token|seq`, mode mask: the same statistic
    (its binary KL is KL_B(mu || p), one direction), kept tokens weighted by rho. One deliberate difference: the
    binary KL is floored at 0. In float32 it rounds below 0 for a few percent of confident on-policy tokens
    (p ~ mu ~ 1), which OpenRLHF's `stat >= LOW` with LOW = 0 then drops; here they are kept. In float64, where
    nothing rounds below 0, the two agree exactly (tests/test_integrations.py)."""

    def gate(inp: ISInputs):
        p, mu = _clamped_probs(inp)
        stat = _binary_kl(mu, p).clamp(min=0.0) if divergence == "binary_kl" else (mu - p).abs()
        if seq:
            stat = masked_mean(stat, inp.valid, dim=-1).unsqueeze(-1)
        return inp.ratio, inp.valid & (stat >= inp.low) & (stat <= inp.high), {}

    return gate


RIVALS = {
    "minpro": _minpro,
    "ctpo": _ctpo,
    "cppo": _cppo,
    "dppo-tv": _dppo_tv,
    "kpop": _kpop,
    "trm": _trm,
    "opsm": _opsm,
    "geo-seq-mask": _geo_seq_mask,
    "token-tv": _openrlhf_gate("tv", seq=False),
    "token-binary-kl": _openrlhf_gate("binary_kl", seq=False),
    "seq-tv": _openrlhf_gate("tv", seq=True),
    "seq-binary-kl": _openrlhf_gate("binary_kl", seq=True),
}
