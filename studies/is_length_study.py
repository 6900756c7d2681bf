"""Where each correction's gradient is right: every correction against the exact policy gradient, over response
length (8 to 1,024 tokens) and the drift profiles real systems produce.

    python -m studies.is_length_study                       # ~10 minutes on 2 cores; JSON, table, plots
    python -m studies.is_length_study --quick               # a minute: three lengths, fewer batches
    python -m studies.is_length_study --render FILE         # re-render from a JSON

The policy pi is a stationary first-order Markov chain over S symbols, pi(y_t | y_{t-1}) = softmax(theta[y_{t-1}]),
whose states are sticky (one lasts ~10 tokens), so a drift early in a response changes the context of the tokens
after it. The reward is spread along the response, R(y) = mean_t g[y_t] with g fixed in [0, 1]^S, and every
token's advantage is R(y) - J. Sequences cannot be enumerated at 1,024 tokens but the objective can:
J = mean_t m_t . g with m_t the marginal of y_t (a forward recursion), and autograd through it gives the exact
gradient g*. The rollout policy mu is pi with per-position logit drift (a profile, below); batches are sampled
from mu and every correction weighs the same batches. A batch's estimate is the gradient of `PolicyLoss` (token
mean, old = pi, rollout = mu) with the correction's weights: with old = pi the PPO ratio is 1 and that gradient is
sum_tokens -w_t A (onehot(y_t) - pi(.|y_{t-1})) / tokens, computed here in closed form for many batches at once
(tests/test_is_length_study.py checks it against autograd through PolicyLoss). Reported per length x profile x
correction: the cosine of the mean estimate with g*, its relative error |E[g] - g*| / |g*| (the bias, with its
Monte-Carlo part shown by `none` on the undrifted control), the variance as a fraction of |g*|^2, the mean
per-batch cosine, the ESS the correction logs and the kept token fraction.

Drift profiles (mu's logits = theta plus, at position t):
- none: nothing (the control: what is left of the error is Monte-Carlo noise);
- iid_noise: small Gaussian noise at every position (a low-precision engine);
- version_switch: a partial rollout: positions before a random switch point sampled by an older policy (larger
  noise), the rest by a nearer one, the switch point drawn per response;
- early_burst / late_burst: large noise on the first / last sixteenth of the positions, small elsewhere;
- single_spike: at one position, one token's logit raised by 4 from every context;
- slow_ramp: noise growing linearly from 0 at the first position to large at the last.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

from benchmarks.common import bench_main, save_figure
from reinforce_pro.algos.is_correction import IS_CORRECTIONS, compute_is_weights, default_band
from reinforce_pro.algos.losses import DEFAULT_IS_THRESHOLD
from studies import RESULTS_DIR

NAME = "is_length_study"
# (row label, correction, its settings): every correction at its defaults, no correction, and two references:
# the prefix importance ratio prod_{s<=t} rho_s (ctpo with a window that never binds), and the whole response's
# ratio prod_s rho_s on every token, the one estimator here that is unbiased (the reward depends on the tokens
# after t too, which the prefix ratio leaves drawn from mu).
SEQUENCE_PRODUCT = "sequence-product"
VARIANTS = [("none", None, {}), *((c, c, {}) for c in IS_CORRECTIONS),
            ("prefix-product", "ctpo", {"clip_low": 20.0, "clip_high": 20.0, "power": 0.0}),
            (SEQUENCE_PRODUCT, SEQUENCE_PRODUCT, {})]  # fmt: skip
CORRECTIONS = [label for label, _, _ in VARIANTS]
PROFILES = ("none", "iid_noise", "version_switch", "early_burst", "late_burst", "single_spike", "slow_ramp")
LENGTHS = (8, 32, 128, 512, 1024)
SYMBOLS = 3
STICKINESS = 3.0  # added to the logit of staying: a state lasts ~ 1 + e^3 / 2 ~ 11 tokens
CHUNK = 1024  # responses weighted at once (memory: a few (CHUNK, H) float64 tensors per correction)


def make_theta(gen: torch.Generator) -> torch.Tensor:
    """(S + 1, S) logits of pi; row S is the start symbol's."""
    theta = torch.randn((SYMBOLS + 1, SYMBOLS), generator=gen, dtype=torch.float64)
    theta[:SYMBOLS] += STICKINESS * torch.eye(SYMBOLS, dtype=torch.float64)
    return theta


def drift(profile: str, theta: torch.Tensor, horizon: int, gen: torch.Generator, strength: float = 1.0):
    """(mu's logits (H, S + 1, S) at and after the switch point, before it): equal but for version_switch. Every
    noise scale and the spike are multiplied by `strength`."""
    h, shape = horizon, (horizon, *theta.shape)
    noise = torch.randn(shape, generator=gen, dtype=theta.dtype)
    scale = torch.full((h,), 0.0 if profile in ("none", "single_spike") else 0.05, dtype=theta.dtype)
    if profile == "iid_noise":
        scale[:] = 0.15
    elif profile == "early_burst":
        scale[: max(1, h // 16)] = 1.5
    elif profile == "late_burst":
        scale[h - max(1, h // 16) :] = 1.5
    elif profile == "slow_ramp":
        scale = torch.arange(h, dtype=theta.dtype) / max(h - 1, 1)
    fresh = theta + strength * scale.view(h, 1, 1) * noise
    if profile == "single_spike":
        t, v = int(torch.randint(h, (1,), generator=gen)), int(torch.randint(SYMBOLS, (1,), generator=gen))
        fresh[t, :, v] += 4.0 * strength
    if profile != "version_switch":
        return fresh, fresh
    stale = theta + strength * 0.6 * torch.randn(shape, generator=gen, dtype=theta.dtype)
    return theta + strength * 0.05 * noise, stale


def exact_objective(theta: torch.Tensor, g: torch.Tensor, horizon: int) -> torch.Tensor:
    """J = E_pi[mean_t g[y_t]] by the forward recursion over the marginals of y_t."""
    p = torch.softmax(theta, dim=-1)
    m = p[SYMBOLS]  # (S,) marginal of y_0: it follows the start symbol
    total = m @ g
    for _ in range(1, horizon):
        m = m @ p[:SYMBOLS]
        total = total + m @ g
    return total / horizon


def exact_gradient(theta: torch.Tensor, g: torch.Tensor, horizon: int) -> torch.Tensor:
    """The target g*: the gradient of -(1/H) J, which the token-mean PolicyLoss estimates on-policy."""
    leaf = theta.detach().clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(-exact_objective(leaf, g, horizon) / horizon, leaf)
    return grad


def sample(fresh: torch.Tensor, stale: torch.Tensor, switch: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """(N, H) responses from mu: position t of response i from `stale` while t < switch[i], else `fresh`."""
    fresh_p, stale_p = torch.softmax(fresh, dim=-1), torch.softmax(stale, dim=-1)
    n, h = switch.numel(), fresh.size(0)
    out = torch.empty((n, h), dtype=torch.long)
    prev = torch.full((n,), SYMBOLS, dtype=torch.long)
    for t in range(h):
        probs = torch.where((t < switch).unsqueeze(-1), stale_p[t, prev], fresh_p[t, prev])
        prev = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
        out[:, t] = prev
    return out


def previous(seq: torch.Tensor) -> torch.Tensor:
    """(N, H) the symbol before each token (the start symbol S before the first)."""
    return torch.cat([torch.full((seq.size(0), 1), SYMBOLS, dtype=torch.long), seq[:, :-1]], dim=1)


def policy_log_probs(theta: torch.Tensor, seq: torch.Tensor) -> torch.Tensor:
    """(N, H) log pi(y_t | y_{t-1})."""
    return torch.log_softmax(theta, dim=-1)[previous(seq), seq]


def rollout_log_probs(fresh, stale, seq: torch.Tensor, switch: torch.Tensor) -> torch.Tensor:
    """(N, H) log mu(y_t | t, y_{t-1}), mu switching per response."""
    t = torch.arange(seq.size(1)).expand_as(seq)
    prev = previous(seq)
    lp_fresh = torch.log_softmax(fresh, dim=-1)[t, prev, seq]
    lp_stale = torch.log_softmax(stale, dim=-1)[t, prev, seq]
    return torch.where(t < switch.unsqueeze(-1), lp_stale, lp_fresh)


def batch_gradients(theta, seq, coef: torch.Tensor, batch_size: int) -> torch.Tensor:
    """(N / batch_size, (S + 1) S) the gradient of each batch's token-mean loss whose per-token derivative in
    log pi(y_t | y_{t-1}) is coef (N, H): sum coef (onehot(y_t) - pi(.|y_{t-1})) into theta's row y_{t-1}."""
    n, h = seq.shape
    pi = torch.softmax(theta, dim=-1)
    prev = previous(seq)
    score = torch.nn.functional.one_hot(seq, SYMBOLS).to(coef.dtype) - pi[prev]  # (N, H, S)
    rows = (torch.arange(n) // batch_size).unsqueeze(-1) * (SYMBOLS + 1) + prev  # (N, H) batch's row of theta
    out = torch.zeros(((n // batch_size) * (SYMBOLS + 1), SYMBOLS), dtype=coef.dtype)
    out.index_add_(0, rows.flatten(), (coef.unsqueeze(-1) * score).reshape(-1, SYMBOLS))
    return out.view(n // batch_size, -1) / (batch_size * h)


def correction_weights(correction: str | None, params: dict, log_pi, log_mu, advantages) -> tuple[torch.Tensor, dict]:
    """(N, H) weights `correction` gives (1 for None) at its band (a divergence gate: its own), and its metrics."""
    if correction is None:
        return torch.ones_like(log_pi), {}
    if correction == SEQUENCE_PRODUCT:
        w = (log_pi - log_mu).sum(-1, keepdim=True).clamp(-20.0, 20.0).exp().expand_as(log_pi)
        return w, {"is/ess": w.mean().square() / w.square().mean()}
    band = default_band(correction, DEFAULT_IS_THRESHOLD)
    mask = torch.ones_like(log_pi, dtype=torch.bool)
    return compute_is_weights(correction, log_pi, log_mu, mask, *band, advantages=advantages, params=params)


def case(horizon: int, profile: str, batches: int, batch_size: int, seed: int, strength: float = 1.0) -> list[dict]:
    """Every correction on one length x profile x strength, all on the same batches."""
    gen = torch.Generator().manual_seed(seed)
    theta, g = make_theta(gen), torch.rand(SYMBOLS, generator=gen, dtype=torch.float64)
    fresh, stale = drift(profile, theta, horizon, gen, strength)
    n = batches * batch_size
    switch = torch.randint(horizon + 1, (n,), generator=gen) if profile == "version_switch" else torch.zeros(n)
    switch = switch.long()
    seq = sample(fresh, stale, switch, gen)
    target = exact_gradient(theta, g, horizon).flatten()
    advantages = g[seq].mean(-1, keepdim=True) - float(exact_objective(theta, g, horizon))  # (N, 1)
    out = []
    for label, correction, params in VARIANTS:
        grads, kept, ess, drift_size = [], [], [], []
        for lo in range(0, n, CHUNK):  # CHUNK is a multiple of batch_size
            part = slice(lo, min(lo + CHUNK, n))
            log_pi = policy_log_probs(theta, seq[part])
            log_mu = rollout_log_probs(fresh, stale, seq[part], switch[part])
            w, m = correction_weights(correction, params, log_pi, log_mu, advantages[part])
            grads.append(batch_gradients(theta, seq[part], -w * advantages[part], batch_size))
            kept.append(float((w > 0).double().mean()))
            ess.append(float(m["is/ess"]) if "is/ess" in m else 1.0)
            drift_size.append(float((log_pi - log_mu).abs().mean()))
        out.append({"response_length": horizon, "profile": profile, "strength": strength, "correction": label,
                    "mean_abs_log_ratio": sum(drift_size) / len(drift_size),
                    **gradient_stats(torch.cat(grads), target), "kept_frac": sum(kept) / len(kept),
                    "ess": sum(ess) / len(ess)})  # fmt: skip
    return out


def gradient_stats(grads: torch.Tensor, target: torch.Tensor) -> dict:
    """Bias and variance of the per-batch estimates `grads` (B, P) against the exact gradient `target` (P,)."""
    mean, norm2, b = grads.mean(0), float(target.square().sum()), grads.size(0)
    cos = torch.nn.functional.cosine_similarity
    error2 = float((mean - target).square().sum()) / norm2
    variance = float((grads - mean).square().sum(-1).mean()) / norm2
    return {
        "cos_mean_estimate": float(cos(mean, target, dim=0)),
        "rel_error": math.sqrt(error2),
        # |E[g] - g*| / |g*| with the mean's own Monte-Carlo share removed: E|mean - g*|^2 = |bias|^2 + tr(Cov) / B
        "rel_bias": math.sqrt(max(0.0, error2 - variance / max(b - 1, 1))),
        "rel_variance": variance,
        "cos_per_batch": float(cos(grads, target.expand_as(grads), dim=-1).mean()),
        "batches": grads.size(0),
    }


# ---------------------------------------------------------------------------------------------- rendering
def render(payload: dict, out_dir: Path) -> str:
    rows, cfg = payload["results"]["rows"], payload["config"]
    stem = NAME + cfg.get("suffix", "")
    strengths = cfg.get("strengths", [1.0])
    lines = [f"### Every correction's gradient against the exact gradient ({cfg['batches']} batches of "
             f"{cfg['batch_size']} responses per case; commit {payload['commit'][:12]}, {payload['machine']['cpu']})",
             "", *_summary(rows, cfg["profiles"], strengths, cfg["lengths"][-1]), "",
             "Per case: the relative bias |E[g] - g*| / |g*| (the Monte-Carlo share removed), its Monte-Carlo standard "
             "error, and in brackets the cosine of the mean estimate with g*; lowest bias per column in bold. The last "
             "columns, at the longest "
             "response: the kept token fraction and one batch's relative MSE (bias^2 + variance) / |g*|^2.",
             ""]  # fmt: skip
    for strength in strengths:
        for profile in cfg["profiles"]:
            lines += _profile_table(rows, profile, strength, cfg["lengths"])
    _plot(rows, cfg, max(strengths), out_dir / f"{stem}.png")
    text = "\n".join(lines)
    (out_dir / f"{stem}.md").write_text(text + "\n")
    return text


def _at(rows: list[dict], profile: str, strength: float) -> dict:
    return {(r["correction"], r["response_length"]): r for r in rows
            if r["profile"] == profile and r.get("strength", 1.0) == strength}  # fmt: skip


def _noise(r: dict) -> float:
    """The Monte-Carlo standard error of the mean estimate, relative to |g*|: sqrt(variance / (batches - 1))."""
    return math.sqrt(r["rel_variance"] / max(r["batches"] - 1, 1))


def _summary(rows: list[dict], profiles: list[str], strengths: list[float], length: int) -> list[str]:
    """At the longest response: per profile and strength, reinforce_pro's bias, how many corrections are less
    biased by more than twice the two noises combined, and the three least biased. The corrections are those
    the result measured (a correction added after it was taken has no row)."""
    measured = [c for c in IS_CORRECTIONS if any(r["correction"] == c for r in rows)]
    out = [f"Summary at {length} tokens: relative bias +- its Monte-Carlo standard error. \"clearly better\": the "
           f"corrections (of the {len(measured)} and none) whose bias is below reinforce_pro's by more than "
           "twice the two standard errors combined.", "",
           "| profile | strength | mean abs log ratio | none | reinforce_pro | clearly better | least biased |",
           "|---" * 7 + "|"]  # fmt: skip
    for strength in strengths:
        for profile in profiles:
            at = _at(rows, profile, strength)
            pro = at[("reinforce_pro", length)]
            others = [(at[(c, length)]["rel_bias"], c) for c in ["none", *measured]]
            better = [
                c for b, c in others if pro["rel_bias"] - b > 2 * math.hypot(_noise(pro), _noise(at[(c, length)]))
            ]
            best = ", ".join(f"{c} {b:.3f}" for b, c in sorted(others)[:3])
            none = at[("none", length)]
            out.append(f"| {profile} | {strength:g} | {none['mean_abs_log_ratio']:.3f} | {none['rel_bias']:.3f} +- "
                       f"{_noise(none):.3f} | {pro['rel_bias']:.3f} +- {_noise(pro):.3f} | "
                       f"{', '.join(better) or 'none'} | {best} |")  # fmt: skip
    return out


def _profile_table(rows: list[dict], profile: str, strength: float, lengths: list[int]) -> list[str]:
    at = _at(rows, profile, strength)
    drift = {n: at[("none", n)]["mean_abs_log_ratio"] for n in lengths}
    best = {n: min(r["rel_bias"] for (c, m), r in at.items() if m == n) for n in lengths}
    head = " | ".join(f"{n} (abs r {drift[n]:.3f})" for n in lengths)
    out = [f"#### {profile}, strength {strength:g}", "",
           f"| correction | {head} | kept at {lengths[-1]} | batch MSE at {lengths[-1]} |",
           "|---" * (len(lengths) + 3) + "|"]  # fmt: skip
    for c in (c for c in CORRECTIONS if (c, lengths[-1]) in at):  # those the result measured
        cells = []
        for n in lengths:
            r = at[(c, n)]
            cell = f"{r['rel_bias']:.3f} +- {_noise(r):.3f} ({r['cos_mean_estimate']:.3f})"
            cells.append(f"**{cell}**" if r["rel_bias"] == best[n] else cell)
        last = at[(c, lengths[-1])]
        mse = last["rel_bias"] ** 2 + last["rel_variance"]
        out.append(f"| {c} | {' | '.join(cells)} | {last['kept_frac']:.3f} | {mse:.3f} |")
    return [*out, ""]


def _plot(rows: list[dict], cfg: dict, strength: float, path: Path) -> None:
    """Relative bias against length, one panel per profile, at the strongest drift, for a few corrections."""
    import matplotlib.pyplot as plt

    shown = ["none", "tis", "icepop", "seq-mask-tis", "reinforce_pro", "minpro", "cppo", "dppo-tv", "sequence-product"]
    profiles = cfg["profiles"]
    fig, axes = plt.subplots(2, (len(profiles) + 1) // 2, figsize=(16, 8), squeeze=False)
    for ax, profile in zip(axes.flat, profiles, strict=False):
        at = _at(rows, profile, strength)
        for c in shown:
            pts = sorted((n, r["rel_bias"]) for (name, n), r in at.items() if name == c)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=c)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{profile} (strength {strength:g})")
        ax.set_xlabel("response length (tokens)")
        ax.set_ylabel("|E[g] - g*| / |g*|")
    for ax in list(axes.flat)[len(profiles) :]:
        ax.axis("off")
    save_figure(fig, axes.flat[0], path)


def options(p) -> None:
    p.add_argument("--quick", action="store_true", help="lengths 8, 64, 256 and 64 batches: about a minute")
    p.add_argument("--batches", type=int, default=512)
    p.add_argument("--batch_size", type=int, default=32, help="responses per batch (CHUNK must be a multiple)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--strengths", default="1,3", help="drift strengths (comma-separated): every noise scale times it")


def measured(args) -> tuple[dict, dict]:
    from tqdm import tqdm

    lengths = (8, 64, 256) if args.quick else LENGTHS
    batches = 64 if args.quick else args.batches
    strengths = [float(x) for x in args.strengths.split(",")]
    config = {"lengths": list(lengths), "profiles": list(PROFILES), "strengths": strengths, "batches": batches,
              "batch_size": args.batch_size, "seed": args.seed, "symbols": SYMBOLS, "stickiness": STICKINESS,
              "band": list(DEFAULT_IS_THRESHOLD), "suffix": "_quick" if args.quick else ""}  # fmt: skip
    rows = []
    cases = [(n, prof, st) for st in strengths for n in lengths for prof in PROFILES]
    for i, (n, profile, strength) in enumerate(tqdm(cases, desc="strength x length x profile")):
        rows += case(n, profile, batches, args.batch_size, args.seed + i % (len(lengths) * len(PROFILES)), strength)
    return config, {"rows": rows}


def main(argv=None) -> int:
    name = lambda args: NAME + ("_quick" if args.quick else "")  # noqa: E731
    return bench_main(argv, name, __doc__, options, measured, render, output=RESULTS_DIR)


if __name__ == "__main__":
    sys.exit(main())
