"""Part 1 of the IS-correction benchmark: bias, variance and MSE of corrected policy gradients against the
exact gradient, on a policy small enough to enumerate every sequence.

The policy is a tabular autoregressive model over `symbols` tokens and `horizon` positions:
pi(y_t | t, y_{t-1}) = softmax(theta[t, y_{t-1}]) (y_{-1} is a start symbol). Every one of the
symbols^horizon sequences gets a fixed reward in [0, 1]. The exact objective is J = sum_y pi(y) R(y) and
its gradient is computed by autograd through that sum (checked against finite differences in the tests).

The rollout policy mu differs from pi by a controlled drift of its logits (DRIFTS). Batches are drawn
from mu; each batch's gradient estimate is the gradient of the real `PolicyLoss` (token-level mean, the
advantage of every token = the sequence reward, old = pi, rollout = mu), so with no correction and mu = pi
it is an unbiased estimate of -(1/horizon) grad J. Over many batches we report, per correction and band:
bias^2, variance and MSE of the estimate (and as ratios to the uncorrected estimator), the cosine between
the mean estimate and the exact gradient, the mean per-batch cosine, and the fraction of tokens kept.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from reinforce_pro.algos.is_correction import DIVERGENCE_BANDS, IS_CORRECTIONS
from reinforce_pro.algos.losses import PolicyLoss

CORRECTIONS = ["none", *IS_CORRECTIONS]
BANDS = [(0.5, 5.0), (0.8, 2.0), (0.2, 10.0)]


@dataclass
class Problem:
    theta: torch.Tensor  # (H, S + 1, S) logits of pi; row S of dim 1 is the start symbol
    rollout_theta: torch.Tensor  # (H, S + 1, S) logits of mu
    rewards: torch.Tensor  # (S^H,) reward of every sequence, in enumeration order
    sequences: torch.Tensor  # (S^H, H) every sequence

    @property
    def horizon(self) -> int:
        return self.theta.size(0)

    @property
    def symbols(self) -> int:
        return self.theta.size(2)


def all_sequences(symbols: int, horizon: int) -> torch.Tensor:
    return torch.tensor(list(itertools.product(range(symbols), repeat=horizon)), dtype=torch.long)


def token_log_probs(theta: torch.Tensor, sequences: torch.Tensor) -> torch.Tensor:
    """(N, H) log pi(y_t | t, y_{t-1}) of each token of `sequences` under logits `theta`."""
    n, h = sequences.shape
    start = torch.full((n, 1), theta.size(1) - 1, dtype=torch.long)
    prev = torch.cat([start, sequences[:, :-1]], dim=1)  # (N, H)
    logits = theta[torch.arange(h).expand(n, h), prev]  # (N, H, S)
    return torch.log_softmax(logits, dim=-1).gather(-1, sequences.unsqueeze(-1)).squeeze(-1)


def exact_objective(theta: torch.Tensor, problem: Problem) -> torch.Tensor:
    """J(theta) = sum over every sequence of pi(y) R(y)."""
    return (token_log_probs(theta, problem.sequences).sum(-1).exp() * problem.rewards).sum()


def exact_gradient(problem: Problem) -> torch.Tensor:
    """The target of the estimators: the gradient of -(1/H) J, the loss PolicyLoss estimates."""
    theta = problem.theta.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(-exact_objective(theta, problem) / problem.horizon, theta)
    return g


# ------------------------------------------------------------------------------ drift patterns
# Each maps (theta, generator) -> rollout logits. Sizes are chosen so that the per-token ratios mostly stay
# near 1 where the pattern says "small" and leave [0.5, 5] where it says "large".


def _uniform(theta, gen):
    return theta + 0.25 * torch.randn(theta.shape, generator=gen, dtype=theta.dtype)


def _early_burst(theta, gen):
    drift = torch.zeros_like(theta)
    drift[:2] = 2.0 * torch.randn(theta[:2].shape, generator=gen, dtype=theta.dtype)
    return theta + drift


def _progressive(theta, gen):
    h = theta.size(0)
    scale = 1.5 * torch.arange(h, dtype=theta.dtype) / max(h - 1, 1)
    return theta + scale.view(h, 1, 1) * torch.randn(theta.shape, generator=gen, dtype=theta.dtype)


def _isolated_spikes(theta, gen, count: int = 4):
    """`count` logits, among those some sequence can reach, moved by +-3."""
    reachable = torch.zeros(theta.shape, dtype=torch.bool)
    reachable[0, -1] = True  # position 0 follows the start symbol
    reachable[1:, :-1] = True  # later positions follow a real symbol
    candidates = torch.nonzero(reachable)
    chosen = candidates[torch.randperm(len(candidates), generator=gen)[:count]]
    out = theta.clone()
    for t, prev, v in chosen.tolist():
        out[t, prev, v] += 3.0 if torch.rand((), generator=gen) < 0.5 else -3.0
    return out


def _sequence_temperature(theta, gen):
    return theta / 1.6  # a flatter sampler over the whole sequence


DRIFTS: dict[str, Callable] = {
    "uniform": _uniform,
    "early_burst": _early_burst,
    "progressive": _progressive,
    "isolated_spikes": _isolated_spikes,
    "sequence_temperature": _sequence_temperature,
}


def make_problem(drift: str | None, symbols: int = 3, horizon: int = 5, seed: int = 0) -> Problem:
    gen = torch.Generator().manual_seed(seed)
    theta = torch.randn((horizon, symbols + 1, symbols), generator=gen, dtype=torch.float64)
    sequences = all_sequences(symbols, horizon)
    rewards = torch.rand(len(sequences), generator=gen, dtype=torch.float64)
    rollout = theta.clone() if drift is None else DRIFTS[drift](theta, gen)
    return Problem(theta, rollout, rewards, sequences)


def batch_gradient(problem: Problem, index: torch.Tensor, loss_fn: PolicyLoss) -> tuple[torch.Tensor, float]:
    """The gradient of `loss_fn` on the sequences `index` (sampled from mu), and the kept-token fraction."""
    theta = problem.theta.detach().clone().requires_grad_(True)
    seq = problem.sequences[index]
    log_probs = token_log_probs(theta, seq)
    rollout = token_log_probs(problem.rollout_theta, seq)
    advantages = problem.rewards[index].unsqueeze(-1).expand_as(log_probs)
    loss, metrics = loss_fn(log_probs, log_probs.detach(), advantages, rollout_log_probs=rollout)
    (g,) = torch.autograd.grad(loss, theta)
    kept = 1.0 - float(metrics["is/token_masked_frac"]) if "is/token_masked_frac" in metrics else 1.0
    return g, kept


def estimator_stats(
    problem: Problem, correction: str, band: tuple[float, float], batches: int, batch_size: int, seed: int
) -> dict:
    """Bias^2, variance, MSE and cosines of one estimator over `batches` batches drawn from mu."""
    loss_fn = PolicyLoss(
        enable_vllm_is_correction=correction != "none",
        vllm_is_correction_type="tis" if correction == "none" else correction,
        vllm_is_truncated_threshold=list(band),
    )
    mu = token_log_probs(problem.rollout_theta, problem.sequences).sum(-1).exp()
    gen = torch.Generator().manual_seed(seed)
    target = exact_gradient(problem).flatten()
    grads, kept = [], []
    for _ in range(batches):
        index = torch.multinomial(mu, batch_size, replacement=True, generator=gen)
        g, k = batch_gradient(problem, index, loss_fn)
        grads.append(g.flatten())
        kept.append(k)
    g = torch.stack(grads)  # (batches, P)
    mean = g.mean(0)
    bias2 = float((mean - target).square().sum())
    var = float((g - mean).square().sum(-1).mean())
    cos = torch.nn.functional.cosine_similarity
    return {
        "bias2": bias2,
        "variance": var,
        "mse": float((g - target).square().sum(-1).mean()),
        "cos_mean_estimate": float(cos(mean, target, dim=0)),
        "cos_per_batch": float(cos(g, target.expand_as(g), dim=-1).mean()),
        "kept_frac": sum(kept) / len(kept),
        "target_norm2": float(target.square().sum()),
    }


def correction_bands() -> list[tuple[str, tuple[float, float]]]:
    """Every correction with every band of BANDS; a divergence gate (which reads [0, HIGH]) with its own band."""
    return [(c, b) for c in IS_CORRECTIONS for b in ([DIVERGENCE_BANDS[c]] if c in DIVERGENCE_BANDS else BANDS)]


def run_study(batches: int, batch_size: int, symbols: int = 3, horizon: int = 5, seed: int = 0, progress=None):
    """Every drift x correction x band; `none` is measured once per drift (it has no band)."""
    rows = []
    for drift in DRIFTS:
        problem = make_problem(drift, symbols, horizon, seed)
        ratios = token_log_probs(problem.theta, problem.sequences) - token_log_probs(
            problem.rollout_theta, problem.sequences
        )
        drift_size = float(ratios.abs().mean())
        base = estimator_stats(problem, "none", BANDS[0], batches, batch_size, seed + 1)
        base.update({f"{k}_ratio_to_none": 1.0 for k in ("bias2", "variance", "mse")})
        rows.append({"drift": drift, "correction": "none", "band": None, "mean_abs_log_ratio": drift_size, **base})
        for correction, band in correction_bands():
            stats = estimator_stats(problem, correction, band, batches, batch_size, seed + 1)
            stats.update({f"{k}_ratio_to_none": stats[k] / base[k] for k in ("bias2", "variance", "mse")})
            rows.append(
                {
                    "drift": drift,
                    "correction": correction,
                    "band": list(band),
                    "mean_abs_log_ratio": drift_size,
                    **stats,
                }
            )
            if progress:
                progress()
    return rows
