"""Prompt datasets and the built-in tasks.

`EMBEDDED_TASKS` (`--builtin_task`): the tasks the embedded default can train on with no data of its own, each
its prompts, its warm-start examples and its verifier (a reward_func with the user files' contract).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class EmbeddedTask:
    records: Callable[[int, int], list[dict]]  # (n, seed) -> [{"input", "label"}] training prompts
    warm_start: Callable[[int, int], list[dict]]  # (n, seed) -> [{"prompt", "label"}]: the SFT target is "label"
    score: Callable[[str, str], float]  # (response, label) -> reward


def _arithmetic() -> EmbeddedTask:
    from reinforce_pro.data.arithmetic import arithmetic_records

    def warm(n, seed):
        return [{"prompt": r["input"], "label": r["label"]} for r in arithmetic_records(n, seed)]

    return EmbeddedTask(arithmetic_records, warm, lambda response, label: float(response.strip() == str(label).strip()))


def _scratchpad() -> EmbeddedTask:
    from reinforce_pro.data import scratchpad

    def warm(n, seed):
        return [{"prompt": r["input"], "label": r["solution"]} for r in scratchpad.records(n, seed)]

    return EmbeddedTask(scratchpad.records, warm, scratchpad.reward)


EMBEDDED_TASKS: dict[str, Callable[[], EmbeddedTask]] = {"arithmetic": _arithmetic, "scratchpad": _scratchpad}


def embedded_reward(task: str):
    """The reward_func(queries, prompts, labels) of an embedded task: its score of each response (the query
    minus its prompt)."""
    score = EMBEDDED_TASKS[task]().score

    def reward_func(queries: list[str], prompts: list[str], labels: list) -> dict:
        rewards = []
        for query, prompt, label in zip(queries, prompts, labels, strict=True):
            rewards.append(score(query[len(prompt) :] if query.startswith(prompt) else query, str(label)))
        r = torch.tensor(rewards)
        return {"rewards": r, "scores": r, "extra_logs": {}}

    return reward_func
