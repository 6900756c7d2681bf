"""Variable-length attention with PyTorch's SDPA, for --packing_samples where flash-attn is not installed (CPU).

flash-attn's variable-length kernel lets a packed forward put every sequence of a micro-batch in one row:
attention runs per sequence, the linear layers see only real tokens. sdpa and eager have no such kernel: they
need a dense block-diagonal mask over the whole row, whose attention costs N^2 for N packed tokens, so with
them the padding-free path of models/packing.py cuts rows into bins as long as the longest sequence, and with
a rollout's rows of similar length a bin rarely holds two (W3: 16 rows of 46-100 tokens, 15-16 bins of 100
columns, no fewer tokens than the padded batch).

`sdpa_varlen` is sdpa with a variable-length path: given the packed row's sequence boundaries (the forward's
`varlen=` keyword, which transformers hands down to the attention function), it runs causal SDPA on each
sequence's slice of the row and concatenates, so one row holds every sequence and attention costs what the
padded batch's does. Without the keyword it is transformers' sdpa with the mask transformers built (the padded
forwards, or a packed row whose block-diagonal mask transformers derived from the position restarts), so a
model loaded with it is correct on every path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NAME = "sdpa_varlen"  # the attn_implementation a model is loaded with


def segments(position_ids: torch.Tensor) -> list[tuple[int, int]]:
    """(1, L) packed positions, restarting at 0 for every sequence -> [(start, end), ...] of each sequence."""
    starts = (position_ids[0] == 0).nonzero().flatten().tolist()
    ends = [*starts[1:], position_ids.size(1)]
    return list(zip(starts, ends, strict=True))


def varlen_sdpa_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function contract: query (B, H, L, D), key / value (B, Hkv, L, D) -> the (B, L,
    H, D) output and no attention weights. With `varlen=[(start, end), ...]` (B = 1): causal attention within
    each sequence of the row; otherwise sdpa with `attention_mask`."""
    bounds = kwargs.pop("varlen", None)
    if bounds is None or kwargs.get("sliding_window") is not None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)  # fmt: skip
    if query.size(0) != 1:
        raise ValueError(f"varlen attention takes one packed row, got {query.size(0)}")
    groups = query.size(1) // key.size(1)  # grouped-query attention: each key / value head serves `groups`
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    pieces = [  # each (1, length, H, D): the concatenation is then the contiguous output, in one copy
        F.scaled_dot_product_attention(
            query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], dropout_p=dropout, is_causal=True, scale=scaling
        ).transpose(1, 2)
        for s, e in bounds
    ]
    return torch.cat(pieces, dim=1), None


def register() -> None:
    """Make attn_implementation="sdpa_varlen" known to transformers (idempotent). Its masks are sdpa's: the
    padded forwards need them; the variable-length path ignores them."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, varlen_sdpa_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def load_name(attn_implementation: str, packing_samples: bool) -> str:
    """The attn_implementation a trainer model is loaded with: sdpa_varlen (registered here) in place of sdpa
    when the forwards are packed; any other choice as given."""
    if packing_samples and attn_implementation == "sdpa":
        register()
        return NAME
    return attn_implementation
