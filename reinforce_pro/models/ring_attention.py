"""Ring attention (--ring_attn_size, OpenRLHF's sequence parallelism): one packed row split along the sequence
over a ring of ranks, so that no rank holds the activations of the whole row.

Each rank of a ring holds one contiguous block of the row's columns and computes the queries, keys and values
of its block only. Attention needs every earlier key of the same sequence, so the key / value blocks travel
around the ring: at step t rank r attends with its queries to the block of rank r - t, then passes that block
to rank r + 1 and receives the next from rank r - 1 (torch.distributed point-to-point: gloo on CPU, NCCL on
GPU). The partial results are merged with the running log-sum-exp (the online softmax of FlashAttention), so
the output equals attention over the whole row. Blocks that lie entirely after a rank's queries are skipped
(causal), and the mask inside a block follows the packed sequences: a query sees a key only in its own
sequence (sequence ids from the position restarts, as models/packing.py packs them) and not after itself.

The backward pass goes around the ring again: each block travels with the gradients of its keys and values
accumulated so far, every rank adds its share, and one last hop returns them to the block's owner.

How a model uses it: `register()` adds the attention function under the name "ring" to transformers'
AttentionInterface (with no mask: the ring builds its own), the model is loaded with
attn_implementation="ring", and each forward passes `ring=RingContext(...)` (transformers hands extra
keywords of the model's forward down to the attention function). Grouped-query attention sends the compact
key / value heads and repeats them on arrival.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from reinforce_pro.models.logprobs import token_log_probs
from reinforce_pro.models.packing import pack, predicting_positions, scatter_real
from reinforce_pro.models.sampling_filter import SamplingFilter

NAME = "ring"  # the attn_implementation a model is loaded with


@dataclass
class RingContext:
    """Where this rank's block sits in the row, passed to the model's forward as `ring=`.

    segments: (B, n * block) sequence id of every column of the whole (padded) row, the same on every rank of
    the ring (each rank packs the whole micro-batch, then keeps its block); block: columns per rank; rank /
    ranks: this rank's place in the ring, as global ranks of `group` (the ring's process group)."""

    segments: torch.Tensor
    block: int
    rank: int  # index in the ring, 0 .. size - 1
    ranks: list[int]  # the global ranks of the ring, in ring order
    group: dist.ProcessGroup | None = None

    @property
    def size(self) -> int:
        return len(self.ranks)

    def columns(self, index: int) -> slice:
        return slice(index * self.block, (index + 1) * self.block)


def sequence_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """(B, L) packed positions (restarting at 0 for every sequence) -> (B, L) sequence ids (0, 1, ...)."""
    return (position_ids == 0).long().cumsum(dim=-1)


def pad_to_ring(input_ids: torch.Tensor, position_ids: torch.Tensor, size: int):
    """Widen a packed (P, L) batch to a multiple of the ring size: the extra columns are filler that
    continues the row's last sequence ids nowhere (a sequence of its own: positions from 0)."""
    extra = -input_ids.size(1) % size
    if not extra:
        return input_ids, position_ids
    pad_ids = input_ids.new_zeros(input_ids.size(0), extra)
    pad_pos = torch.arange(extra, device=position_ids.device).expand(position_ids.size(0), extra)
    return torch.cat([input_ids, pad_ids], dim=1), torch.cat([position_ids, pad_pos], dim=1)


def ring_block(width: int, size: int) -> int:
    """Columns each rank of a ring of `size` forwards of packed rows `width` wide (pad_to_ring widens them to a
    multiple of the ring)."""
    return (width + -width % size) // size


def block_places(flat: torch.Tensor, width: int, block: int, start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For places `flat` (row * width + column) of packed rows `width` wide: whether each lies in the block of
    columns [start, start + block) one ring rank forwards, and its place in that rank's (rows, block) input,
    flattened (meaningful where it lies there)."""
    column = flat % width
    return (column >= start) & (column < start + block), (flat // width) * block + column - start


def _exchange(ctx: RingContext, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Send `tensors` to the next rank of the ring and return the ones the previous rank sent."""
    nxt, prev = ctx.ranks[(ctx.rank + 1) % ctx.size], ctx.ranks[(ctx.rank - 1) % ctx.size]
    received = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    ops = [dist.P2POp(dist.isend, t.contiguous(), nxt, ctx.group) for t in tensors]
    ops += [dist.P2POp(dist.irecv, r, prev, ctx.group) for r in received]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    return received


def _allowed(ctx: RingContext, q_block: int, k_block: int) -> torch.Tensor | None:
    """(B, 1, Sq, Sk) which keys of block `k_block` each query of block `q_block` sees; None: none at all."""
    if k_block > q_block:
        return None  # every key lies after every query
    seg_q, seg_k = ctx.segments[:, ctx.columns(q_block)], ctx.segments[:, ctx.columns(k_block)]
    allowed = seg_q[:, :, None] == seg_k[:, None, :]
    if k_block == q_block:
        allowed = allowed & torch.ones(ctx.block, ctx.block, dtype=torch.bool, device=allowed.device).tril()
    return allowed[:, None] if bool(allowed.any()) else None


def _repeat(x: torch.Tensor, groups: int) -> torch.Tensor:
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def _fold(x: torch.Tensor, groups: int) -> torch.Tensor:
    """The gradient of `_repeat`: sum the query heads that shared a key / value head."""
    if groups == 1:
        return x
    b, h, s, d = x.shape
    return x.view(b, h // groups, groups, s, d).sum(dim=2)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx_, q, k, v, ring: RingContext, scale: float):
        groups = q.size(1) // k.size(1)
        out = torch.zeros_like(q, dtype=torch.float32)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)
        block_k, block_v = k, v
        for step in range(ring.size):
            source = (ring.rank - step) % ring.size  # the rank whose keys / values are here now
            if step:
                block_k, block_v = _exchange(ring, [block_k, block_v])
            allowed = _allowed(ring, ring.rank, source)
            if allowed is None:
                continue
            scores = (q.float() @ _repeat(block_k, groups).float().transpose(-1, -2)) * scale
            scores = scores.masked_fill(~allowed, float("-inf"))
            block_lse = torch.logsumexp(scores, dim=-1)
            seen = torch.isfinite(block_lse)  # queries with at least one visible key in this block
            probs = torch.exp(scores - torch.where(seen, block_lse, 0.0)[..., None])
            block_out = probs @ _repeat(block_v, groups).float()
            new_lse = torch.logaddexp(lse, block_lse)
            safe = torch.where(torch.isfinite(new_lse), new_lse, 0.0)
            out = out * torch.exp(lse - safe)[..., None] + block_out * torch.exp(block_lse - safe)[..., None]
            lse = new_lse
        ctx_.save_for_backward(q, k, v, out, lse)
        ctx_.ring, ctx_.scale = ring, scale
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx_, grad_out):
        q, k, v, out, lse = ctx_.saved_tensors
        ring, scale, groups = ctx_.ring, ctx_.scale, q.size(1) // k.size(1)
        grad_out = grad_out.float()
        delta = (grad_out * out).sum(dim=-1, keepdim=True)  # (B, H, Sq, 1)
        safe_lse = torch.where(torch.isfinite(lse), lse, 0.0)[..., None]
        grad_q = torch.zeros_like(q, dtype=torch.float32)
        block_k, block_v = k, v
        grad_k, grad_v = torch.zeros_like(k, dtype=torch.float32), torch.zeros_like(v, dtype=torch.float32)
        for step in range(ring.size):
            source = (ring.rank - step) % ring.size
            if step:  # the block moves on with the gradients its keys / values have gathered so far
                block_k, block_v, grad_k, grad_v = _exchange(ring, [block_k, block_v, grad_k, grad_v])
            allowed = _allowed(ring, ring.rank, source)
            if allowed is None:
                continue
            k_full, v_full = _repeat(block_k, groups).float(), _repeat(block_v, groups).float()
            scores = (q.float() @ k_full.transpose(-1, -2)) * scale
            probs = torch.exp(scores.masked_fill(~allowed, float("-inf")) - safe_lse)
            grad_v = grad_v + _fold(probs.transpose(-1, -2) @ grad_out, groups)
            grad_scores = probs * (grad_out @ v_full.transpose(-1, -2) - delta)
            grad_q = grad_q + grad_scores @ k_full * scale
            grad_k = grad_k + _fold(grad_scores.transpose(-1, -2) @ q.float() * scale, groups)
        if ring.size > 1:  # one more hop: each block's gradients reach the rank that owns it
            grad_k, grad_v = _exchange(ring, [grad_k, grad_v])
        return grad_q.to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype), None, None


def ring_attention(q, k, v, ring: RingContext, scale: float | None = None) -> torch.Tensor:
    """(B, H, S, D) attention output of this rank's queries over the whole row. q: (B, H, S, D), k / v:
    (B, Hkv, S, D) of this rank's block (H a multiple of Hkv)."""
    return _RingAttention.apply(q, k, v, ring, q.size(-1) ** -0.5 if scale is None else scale)


def ring_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function contract: (B, S, H, D) output and no attention weights."""
    ring = kwargs.get("ring")
    if ring is None:
        raise ValueError("attn_implementation='ring' needs the forward's `ring=RingContext(...)` keyword")
    if dropout:
        raise ValueError("ring attention has no attention dropout")
    return ring_attention(query, key, value, ring, scaling).transpose(1, 2).contiguous(), None


class _SumOverRing(torch.autograd.Function):
    """Every rank's partial (B, T) tensor summed over the ring. Backward is the identity: every rank then
    computes the same loss from the same sum, so the gradient of its own partial is the loss's gradient, and
    the ring's parameter gradients add up to the single-process gradient."""

    @staticmethod
    def forward(ctx_, partial, group):
        total = partial.clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx_, grad):
        return grad, None


def sum_over_ring(partial: torch.Tensor, group=None) -> torch.Tensor:
    """Every rank's partial tensor summed over the ring, with the gradient of each rank's own share (_SumOverRing)."""
    return _SumOverRing.apply(partial, group)


@dataclass(frozen=True)
class RingMember:
    """This rank's ring: its index in it, the ring's global ranks, the ring's process group."""

    rank: int
    ranks: list[int]
    group: dist.ProcessGroup | None = None


def join_rings(rank: int, world: int, size: int) -> RingMember:
    """Cut `world` data-parallel ranks into rings of `size` consecutive ranks and return this rank's. Every
    rank must call it (creating a process group is collective over the whole world)."""
    if size < 1 or world % size:
        raise ValueError(f"--ring_attn_size {size} must divide the {world} policy ranks")
    mine = None
    for start in range(0, world, size):
        ranks = list(range(start, start + size))
        group = dist.new_group(ranks)
        if rank in ranks:
            mine = RingMember(rank - start, ranks, group)
    return mine


def ring_response_log_probs(
    model, sequences: torch.Tensor, attention_mask: torch.Tensor, num_actions: int, rank: int, ranks: list[int],
    group=None, temperature: float = 1.0, with_entropy: bool = False, sampling_filter: SamplingFilter | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """(B, T) log-probs (and entropy, if asked) of the last `num_actions` tokens of a padded batch, computed
    by a ring: every rank of `ranks` packs the whole batch (models/packing.py), keeps its block of columns,
    runs `model` (loaded with attn_implementation="ring") on it and scores the response tokens its columns
    predict; the sum over the ring gives every rank the whole (B, T). Padding holds 0, as in the packed
    path."""
    packed = pack(sequences, attention_mask)
    before, real = predicting_positions(packed, num_actions)
    width = packed.input_ids.size(1)
    ids, positions = pad_to_ring(packed.input_ids, packed.position_ids, len(ranks))
    ring = RingContext(sequence_ids(positions), ring_block(width, len(ranks)), rank, ranks, group)
    cols = ring.columns(rank)
    logits = model(input_ids=ids[:, cols], position_ids=positions[:, cols], use_cache=False, ring=ring).logits
    in_block, local = block_places(before, width, ring.block, cols.start)
    mine = real & in_block
    step_logits = logits.reshape(-1, logits.size(-1))[local[mine]]
    targets, positions = sequences[:, -num_actions:][mine], mine.nonzero(as_tuple=True)[1]
    log_probs, entropy = token_log_probs(step_logits, targets, temperature, with_entropy, sampling_filter, positions)

    def whole(values):
        return sum_over_ring(scatter_real(mine, values), group)

    return whole(log_probs), (whole(entropy) if with_entropy else None)


def _no_mask(*args, **kwargs):
    return None  # the ring builds its mask per block from RingContext.segments


def register() -> None:
    """Make attn_implementation="ring" known to transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, ring_attention_forward)
    AttentionMaskInterface.register(NAME, _no_mask)
