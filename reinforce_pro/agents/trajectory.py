"""Token-exact trajectories from an agent's calls to the OpenAI-compatible endpoint (agents/openai_endpoint.py).

Every call records the prompt ids the engine was given and the ids it sampled, with their log-probs. A call
whose prompt extends the previous call's full sequence (its prompt plus its completion) continues the same
segment: the ids between are the environment's (tool results, the chat template's turn markers), trained with
action_mask 0. A call whose prompt does not extend it starts a new segment instead: a chat template that drops
earlier `<think>` blocks (Qwen3), an agent that edits or summarises its history. The engine was given exactly
that rewritten prompt, so gluing it onto the old sequence would train tokens on a context they were not sampled
from. Each segment is one trained row; the rows of an episode share its reward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from reinforce_pro.agents.episode import Episode


@dataclass
class Call:
    """One chat or completion request as the engine served it."""

    prompt_ids: list[int]  # what the engine was given
    completion_ids: list[int]  # what it sampled
    log_probs: list[float]  # the engine's log-prob of each completion id
    finish_reason: str  # "stop" or "length"
    text: str = ""  # the completion decoded (for the episode's text)
    versions: list[int] | None = None  # --partial_rollout: the weight version that sampled each completion id
    routes: Any = None  # MoE engines: (prompt + completion - 1, L, K) int16 experts of the positions it fed
    top_log_probs: list | None = None  # a request's top_logprobs: each completion id's k likeliest (id, log-prob)

    @property
    def full(self) -> list[int]:
        return self.prompt_ids + self.completion_ids


@dataclass
class Trajectory:
    """The calls of one session, split into segments as they arrive."""

    segments: list[list[Call]] = field(default_factory=list)
    abandoned: int = 0  # completions sampled for a client that had disconnected: not recorded
    tool_calls: int = 0  # tool calls parsed out of its completions (agents/tools.py)
    tool_call_failures: int = 0  # completions that held a call that did not parse
    clamped: int = 0  # requests whose max_tokens was above the run's --max_new_tokens, sampled with the run's

    @property
    def calls(self) -> int:
        return sum(map(len, self.segments))

    @property
    def forks(self) -> int:
        """Segments started because a prompt did not extend the previous call's sequence."""
        return max(0, len(self.segments) - 1)

    def add(self, call: Call) -> None:
        if self.segments and extends(call.prompt_ids, self.segments[-1][-1].full):
            self.segments[-1].append(call)
        else:
            self.segments.append([call])

    def last_full(self) -> list[int]:
        """The ids of the whole conversation so far as the engine last saw and extended it."""
        return self.segments[-1][-1].full if self.segments else []


def extends(prompt_ids: list[int], previous: list[int]) -> bool:
    return len(prompt_ids) >= len(previous) and prompt_ids[: len(previous)] == previous


def segment_episode(segment: list[Call], index: int, group: int, prompt: str, label, prompt_text: str) -> Episode:
    """One segment as one Episode row: its first prompt, then per call the environment's ids (those the next
    prompt adds after the previous sequence) and the model's sampled ids with their log-probs."""
    first = segment[0]
    e = Episode(index, group, prompt, label, list(first.prompt_ids), text=prompt_text)
    spans = e.step_meta.setdefault("turn_spans", [])
    previous = first.prompt_ids
    for call in segment:
        between = call.prompt_ids[len(previous) :]
        if between:
            start = len(e.tokens)
            e.add_environment(list(between), "")
            spans.append([start, len(e.tokens), "environment"])
        start = len(e.tokens)
        e.add_model(list(call.completion_ids), list(call.log_probs), call.text, call.versions, call.routes)
        spans.append([start, len(e.tokens), "model"])
        previous = call.full
    e.truncated = segment[-1].finish_reason == "length"
    e.done = True
    return e
