"""The agent file of `--agent_func_path`, OpenRLHF's contract.

The file defines a class `AgentInstance`; one instance is created per episode (no arguments) and must
have two coroutines:

    async def reset(self, states) -> {"observation": str}            # or "observation_tokens": [int]
        states: {"prompt": the dataset prompt, "label": its label}
    async def step(self, states) -> {
        "rewards": float, "scores": float (optional, defaults to rewards),
        "environment_feedback": str,                                  # or "environment_feedback_tokens": [int]
        "done": bool, "sampling_params": dict | None (optional, for the next turn),
        "extra_logs": {name: float} (optional)}
        states: {"observation_text": the episode's text so far, "action_text": the model's reply this turn,
                 "label": the label, "turn": 0-based turn index, "sampling_params": the current ones}

For history / target dialogues (docs/agents.md) it may also define

    async def process_history(self, states) -> {"op_log": [...], "memory": str}   # states: {"content", "turn_id"}
    def build_prompt(self, states) -> str     # states: {"content", "turn_id", "memory": [str, ...]}

An `AgentExecutor` class, if the file has one (OpenRLHF files do), is ignored: the rollout loop is ours.
A file without `AgentInstance` may instead hold an agent written to the OpenAI SDK (agents/agent_file.py).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path

from reinforce_pro.userfile import import_user_file


class AgentFileError(ValueError):
    """An unusable agent file; the message names the file and the problem."""


@dataclass
class StepOutput:
    reward: float
    score: float
    feedback_text: str | None  # exactly one of feedback_text / feedback_tokens is set
    feedback_tokens: list[int] | None
    done: bool
    sampling_params: dict | None = None
    extra_logs: dict[str, float] = field(default_factory=dict)


def load_agent_class(path: str | Path) -> type:
    module = import_user_file(path, "--agent_func_path", AgentFileError, "class AgentInstance")
    cls = getattr(module, "AgentInstance", None)
    if not inspect.isclass(cls):
        raise AgentFileError(f"--agent_func_path {path}: defines no class AgentInstance")
    return checked_instance_class(cls, path)


def checked_instance_class(cls: type, path) -> type:
    for name in ("reset", "step"):
        if not inspect.iscoroutinefunction(getattr(cls, name, None)):
            raise AgentFileError(f"--agent_func_path {path}: AgentInstance.{name} must be an async method")
    return cls


def _number(value, what: str) -> float:
    try:
        return float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError):
        raise AgentFileError(f"AgentInstance.step returned a non-numeric {what}: {value!r}") from None


def normalize_step(result) -> StepOutput:
    """Check and normalise what AgentInstance.step returned."""
    if not isinstance(result, dict) or "done" not in result or "rewards" not in result:
        raise AgentFileError(f"AgentInstance.step must return a dict with 'rewards' and 'done', got {result!r}")
    text, tokens = result.get("environment_feedback"), result.get("environment_feedback_tokens")
    if text is not None and tokens is not None:
        raise AgentFileError("AgentInstance.step returned both environment_feedback and environment_feedback_tokens")
    reward = _number(result["rewards"], "reward")
    score = _number(result["scores"], "score") if result.get("scores") is not None else reward
    extra = {k: _number(v, f"extra_logs[{k!r}]") for k, v in (result.get("extra_logs") or {}).items()}
    return StepOutput(
        reward, score, text if text is not None else (None if tokens is not None else ""),
        list(tokens) if tokens is not None else None, bool(result["done"]), result.get("sampling_params"), extra,
    )  # fmt: skip
