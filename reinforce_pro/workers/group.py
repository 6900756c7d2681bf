"""The data-parallel ranks of one role (policy, reference, critic) and the one pattern every caller needs:
split a batch's rows over the ranks, call a method on each rank with its shard, gather the results."""

from __future__ import annotations

from collections.abc import Callable

import torch


class ActorGroup(list):
    """A list of Ray actor handles, rank order. Stays a list so that `for rank in group` and `group[0]` (the
    rank that writes files for the group) read as before. Metrics come from every rank (algos/stats.py).

    `ring` (--ring_attn_size): consecutive ranks form rings that split each row of one shard along the
    sequence (models/ring_attention.py), so the group has len / ring data-parallel shards, every rank of a
    ring gets its ring's shard, and each ring answers once (`speakers`)."""

    def __init__(self, actors=(), ring: int = 1):
        super().__init__(actors)
        self.ring = ring

    @classmethod
    def of(cls, group) -> ActorGroup:
        """`group` itself when it is an ActorGroup (its rings kept), else a ring-free group of its actors."""
        return group if isinstance(group, ActorGroup) else cls(group)

    @property
    def data_parallel(self) -> int:
        return len(self) // self.ring

    def shards(self, rows: int) -> list[torch.Tensor]:
        """Row indices of each rank: consecutive, sizes differing by at most one (rank 0 gets the most); the
        ranks of one ring get the same shard."""
        parts = torch.tensor_split(torch.arange(rows), self.data_parallel)
        return [part for part in parts for _ in range(self.ring)]

    def speakers(self, results: list) -> list:
        """One result per data-parallel shard: the first rank of each ring (the others computed the same)."""
        return results[:: self.ring]

    def call_sharded(self, method: str, rows: int, args_of: Callable[[torch.Tensor], tuple]) -> list:
        """`method.remote(*args_of(indices))` on every rank with its shard of `rows` rows: the ObjectRefs,
        rank order (ray.get them together so the ranks run at once)."""
        shards = self.shards(rows)
        return [getattr(actor, method).remote(*args_of(idx)) for actor, idx in zip(self, shards, strict=True)]
