"""--packing_samples: padding-free forwards. The real tokens of a micro-batch's rows are packed, several
sequences per row, with positions restarting at 0 for each sequence, and attention kept within each one.

How attention stays within a sequence: the packed forward passes `position_ids` and no attention mask.
transformers reads sequence boundaries from the position restarts: flash-attn then runs its variable-length
kernel (OpenRLHF's packing on GPU), and sdpa / eager get a block-diagonal causal mask built from the same
boundaries (transformers.masking_utils.find_packed_sequence_indices), which works on CPU.

Why bins and not one long row: with sdpa / eager the block-diagonal mask is dense, so one row of N tokens
costs N^2 in attention where the padded batch costs B * S^2. Rows are therefore packed first-fit-decreasing
into bins as long as the longest row: attention never costs more than the padded batch, and the linear
layers (most of the compute) see only real tokens plus the tail of each bin. tests/test_packing.py checks
that log-probs, values and gradients equal the padded path's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Packed:
    input_ids: torch.Tensor  # (P, L) long, sequences back to back; each bin's tail is filler
    position_ids: torch.Tensor  # (P, L) long, restarting at 0 for every sequence (and for the filler)
    index: torch.Tensor  # (B, S) long, where each real token of the padded batch sits in the flattened (P * L)
    #                      packed batch; -1 for padding


def pack(sequences: torch.Tensor, attention_mask: torch.Tensor) -> Packed:
    """Pack the real tokens (attention_mask 1, contiguous in each row) of a (B, S) batch, first-fit-decreasing,
    into bins of the longest row's length."""
    lengths = attention_mask.sum(dim=1).tolist()
    width = max(max(lengths), 1)
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


def response_outputs(
    model, sequences: torch.Tensor, attention_mask: torch.Tensor, num_actions: int, hidden: bool = False,
    logits_to_keep: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """One packed forward of a padded (B, S) batch: the (B, T, D) outputs at the positions that predict its
    last `num_actions` tokens (logits of a causal LM, or with `hidden` the last hidden state of a bare
    backbone) and (B, T) whether each of those tokens is real (outputs of padding are meaningless).
    `logits_to_keep`: the model's forward takes HF's logits_to_keep; the LM head then runs only on the packed
    columns where some bin predicts a response token (the prompts' columns mostly drop out)."""
    packed = pack(sequences, attention_mask)
    before, real = predicting_positions(packed, num_actions)
    inputs = {"input_ids": packed.input_ids, "position_ids": packed.position_ids, "use_cache": False}
    if hidden or not logits_to_keep:
        out = model(**inputs)
        x = out.last_hidden_state if hidden else out.logits
        return x.reshape(-1, x.size(-1))[before], real
    width = packed.input_ids.size(1)
    keep = torch.unique(before[real] % width) if bool(real.any()) else before.new_zeros(1)
    x = model(**inputs, logits_to_keep=keep).logits  # (P, len(keep), V)
    at = (before // width) * len(keep) + torch.searchsorted(keep, before % width).clamp(max=len(keep) - 1)
    return x.reshape(-1, x.size(-1))[at], real
