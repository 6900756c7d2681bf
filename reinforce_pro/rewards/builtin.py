"""Built-in verifiers, written against the same reward_func contract as user files."""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

MAX_RESPONSE_CHARS = 200  # a longer response is not an answer of the worked tasks (and is not parsed)
_MARKED_ANSWER = re.compile(r"#([0-9]+)\s*$")  # ASCII digits only: "²" or "٣" pass str.isdigit


def exact_match(response: str, label: str) -> float:
    """1.0 when the response, stripped, equals the label, else 0.0."""
    return float(response.strip() == str(label).strip())


def marked_answer(response: str) -> str | None:
    """The number a worked response states after its last "#", at its end (leading zeros dropped), or None: for a
    response that is empty, over-long, has no "#", or ends in anything but ASCII digits."""
    if not isinstance(response, str) or len(response) > MAX_RESPONSE_CHARS:
        return None
    match = _MARKED_ANSWER.search(response)
    return match.group(1).lstrip("0") or "0" if match else None


def marked_answer_match(response: str, label: str) -> float:
    """1.0 when the number after the response's last "#" equals the label, else 0.0: the worked tasks' reward,
    which reads the answer only, so the work before it is the model's own, not a format it is paid for."""
    answer = marked_answer(response)
    return float(answer is not None and answer == (str(label).strip().lstrip("0") or "0"))


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
