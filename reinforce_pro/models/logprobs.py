"""Per-token log-probabilities of the response under a causal LM, computed the way the rollout engine
computes them, so that in float32 the two agree to ~1e-6.

Two details must match vLLM: positions restart at 0 at the first real prompt token (left padding must
not shift them), and the temperature divides the logits before the softmax (vLLM's
`logprobs_mode="processed_logprobs"`).
"""

from __future__ import annotations

import torch


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, S) attention mask -> (B, S) positions counting real tokens from 0 (padding gets 0)."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def forward_logits(model, sequences: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, S, V) logits of `model` (an HF causal LM or a DeepSpeed engine wrapping one)."""
    out = model(
        input_ids=sequences,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
    )
    return out.logits


def action_log_probs(
    logits: torch.Tensor, sequences: torch.Tensor, num_actions: int, temperature: float = 1.0, with_entropy=False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (B, T) of the last `num_actions` tokens of `sequences` and, if asked, the entropy (B, T)
    of the distribution each was sampled from (it costs a (B, T, V) softmax). logits: (B, S, V)."""
    # The token at position s is predicted by the logits at s - 1.
    step_logits = logits[:, -num_actions - 1 : -1, :].float()
    if temperature != 1.0:
        step_logits = step_logits / temperature
    log_z = torch.logsumexp(step_logits, dim=-1)
    targets = sequences[:, -num_actions:]
    token_logits = step_logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    log_probs = token_logits - log_z
    if not with_entropy:
        return log_probs, None
    probs = torch.softmax(step_logits, dim=-1)
    entropy = log_z - (probs * step_logits).sum(dim=-1)
    return log_probs, entropy
