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
    model_layers: int = 2  # layers of the built-in model it trains (models.tiny.build_tiny_model)
    warm_start_examples: int = 4096  # distinct examples its warm start draws from


def _arithmetic() -> EmbeddedTask:
    from reinforce_pro.data.arithmetic import arithmetic_records

    def warm(n, seed):
        return [{"prompt": r["input"], "label": r["label"]} for r in arithmetic_records(n, seed)]

    return EmbeddedTask(arithmetic_records, warm, exact_match)


def _worked(records: Callable[[int, int], list[dict]]) -> Callable[[int, int], list[dict]]:
    """The warm start of a worked task: its records with the whole worked response as the SFT target."""
    return lambda n, seed: [{"prompt": r["input"], "label": r["solution"]} for r in records(n, seed)]


def _scratchpad() -> EmbeddedTask:
    from reinforce_pro.data import scratchpad

    # Finding a column's digits by position takes more than the 2-layer model, which learned the first column
    # and rarely the second; 4 layers on fresh examples do better, but how much still depends on the seed
    # (docs/running.md). The running-sum task finds its digits by content and is the one the 2-layer model learns.
    return EmbeddedTask(
        scratchpad.records, _worked(scratchpad.records), scratchpad.reward, model_layers=4, warm_start_examples=65536
    )


def _running_sum() -> EmbeddedTask:
    from reinforce_pro.data import running_sum

    return EmbeddedTask(
        running_sum.records, _worked(running_sum.records), running_sum.reward, warm_start_examples=65536
    )


EMBEDDED_TASKS: dict[str, Callable[[], EmbeddedTask]] = {
    "arithmetic": _arithmetic,
    "scratchpad": _scratchpad,
    "running_sum": _running_sum,
}


def embedded_reward(task: str):
    """The reward_func(queries, prompts, labels) of an embedded task: its score of each response."""
    return response_reward(EMBEDDED_TASKS[task]().score)
