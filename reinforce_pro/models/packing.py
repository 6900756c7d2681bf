"""--packing_samples: padding-free forwards. The real tokens of a micro-batch's rows are packed, several
sequences per row, with positions restarting at 0 for each sequence, and attention kept within each one.

How attention stays within a sequence: the packed forward passes `position_ids` and no attention mask.
transformers reads sequence boundaries from the position restarts: flash-attn then runs its variable-length
kernel (OpenRLHF's packing on GPU), and sdpa / eager get a block-diagonal causal mask built from the same
boundaries (transformers.masking_utils.find_packed_sequence_indices), which works on CPU.

Why bins and not one long row: with sdpa / eager the block-diagonal mask is dense, so one row of N tokens
costs N^2 in attention where the padded batch costs B * S^2. Rows are therefore packed first-fit-decreasing
into bins as long as the longest row: attention never costs more than the padded batch, and the linear
layers (most of the compute) see only real tokens plus the tail of each bin. With a variable-length kernel
(flash-attn's, or sdpa_varlen of models/varlen_attention.py on CPU) attention runs per sequence whatever the
row's length, so every sequence goes in one row and no bin tails remain. tests/test_packing.py checks that
log-probs, values and gradients equal the padded path's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reinforce_pro.models.varlen_attention import NAME as VARLEN
from reinforce_pro.models.varlen_attention import segments

# kernels that attend within each sequence of a packed row at its own cost: one row for the whole micro-batch
ONE_ROW_ATTENTION = (VARLEN, "flash_attention_2", "flash_attention_3")


@dataclass
class Packed:
    input_ids: torch.Tensor  # (P, L) long, sequences back to back; each bin's tail is filler
    position_ids: torch.Tensor  # (P, L) long, restarting at 0 for every sequence (and for the filler)
    index: torch.Tensor  # (B, S) long, where each real token of the padded batch sits in the flattened (P * L)
    #                      packed batch; -1 for padding


def pack(sequences: torch.Tensor, attention_mask: torch.Tensor, one_row: bool = False) -> Packed:
    """Pack the real tokens (attention_mask 1, contiguous in each row) of a (B, S) batch, first-fit-decreasing,
    into bins of the longest row's length, or with `one_row` all into one row."""
    lengths = attention_mask.sum(dim=1).tolist()
    width = max(sum(lengths) if one_row else max(lengths), 1)
    bins: list[int] = []  # tokens used in each bin
    where: dict[int, tuple[int, int]] = {}  # row -> (bin, offset)
    for row in sorted(range(len(lengths)), key=lambda r: -lengths[r]):
        b = next((b for b, used in enumerate(bins) if used + lengths[row] <= width), len(bins))
        if b == len(bins):
            bins.append(0)
        where[row] = (b, bins[b])
        bins[b] += lengths[row]
    input_ids = torch.zeros(len(bins), width, dtype=sequences.dtype, device=sequences.device)
    position_ids = torch.zeros(len(bins), width, dtype=torch.long, device=sequences.device)
    index = torch.full(attention_mask.shape, -1, dtype=torch.long, device=sequences.device)
    for row, (b, offset) in where.items():
        columns = attention_mask[row].nonzero().flatten()
        n = len(columns)
        input_ids[b, offset : offset + n] = sequences[row, columns]
        position_ids[b, offset : offset + n] = torch.arange(n, device=sequences.device)
        index[row, columns] = b * width + offset + torch.arange(n, device=sequences.device)
    for b, used in enumerate(bins):  # the filler is a sequence of its own: nothing real attends to it
        position_ids[b, used:] = torch.arange(width - used, device=sequences.device)
    return Packed(input_ids, position_ids, index)


def predicting_positions(packed: Packed, num_actions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For the last `num_actions` columns of the padded batch: (B, T) flat packed positions of the token
    before each (whose output predicts it; 0 where there is none), and (B, T) whether the token is real."""
    seq_len = packed.index.size(1)
    cols = torch.arange(seq_len - num_actions, seq_len, device=packed.index.device)
    before = packed.index[:, cols - 1]
    real = (packed.index[:, cols] >= 0) & (before >= 0)
    return before.clamp(min=0), real


def hf_model(model):
    """The HF model inside `model`: a DeepSpeed engine's `.module`, a PEFT model's base, or `model` itself."""
    inner = getattr(model, "module", model)
    return inner.get_base_model() if hasattr(inner, "get_base_model") else inner


def attention_kernel(model) -> str:
    """The attn_implementation of the HF model inside `model`."""
    return getattr(getattr(hf_model(model), "config", None), "_attn_implementation", None) or "sdpa"


def scatter_real(real: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """(N,) values of the real tokens -> (B, T) in the places `real` (B, T) marks, 0 elsewhere (differentiable)."""
    return torch.zeros(real.shape, dtype=values.dtype, device=values.device).masked_scatter(real, values)


def packed_forward(model, packed: Packed, **kwargs):
    """The model's forward over a packed batch: positions restarting per sequence, no attention mask, and for
    sdpa_varlen the row's sequence boundaries."""
    if attention_kernel(model) == VARLEN:
        kwargs["varlen"] = segments(packed.position_ids)
    return model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False, **kwargs)


def response_outputs(
    model, sequences: torch.Tensor, attention_mask: torch.Tensor, num_actions: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One packed forward of a bare backbone (a value model's) over a padded (B, S) batch: the (B, T, D) last
    hidden states at the positions that predict its last `num_actions` tokens, and (B, T) whether each of those
    tokens is real (the outputs of padding are meaningless)."""
    packed = pack(sequences, attention_mask, one_row=attention_kernel(model) in ONE_ROW_ATTENTION)
    before, real = predicting_positions(packed, num_actions)
    x = packed_forward(model, packed).last_hidden_state
    return x.reshape(-1, x.size(-1))[before], real


def response_logits(
    model, sequences: torch.Tensor, attention_mask: torch.Tensor, num_actions: int, logits_to_keep: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """One packed forward of a causal LM over a padded (B, S) batch: the (N, V) logits that predict its real
    response tokens (those among the last `num_actions` columns, in row-major order) and the (B, T) mask of
    where they sit. `logits_to_keep`: the model's forward takes HF's logits_to_keep, so the LM head runs on
    those positions only (in one row exactly them; across bins the columns where some bin predicts a response
    token); otherwise on every position."""
    packed = pack(sequences, attention_mask, one_row=attention_kernel(model) in ONE_ROW_ATTENTION)
    before, real = predicting_positions(packed, num_actions)
    flat = before[real]  # flat packed positions, (N,)
    if not logits_to_keep:
        x = packed_forward(model, packed).logits
        return x.reshape(-1, x.size(-1))[flat], real
    bins, width = packed.input_ids.shape
    if bins == 1:  # the head on exactly the predicting positions, already in the order wanted
        if not len(flat):
            return packed_forward(model, packed, logits_to_keep=flat.new_zeros(1)).logits[0, :0], real
        # squeeze, not [0]: indexing's backward would write its gradient into a fresh (1, N, V) zero tensor
        return packed_forward(model, packed, logits_to_keep=flat).logits.squeeze(0), real
    keep = torch.unique(flat % width) if len(flat) else flat.new_zeros(1)
    x = packed_forward(model, packed, logits_to_keep=keep).logits  # (P, len(keep), V)
    at = (flat // width) * len(keep) + torch.searchsorted(keep, flat % width)
    return x.reshape(-1, x.size(-1))[at], real
