"""Built-in verifiers, written against the same reward_func contract as user files."""

from __future__ import annotations

import torch


def exact_match_reward(queries: list[str], prompts: list[str], labels: list) -> dict:
    """1.0 when the response (query minus prompt), stripped, equals the label; else 0.0."""
    rewards = []
    for query, prompt, label in zip(queries, prompts, labels, strict=True):
        response = query[len(prompt) :] if query.startswith(prompt) else query
        rewards.append(float(response.strip() == str(label).strip()))
    r = torch.tensor(rewards)
    return {"rewards": r, "scores": r, "extra_logs": {}}
