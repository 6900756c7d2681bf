"""--dynamic_filtering (DAPO's dynamic sampling, Yu et al. 2025): keep only prompt groups whose mean score
lies strictly inside --dynamic_filtering_reward_range, and top the batch up with new prompts from the
stream until it holds --rollout_batch_size groups. A group every sample of which scored the same gives a
group-relative estimator zero advantage: it costs a training pass and teaches nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from reinforce_pro.experience import Samples, concat_samples
from reinforce_pro.rewards.loader import RewardOutput

MAX_ROUNDS = 16  # generation rounds per step before training on what was kept


def group_pass_mask(scores: torch.Tensor, group_size: int, low: float, high: float) -> torch.Tensor:
    """(G,) bool: groups of `group_size` consecutive scores whose mean lies strictly within (low, high)."""
    means = scores.view(-1, group_size).mean(dim=1)
    return (means > low) & (means < high)


def generate_filtered(
    generate: Callable[[list[dict]], Samples], rewards: Callable[[Samples], RewardOutput],
    first: list[tuple[int, dict]], take: Callable[[int], list[tuple[int, dict]]], batch_size: int,
    reward_range: tuple[float, float],
) -> tuple[Samples | None, list[int], dict[str, float]]:  # fmt: skip
    """Generate (a rollout source's `generate`), score (`rewards`: ExperienceBuilder.rewards) and filter the
    source's groups (samples.group_size rows of each prompt) until `batch_size` pass (or the stream or MAX_ROUNDS
    run out).

    Returns the kept samples (None when no group passed), the dataset indices of every prompt consumed,
    and `dynamic_filtering/*` metrics. Agent episodes with extra segments (samples.fork_of, agents/trajectory.py):
    groups are judged on their lead rows; a kept episode keeps its forks, which stay last in the batch."""
    kept: list[Samples] = []
    forks: list[tuple[Samples, list[int]]] = []  # the kept forks of a round, and their leads' rows in `kept`
    consumed: list[int] = []
    num_kept = tried = rounds = 0
    pending = first
    while pending and rounds < MAX_ROUNDS:
        rounds += 1
        consumed += [i for i, _ in pending]
        samples = generate([record for _, record in pending])
        samples.rewards = rewards(samples)
        fork_of, n = samples.fork_of or [], samples.group_size
        leads = len(samples.rewards.scores) - len(fork_of)
        passed = group_pass_mask(samples.rewards.scores[:leads], n, *reward_range)
        tried += len(pending)
        groups = passed.nonzero().flatten()[: batch_size - num_kept]
        if len(groups):
            rows = (groups.unsqueeze(1) * n + torch.arange(n)).flatten()
            at = {int(r): num_kept * n + k for k, r in enumerate(rows)}  # a lead's row in the kept batch
            extra = [k for k, lead in enumerate(fork_of) if lead in at]
            if extra:
                forks.append((samples.select(torch.tensor(extra) + leads), [at[fork_of[k]] for k in extra]))
            kept.append(samples.select(rows))
            num_kept += len(groups)
        missing = batch_size - num_kept
        pending = take(missing) if missing > 0 else []
    metrics = {
        "dynamic_filtering/pass_rate": num_kept / max(1, tried),
        "dynamic_filtering/prompts_tried": float(tried),
        "dynamic_filtering/groups_kept": float(num_kept),
        "dynamic_filtering/rounds": float(rounds),
    }
    if not kept:
        return None, consumed, metrics
    out = concat_samples(kept + [part for part, _ in forks])
    out.fork_of = [lead for _, leads_of in forks for lead in leads_of] or None
    return out, consumed, metrics
