"""The data-parallel ranks of one role (policy, reference, critic) and the one pattern every caller needs:
split a batch's rows over the ranks, call a method on each rank with its shard, gather the results."""

from __future__ import annotations

from collections.abc import Callable

import torch


class ActorGroup(list):
    """A list of Ray actor handles, rank order. Stays a list so that `for rank in group` and `group[0]` (the
    rank that writes files for the group) read as before. Metrics come from every rank (algos/stats.py)."""

    def shards(self, rows: int) -> list[torch.Tensor]:
        """Row indices of each rank: consecutive, sizes differing by at most one (rank 0 gets the most)."""
        return list(torch.tensor_split(torch.arange(rows), len(self)))

    def call_sharded(self, method: str, rows: int, args_of: Callable[[torch.Tensor], tuple]) -> list:
        """`method.remote(*args_of(indices))` on every rank with its shard of `rows` rows: the ObjectRefs,
        rank order (ray.get them together so the ranks run at once)."""
        shards = self.shards(rows)
        return [getattr(actor, method).remote(*args_of(idx)) for actor, idx in zip(self, shards, strict=True)]
