"""The rollout engine's sampling filters, replayed on the trainer's logits.

With top-k, top-p, min-p or a minimum length, the engine samples from a truncated distribution: the kept
tokens' probabilities renormalised, everything else 0, and the log-probs it returns are of that distribution
(vLLM's processed log-probs). A trainer that scores the full softmax sees every ratio pi / mu shrunk by the
kept mass S of its position, a "mismatch" that is the filter's, not drift: a correction then weighs tokens
by ~S and a tight band masks healthy ones.

The behaviour policy here is the filtered one, on both sides: the trainer applies the same filters, in the
engine's order, to its own temperature-scaled logits and renormalises over what they keep (DeepSeek-V3.2's
"keep sampling mask", arXiv:2512.02556 section 3.1; prime-rl and TRL replay the support the same way). The
sampled token always stays in the support: where the two sides' logits differ (a bf16 engine) a token can sit
just outside the trainer's filter, and dropping it would give log 0; those tokens are counted instead.

vLLM 0.32's order, which this follows: minimum tokens (stop tokens hidden before the minimum), temperature,
min-p (drop p < min_p * max p), top-k (keep logits >= the k-th largest, ties kept), top-p (ascending sort, keep
a token while the mass at or below it exceeds 1 - top_p; the most likely token always stays).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

ROWS_PER_SORT = 256  # positions whose vocabulary is sorted at once for top-p: bounds the (rows, V) sort's memory


@dataclass(frozen=True)
class SamplingFilter:
    """What the engine removed from each position's distribution before sampling."""

    top_k: int = -1  # keep the k largest logits (ties at the k-th kept); <= 0: off
    top_p: float = 1.0  # nucleus: keep the most likely tokens until their mass reaches top_p; 1: off
    min_p: float = 0.0  # drop tokens less likely than min_p x the most likely one; 0: off
    min_tokens: int = 0  # response positions before this one cannot end: stop_token_ids hidden there
    stop_token_ids: tuple[int, ...] = ()  # the ids a minimum length hides (the engine's EOS and stop ids)

    @property
    def active(self) -> bool:
        """Whether the filter removes anything (else the full softmax is the engine's distribution)."""
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0 or self.hides_stops

    @property
    def hides_stops(self) -> bool:
        return self.min_tokens > 0 and bool(self.stop_token_ids)


@torch.no_grad()
def kept_support(logits: torch.Tensor, filt: SamplingFilter, positions: torch.Tensor | None = None) -> torch.Tensor:
    """(N, V) bool: the tokens the engine could sample at each of N positions, from (N, V) temperature-scaled
    logits; `positions` (N,): each position's index in its response (needed by min_tokens only)."""
    logits = logits.detach().float()
    keep = torch.ones_like(logits, dtype=torch.bool)
    if filt.hides_stops:
        if positions is None:
            raise ValueError("a SamplingFilter with min_tokens needs each position's index in its response")
        early = positions < filt.min_tokens
        stops = torch.tensor(filt.stop_token_ids, device=logits.device)
        keep[early.nonzero(as_tuple=True)[0].unsqueeze(1), stops.unsqueeze(0)] = False
        logits = logits.masked_fill(~keep, float("-inf"))
    if filt.min_p > 0.0:
        probs = logits.softmax(dim=-1)
        keep &= probs >= probs.amax(dim=-1, keepdim=True) * filt.min_p
        logits = logits.masked_fill(~keep, float("-inf"))
    top_k = filt.top_k if 0 < filt.top_k < logits.size(-1) else None
    if filt.top_p < 1.0:  # top-k inside the same sort, as the engine does: tied logits then break alike
        for rows in torch.arange(logits.size(0), device=logits.device).split(ROWS_PER_SORT):
            keep[rows] &= _sorted_support(logits[rows], top_k, filt.top_p)
    elif top_k is not None:  # top-k alone needs no sort
        keep &= logits >= logits.topk(top_k, dim=-1).values[:, -1:]
    return keep


def _sorted_support(logits: torch.Tensor, top_k: int | None, top_p: float) -> torch.Tensor:
    """(n, V) bool: the top-k then top-p set of each row, computed as the engine does: one ascending sort, the
    k-th largest logit as the floor, then the cumulative mass from below."""
    ordered, order = logits.sort(dim=-1, descending=False)
    if top_k is not None:
        kth = ordered[:, ordered.size(-1) - top_k].unsqueeze(-1)  # the k-th largest
        ordered = ordered.masked_fill(ordered < kth, float("-inf"))
    below = ordered.softmax(dim=-1).cumsum(dim=-1) <= 1.0 - top_p  # the mass at or below a token is small
    below[:, -1] = False  # the most likely token always stays
    removed = below | torch.isinf(ordered)
    return torch.empty_like(below).scatter_(-1, order, ~removed)


def apply_filter(
    logits: torch.Tensor, targets: torch.Tensor, filt: SamplingFilter, positions: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(..., V) temperature-scaled logits -> (the logits with every token outside the engine's support at -inf,
    differentiable in the kept ones; (...) bool: targets the filter alone would have removed). The sampled
    `targets` (...) always stay in the support. `positions` (...): response index of each position; for
    (B, T, V) logits it defaults to 0..T-1 along T."""
    shape = logits.shape
    flat = logits.reshape(-1, shape[-1])
    if positions is None and logits.dim() == 3:
        positions = torch.arange(shape[1], device=logits.device).expand(shape[0], -1)
    keep = kept_support(flat, filt, None if positions is None else positions.reshape(-1))
    picked = targets.reshape(-1, 1)
    outside = ~keep.gather(-1, picked).squeeze(-1)
    keep.scatter_(-1, picked, True)
    return flat.masked_fill(~keep, float("-inf")).reshape(shape), outside.reshape(targets.shape)


def with_engine_stop_ids(filt: SamplingFilter | None, model_dir: str) -> SamplingFilter | None:
    """`filt` with the ids vLLM hides before a minimum length for the model in `model_dir`: the tokenizer's EOS
    and the EOS ids of its generation config (generation_config.json, else config.json), as vLLM collects
    them into a request's stop-token set. A filter without a minimum length is returned as it is."""
    if filt is None or filt.min_tokens <= 0:
        return filt
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    ids = {AutoTokenizer.from_pretrained(model_dir).eos_token_id}
    try:
        eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
    except OSError:  # no generation_config.json: vLLM builds one from config.json
        eos = GenerationConfig.from_model_config(AutoConfig.from_pretrained(model_dir)).eos_token_id
    ids |= {eos} if isinstance(eos, int) else set(eos or ())
    return replace(filt, stop_token_ids=tuple(sorted(i for i in ids if i is not None)))
