"""The mechanism variants: what separates the corrections that hold under staleness from those that collapse.

In the long confirmation (docs/results/is-long-study.md) `cppo` and `dppo-tv` never collapsed under `stale4`
while `reinforce_pro` did at about a third of the seeds. The two winners differ from `reinforce_pro` in a few
ingredients; each variant here moves exactly one of them, so a screening can say which one matters. With p the
gated policy's probability of the sampled token, mu the rollout policy's, rho = p / mu, A the advantage and
g_t = exp(mean_{s<=t} log rho_s) reinforce_pro's prefix statistic:

| variant | ingredient | keeps token t when |
|---|---|---|
| reinforce_pro-tv | a probability-space prefix gate (CPPO, DPPO gate TV) | mean_{s<=t} |p_s - mu_s| <= HIGH |
| reinforce_pro-sign | advantage-sign conditioning (DPPO) | g_t <= HIGH if A > 0, g_t >= LOW otherwise |
| reinforce_pro-pos | position-weighted bands (CPPO's w_t, 1 falling to w_min) | LOW <= g_t^(w_t) <= HIGH |
| dppo-ratio | DPPO with a ratio band instead of its TV one | rho_t <= HIGH if A > 0, rho_t >= LOW otherwise |
| cppo-nosign | CPPO without its exemption of tokens moving toward mu | the position-weighted budget holds |
| cppo-flat | CPPO without its position weights (w_min = 1) | as cppo, every w_t = 1 |

Every variant weights a kept token by rho_t, as reinforce_pro, cppo and dppo-tv do. The other ingredients are
already in the table or a flag: a truncated weight is `reinforce_pro-tis`; DPPO without the sign is `token-tv`
(|p - mu| <= 0.2 both ways); the rollout anchor is `--vllm_is_anchor rollout`. Prefix-level variants follow
reinforce_pro's rule for a non-finite token: it and every later token of its sequence get weight 0.
"""

from __future__ import annotations

from functools import partial

import torch

from reinforce_pro.algos.is_inputs import ISInputs, in_band, prefix_geomean, prefix_live
from reinforce_pro.algos.is_rivals import RIVAL_PARAMS, _cppo, position_weights
from reinforce_pro.algos.stats import mean_stat

# Each variant's own settings (overridden with --vllm_is_correction_args), with the ingredient's source.
MECHANISM_PARAMS: dict[str, dict[str, float]] = {
    "reinforce_pro-pos": {"w_min": RIVAL_PARAMS["cppo"]["w_min"]},  # CPPO's default
    "cppo-nosign": dict(RIVAL_PARAMS["cppo"]),
    "cppo-flat": {**RIVAL_PARAMS["cppo"], "w_min": 1.0},
}
MECHANISM_NEEDS_ADVANTAGES = frozenset({"reinforce_pro-sign", "dppo-ratio", "cppo-nosign", "cppo-flat"})
# reinforce_pro-tv gates a divergence, which takes [0, HIGH]; 0.05 is a quarter of DPPO's per-token 0.2, since a
# mean over the prefix varies less than one token's |p - mu|.
MECHANISM_BANDS = {"reinforce_pro-tv": (0.0, 0.05)}


def _reinforce_pro_tv(inp: ISInputs):
    live = prefix_live(inp)
    tv = torch.where(live, (inp.prob - inp.rollout_prob).abs(), 0.0)
    count = torch.cumsum(live, dim=-1, dtype=torch.int32).clamp_(min=1)
    prefix_tv = torch.cumsum(tv, dim=-1).div_(count)  # (B, T) mean |p - mu| over the live tokens <= t
    keep = live & (prefix_tv >= inp.low) & (prefix_tv <= inp.high)
    return inp.ratio, keep, {"is/prefix_tv_mean": mean_stat(prefix_tv, live)}


def _reinforce_pro_sign(inp: ISInputs):
    # DPPO's rule on the prefix: only the side the advantage pushes toward is bounded. A > 0 raises p, so a prefix
    # that already rose past HIGH is cut; A <= 0 lowers it, so one already below LOW is (prime-rl: where(A > 0, ...)).
    live = prefix_live(inp)
    prefix_is = prefix_geomean(inp)
    out = torch.where(inp.advantages > 0, prefix_is > inp.high, prefix_is < inp.low)
    return inp.ratio, live & ~out, {"is/prefix_is_mean": mean_stat(prefix_is, live)}


def _reinforce_pro_pos(inp: ISInputs):
    # CPPO weights a token's divergence by w_t (early drift compounds over the longest suffix); here the prefix's
    # mean log-ratio is weighted the same way before the band, so the band widens along the response.
    live = prefix_live(inp)
    w = position_weights(live, inp.params["w_min"], inp.log_ratio.dtype)
    weighted = prefix_geomean(inp).pow(w)
    keep = live & in_band(weighted, inp.low, inp.high)
    return inp.ratio, keep, {"is/prefix_is_weighted_mean": mean_stat(weighted, live)}


def _dppo_ratio(inp: ISInputs):
    out = torch.where(inp.advantages > 0, inp.ratio > inp.high, inp.ratio < inp.low)
    return inp.ratio, inp.valid & ~out, {}


MECHANISMS = {
    "reinforce_pro-tv": _reinforce_pro_tv,
    "reinforce_pro-sign": _reinforce_pro_sign,
    "reinforce_pro-pos": _reinforce_pro_pos,
    "dppo-ratio": _dppo_ratio,
    "cppo-nosign": partial(_cppo, toward_exempt=False),
    "cppo-flat": _cppo,  # its own w_min default (MECHANISM_PARAMS)
}
