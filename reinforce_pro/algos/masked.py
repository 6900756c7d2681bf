"""Masked reductions and the one loss aggregation used by every loss in the project.

All functions select with `torch.where` instead of multiplying by the mask: a NaN or inf sitting at a
masked position (padding, a prompt token) must not reach the result, and `0 * inf` is NaN.
"""

from __future__ import annotations

import torch


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `values` where `mask` is true. values, mask: same shape, e.g. (B, T)."""
    selected = torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))
    return selected.sum() if dim is None else selected.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` where `mask` is true; 0 where the mask selects nothing (never NaN)."""
    count = mask.bool().sum() if dim is None else mask.bool().sum(dim=dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1).to(values.dtype)


def aggregate_loss(
    loss: torch.Tensor,
    loss_mask: torch.Tensor,
    token_level_loss: bool = True,
    dp_size: int = 1,
    batch_num_tokens: float | None = None,
    global_batch_size: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss (B, T) to a scalar, invariant to how the global batch is sharded.

    - token level: sum of the masked per-token losses / number of loss tokens in the global batch;
    - sequence level: sum of each sequence's masked token mean / number of sequences in the global batch
      (sequences with no loss token count in neither sum).

    `batch_num_tokens` / `global_batch_size` are the totals over all data-parallel ranks (and all
    micro-batches of one optimizer step); the data-parallel engine averages gradients over `dp_size`
    ranks, so the local loss is multiplied by `dp_size` to cancel that average. Without the totals the
    loss is the local mean (dp_size is then ignored), as in OpenRLHF.
    """
    mask = loss_mask.bool()
    if token_level_loss:
        if batch_num_tokens is None:
            return masked_mean(loss, mask)
        return masked_sum(loss, mask) / max(batch_num_tokens, 1) * dp_size  # 0 tokens (all dropped): loss 0

    token_counts = mask.sum(dim=-1)
    has_tokens = token_counts > 0
    seq_loss = masked_sum(loss, mask, dim=-1) / token_counts.clamp(min=1).to(loss.dtype)
    if global_batch_size is None:
        return masked_mean(seq_loss, has_tokens)
    return masked_sum(seq_loss, has_tokens) / max(global_batch_size, 1) * dp_size
