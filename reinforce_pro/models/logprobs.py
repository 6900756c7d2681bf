"""Per-token log-probabilities of the response under a causal LM, computed the way the rollout engine
computes them, so that in float32 the two agree to ~1e-6.

Three details must match vLLM: positions restart at 0 at the first real prompt token (left padding must
not shift them), the temperature divides the logits before the softmax (vLLM's
`logprobs_mode="processed_logprobs"`), and the engine's sampling filters (top-k, top-p, min-p, a minimum
length) remove the same tokens before it (models/sampling_filter.py).
"""

from __future__ import annotations

import inspect

import torch

from reinforce_pro.models.packing import hf_model, response_logits, scatter_real
from reinforce_pro.models.sampling_filter import SamplingFilter, apply_filter


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, S) attention mask -> (B, S) positions counting real tokens from 0 (padding gets 0)."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def forward_logits(
    model, sequences: torch.Tensor, attention_mask: torch.Tensor, predicting: int | None = None
) -> torch.Tensor:
    """(B, S, V) logits of `model` (an HF causal LM, or a DeepSpeed engine or PEFT model wrapping one), or with
    `predicting` = T only the (B, T, V) logits that predict the last T tokens (those at positions S-T-1 .. S-2):
    the LM head then runs on those positions alone (HF's logits_to_keep, given their indices), so neither the
    prompt's logits nor the last position's are computed, and the backward writes no vocabulary-wide zeros for
    them. A model whose forward lacks logits_to_keep computes every position and is sliced."""
    width = sequences.shape[1]
    wanted = None if predicting is None else torch.arange(width - predicting - 1, width - 1, device=sequences.device)
    keep = {"logits_to_keep": wanted} if wanted is not None and accepts_logits_to_keep(model) else {}
    out = model(
        input_ids=sequences,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
        **keep,
    )
    return out.logits if wanted is None or keep else out.logits[:, -predicting - 1 : -1]


def accepts_logits_to_keep(model) -> bool:
    """Whether the HF model inside `model` (a DeepSpeed engine's `.module`, a PEFT model's base) can skip the
    LM head on positions whose logits are not wanted."""
    return "logits_to_keep" in inspect.signature(hf_model(model).forward).parameters


def action_log_probs(
    logits: torch.Tensor, sequences: torch.Tensor, num_actions: int, temperature: float = 1.0, with_entropy=False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (B, T) of the last `num_actions` tokens of `sequences` and, if asked, the entropy (B, T)
    of the distribution each was sampled from (it costs a (B, T, V) softmax). logits: (B, S, V)."""
    # The token at position s is predicted by the logits at s - 1.
    step_logits = logits[:, -num_actions - 1 : -1, :]
    return token_log_probs(step_logits, sequences[:, -num_actions:], temperature, with_entropy)


def token_log_probs(
    step_logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, with_entropy=False,
    sampling_filter: SamplingFilter | None = None, positions: torch.Tensor | None = None,
    outside: list[torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """(B, T) log-probs of `targets` (B, T) under the logits that predict them (B, T, V), temperature
    applied first (vLLM's processed_logprobs), then the engine's `sampling_filter` (its support renormalised;
    `positions`: each target's index in its response, for a minimum length; for (B, T, V) logits 0..T-1), and
    the (B, T) entropy of that distribution if asked. Also takes (N, V) logits with (N,) targets. `outside`: a
    list that receives, under an active filter, the (B, T) bool of targets the trainer's filter would have
    removed (kept in the support all the same: sampling_filter.py)."""
    step_logits = step_logits.float()
    if temperature != 1.0:
        step_logits = step_logits / temperature
    if sampling_filter is not None and sampling_filter.active:
        step_logits, removed = apply_filter(step_logits, targets, sampling_filter, positions)
        if outside is not None:
            outside.append(removed)
    if not with_entropy:
        return _TokenLogProbs.apply(step_logits, targets), None
    log_z = torch.logsumexp(step_logits, dim=-1)
    log_probs = step_logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_z
    probs = torch.softmax(step_logits, dim=-1)
    entropy = log_z - (probs * step_logits.masked_fill(probs == 0, 0.0)).sum(dim=-1)  # 0 * -inf: no NaN
    return log_probs, entropy


class _TokenLogProbs(torch.autograd.Function):
    """log_softmax(logits)[target] with a hand-written backward over the (..., V) logits: the gradient
    (onehot(target) - softmax) * grad is built in one tensor, in place. Autograd's version of logsumexp and
    gather allocates and writes four vocabulary-wide tensors for it (the difference, its exp, the product, the
    zeros gather scatters into) and adds two of them; this one is about twice as fast on a CPU and a third of the
    memory on a GPU, with bit-identical values and gradients (tests/test_padding.py; benchmarks/gpu_check.py)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        log_z = torch.logsumexp(logits, dim=-1)
        ctx.save_for_backward(logits, targets, log_z)
        return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_z

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        logits, targets, log_z = ctx.saved_tensors
        grad = grad.unsqueeze(-1)
        grad_logits = torch.sub(logits, log_z.unsqueeze(-1)).exp_().mul_(-grad)  # -softmax * grad
        return grad_logits.scatter_add_(-1, targets.unsqueeze(-1), grad), None


def response_log_probs(
    model, sequences: torch.Tensor, attention_mask: torch.Tensor, num_actions: int, temperature: float = 1.0,
    with_entropy: bool = False, packed: bool = False, sampling_filter: SamplingFilter | None = None,
    outside: list[torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """(B, T) log-probs (and entropy) of the response tokens under `model`, from a padded forward or, with
    `packed` (--packing_samples), a padding-free one (models/packing.py), under the engine's `sampling_filter`
    (token_log_probs; `outside` receives its (B, T) flags). Padding positions of the packed path hold 0;
    action_mask excludes them either way."""
    if not packed:  # only the logits that predict the response
        logits = forward_logits(model, sequences, attention_mask, predicting=num_actions)
        targets = sequences[:, -num_actions:]
        return token_log_probs(logits, targets, temperature, with_entropy, sampling_filter, outside=outside)
    logits, real = response_logits(model, sequences, attention_mask, num_actions, accepts_logits_to_keep(model))
    targets = sequences[:, -num_actions:][real]
    positions = real.nonzero(as_tuple=True)[1]  # each real token's response column, in the same row-major order
    flags = [] if outside is not None else None
    log_probs, entropy = token_log_probs(
        logits, targets, temperature, with_entropy, sampling_filter, positions, flags
    )  # (N,): the real tokens
    if flags:
        outside.append(scatter_real(real, flags[0]))
    return scatter_real(real, log_probs), (scatter_real(real, entropy) if entropy is not None else None)
