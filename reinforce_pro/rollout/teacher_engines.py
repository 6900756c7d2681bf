"""A distillation teacher served by vLLM engines that only prefill (`--teacher_backend engine`): each row of the
student's batch goes to one engine as a prompt whose own tokens are scored (VLLMEngine.score, vLLM's prompt
log-probs), and the log-probs come back in the (B, T) layout of the batch's response columns, as the actor
teacher's forward gives them (algos/distill.py)."""

from __future__ import annotations

import ray
import torch


class EngineTeacher:
    """`log_probs(sequences, attention_mask, num_actions)` over a list of VLLMEngine actors holding the teacher: the
    rows split into contiguous shards, one per engine, scored at once."""

    def __init__(self, engines: list):
        self.engines = engines

    def log_probs(self, sequences: torch.Tensor, attention_mask: torch.Tensor, num_actions: int) -> torch.Tensor:
        """(B, T) float32: the teacher's log-prob of every response token (the last T columns) that the attention
        mask keeps, 0 on the columns it does not (padding: no action there either); NaN where vLLM gave none."""
        rows = [row_request(sequences[b], attention_mask[b], num_actions) for b in range(sequences.size(0))]
        shards = _shards(len(rows), len(self.engines))
        futures = [
            engine.score.remote([rows[b][0] for b in shard], [rows[b][1] for b in shard])
            for engine, shard in zip(self.engines, shards, strict=True) if shard
        ]  # fmt: skip
        scored = [lp for shard_result in ray.get(futures) for lp in shard_result]
        out = torch.zeros(sequences.size(0), num_actions, dtype=torch.float32)
        for b, ((_, _, columns), values) in enumerate(zip(rows, scored, strict=True)):
            out[b, columns] = torch.tensor(values, dtype=torch.float32)
        return out


def row_request(sequence: torch.Tensor, attention: torch.Tensor, num_actions: int) -> tuple[list[int], int, list[int]]:
    """(ids, start, columns) of one row: the tokens its attention mask keeps, in order (what the trainer's forward
    sees), the index among them of the first response token, and the response column (0 .. T-1) of each kept
    token from there on."""
    kept = attention.bool().nonzero().flatten()
    first_response = sequence.size(0) - num_actions
    ids = sequence[kept].tolist()
    start = int((kept < first_response).sum())
    columns = (kept[start:] - first_response).tolist()
    return ids, start, columns


def _shards(n: int, parts: int) -> list[range]:
    """`n` rows in `parts` contiguous ranges whose sizes differ by at most one."""
    size, extra = divmod(n, parts)
    bounds = [0]
    for p in range(parts):
        bounds.append(bounds[-1] + size + (p < extra))
    return [range(bounds[p], bounds[p + 1]) for p in range(parts)]
