"""Prompt datasets and the built-in tasks.

`EMBEDDED_TASKS` (`--builtin_task`): the tasks the embedded default can train on with no data of its own, each
its prompts, its warm-start examples and its verifier (a reward_func with the user files' contract).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from reinforce_pro.rewards.builtin import exact_match, response_reward


@dataclass(frozen=True)
class EmbeddedTask:
    records: Callable[[int, int], list[dict]]  # (n, seed) -> [{"input", "label"}] training prompts
    warm_start: Callable[[int, int], list[dict]]  # (n, seed) -> [{"prompt", "label"}]: the SFT target is "label"
    score: Callable[[str, str], float]  # (response, label) -> reward


def _arithmetic() -> EmbeddedTask:
    from reinforce_pro.data.arithmetic import arithmetic_records

    def warm(n, seed):
        return [{"prompt": r["input"], "label": r["label"]} for r in arithmetic_records(n, seed)]

    return EmbeddedTask(arithmetic_records, warm, exact_match)


def _scratchpad() -> EmbeddedTask:
    from reinforce_pro.data import scratchpad

    def warm(n, seed):
        return [{"prompt": r["input"], "label": r["solution"]} for r in scratchpad.records(n, seed)]

    return EmbeddedTask(scratchpad.records, warm, scratchpad.reward)


EMBEDDED_TASKS: dict[str, Callable[[], EmbeddedTask]] = {"arithmetic": _arithmetic, "scratchpad": _scratchpad}


def embedded_reward(task: str):
    """The reward_func(queries, prompts, labels) of an embedded task: its score of each response."""
    return response_reward(EMBEDDED_TASKS[task]().score)
