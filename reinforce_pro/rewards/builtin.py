"""Built-in verifiers, written against the same reward_func contract as user files."""

from __future__ import annotations

from collections.abc import Callable

import torch


def exact_match(response: str, label: str) -> float:
    """1.0 when the response, stripped, equals the label, else 0.0."""
    return float(response.strip() == str(label).strip())


def response_reward(score: Callable[[str, str], float]) -> Callable[..., dict]:
    """The reward_func(queries, prompts, labels) that gives each response (its query minus its prompt; a query
    without its prompt is scored whole) score(response, label)."""

    def reward_func(queries: list[str], prompts: list[str], labels: list) -> dict:
        rewards = []
        for query, prompt, label in zip(queries, prompts, labels, strict=True):
            response = query[len(prompt) :] if query.startswith(prompt) else query
            rewards.append(score(response, str(label)))
        r = torch.tensor(rewards)
        return {"rewards": r, "scores": r, "extra_logs": {}}

    return reward_func


exact_match_reward = response_reward(exact_match)  # 1.0 when the response, stripped, equals the label
