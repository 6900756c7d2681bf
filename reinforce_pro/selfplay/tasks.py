"""A self-play task is one object: the proposer prompt, the question parser/validator, the solver prompt and
the scorer. The controller (controller.py) knows nothing about any particular task.

Built-in tasks are in BUILTIN_TASKS (`--selfplay_task NAME`); `--selfplay_task_path file.py` loads a user's
file, which must define `TASK`, an object with the methods of `SelfPlayTask` (subclassing it is easiest).
See docs/selfplay.md, "Writing a task".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

# A learnability threshold: a question is learnable when at least one response is right and at least one wrong,
# for any rollout_n <= 8 (score >= 0.5 for a share of the responses within [0.125, 0.875]).
SOME_BUT_NOT_ALL = (0.5, 0.125, 0.875)


@dataclass(frozen=True)
class Question:
    text: str  # the question as the solver prompt shows it
    answer: str  # the reference answer rule-based scorers compare with
    meta: dict = field(default_factory=dict)  # anything else the task wants back when scoring


@dataclass(frozen=True)
class ParsedQuestion:
    """What `parse_question` returns: a question, or None and why the proposal is invalid."""

    question: Question | None
    reason: str = ""

    @property
    def valid(self) -> bool:
        return self.question is not None


@dataclass
class ScoredResponses:
    """The scores of one question's solver responses."""

    scores: dict[str, list[float]]  # dimension -> one score per response, in [0, 1]
    format: list[float]  # one format reward per response, in [0, 1]


# The judge an `llm` scorer asks: prompts -> the judge model's completions (greedy). Built by run/sources.py
# from a rollout engine; None when the run has none.
Judge = Callable[[list[str]], list[str]]


def role_sampling(run: dict, overrides: dict | None) -> dict:
    """The run's sampling parameters with a role's overrides (SelfPlayTask.sampling) on top; the run's
    max_tokens (--max_new_tokens) stays the ceiling, so a response always fits --max_len."""
    overrides = overrides or {}
    limit = min(run["max_tokens"], overrides.get("max_tokens", run["max_tokens"]))
    return {**run, **overrides, "max_tokens": limit}


class SelfPlayTask:
    """Base class of tasks. Subclasses set `name`, `thresholds`, `weights` and implement the methods."""

    name: str = "task"
    # dimension -> (threshold, min_ratio, max_ratio): learnable when, for every dimension, the fraction of
    # responses scoring >= threshold lies within [min_ratio, max_ratio]
    thresholds: dict[str, tuple[float, float, float]] = {}
    # dimension -> weight in the solver reward; --safety_reward_weight / --task_completion_weight override
    # the weights of dimensions named "safety" / "completion"
    weights: dict[str, float] = {}
    format_penalty: float = -1.0  # proposer reward of an invalid question (--proposer_train_scope group)
    runs_code: bool = False  # parse_question executes model-written code (in the sandbox): checked at start-up
    # role ("proposer" | "solver") -> vLLM sampling parameters that override the run's for that role's
    # samples (and the ladder's, for "solver"): a long program and a one-line answer need different budgets
    sampling: dict[str, dict] = {}
    solver_turns: int = 1  # model turns of a solver episode, for a task with a solver_agent
    tiny_model_positions: int | None = None  # positions of the embedded default's model (None: its default)

    def seed_records(self, n: int, seed: int) -> list[dict]:
        """Seed records for runs without --prompt_data (the embedded default)."""
        raise NotImplementedError(f"task {self.name} has no built-in seeds: give --prompt_data")

    def proposer_prompt(self, record: dict) -> str:
        """The prompt that asks for a new question, given a seed record (a --prompt_data row)."""
        raise NotImplementedError

    def parse_question(self, text: str) -> ParsedQuestion:
        """Parse and validate a proposer response."""
        raise NotImplementedError

    def solver_prompt(self, question: Question) -> str:
        raise NotImplementedError

    def score(self, question: Question, responses: list[str], judge: Judge | None = None) -> ScoredResponses:
        """Scores on every dimension of `thresholds`, and the format reward, for each response."""
        raise NotImplementedError

    def solver_agent(self) -> type | None:
        """An AgentInstance class (agents/contract.py) when the solver answers in multi-turn episodes of up to
        `solver_turns` turns against an environment (the search task); None: one completion per question.
        `score` then gets each episode's last model turn."""
        return None

    def close(self) -> None:
        """Release what the task started (a service); called when the run ends."""

    def difficulty(self, question: Question) -> dict[str, float]:
        """Named measures of how hard a valid question is (for arithmetic: operand digits, terms), logged for
        proposed and for learnable questions as curriculum metrics; {} when the task has none."""
        return {}

    def warm_start_examples(self, n: int, seed: int) -> list[dict]:
        """{"prompt", "label"} pairs for the embedded default's supervised warm start of both roles."""
        return []

    def warm_start_sequences(self, tokenizer, n: int, seed: int) -> list[tuple[list[int], list[bool]]]:
        """(token ids, trained mask) demonstrations for the embedded default's warm start, for tasks whose
        solver answers in episodes (environment turns untrained); used instead of warm_start_examples when
        not empty."""
        return []

    def reference_record(self, question: Question) -> dict:
        """A seed record (what proposer_prompt takes) that shows `question` as the reference to propose from
        (--selfplay_reference_buffer)."""
        raise NotImplementedError(f"task {self.name} cannot propose from reference questions")

    def ladder(self) -> dict[str, list[Question]]:
        """A fixed held-out set of questions per difficulty level, the same in every run: the solver's greedy
        accuracy on each is logged every --eval_steps (eval/ladder/*). {} when the task has none."""
        return {}
