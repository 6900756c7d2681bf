"""The built-in self-play tasks.

- `arithmetic`: sized for the tiny CPU model, open-ended. The proposer turns a seed "[a+b]>" into an integer
  expression of its choosing ("37-8*4", "120+905"); the solver answers "37-8*4=" with its value. The warm
  start teaches the solver the format on small numbers and the proposer the grammar on small operands: how
  hard to go (digits, terms, operations) is what the proposer learns, and a fixed held-out ladder of levels
  measures how far the solver follows.
- `search` (selfplay/search_task.py): questions about a knowledge base, answered by searching it in multi-turn
  episodes against a retrieval service; no question is written by a person.
- `code_output` (selfplay/code_task.py): Absolute Zero's deduction task. The proposer writes a small Python
  function `f` and an input; the sandbox runs it to get the output; the solver predicts the output. Meant for
  real models: the tiny character-level model does not write Python.
"""

from __future__ import annotations

import random
import re

from reinforce_pro.selfplay.code_task import CodeOutputTask
from reinforce_pro.selfplay.search_task import SearchTask
from reinforce_pro.selfplay.tasks import (
    SOME_BUT_NOT_ALL,
    Judge,
    ParsedQuestion,
    Question,
    ScoredResponses,
    SelfPlayTask,
)
from reinforce_pro.userfile import import_user_file


class ArithmeticTask(SelfPlayTask):
    """Integer expressions the proposer writes freely: 2 to `max_terms` operands of up to `max_digits` digits
    joined by +, - and * (usual precedence), e.g. `37-8*4+120`. The proposer sets the difficulty (digits,
    terms, operations); the only bound is the answer's length, which the solver must be able to write."""

    name = "arithmetic"
    thresholds = {"completion": SOME_BUT_NOT_ALL}
    weights = {"completion": 1.0}
    max_digits = 4
    max_terms = 4
    max_answer_chars = 8  # '-' included: the solver writes the answer within the embedded default's budget
    warm_start_max_proposed = 29  # operands of the references the proposer's warm start shows (half of them)
    # the ladder's levels the warm start covers; the others are beyond it (docs/selfplay.md)
    warm_start_levels = ("add_0-19", "sub_0-9", "mul_0-9", "sum3_0-9")

    _OPERAND = rf"(?:0|[1-9]\d{{0,{max_digits - 1}}})"
    _QUESTION = re.compile(rf"{_OPERAND}(?:[-+*]{_OPERAND}){{1,{max_terms - 1}}}")

    def seed_records(self, n: int, seed: int) -> list[dict]:
        from reinforce_pro.data.arithmetic import arithmetic_records

        return arithmetic_records(n, seed=seed)

    def proposer_prompt(self, record: dict) -> str:
        return f"[{record['input'].rstrip('=')}]>"

    def parse_question(self, text: str) -> ParsedQuestion:
        text = text.strip()
        if self._QUESTION.fullmatch(text) is None:
            return ParsedQuestion(
                None,
                f"not 2-{self.max_terms} operands of at most {self.max_digits} digits (no leading zeros) "
                "joined by +, - or *",
            )
        answer = str(evaluate_expression(text))
        if len(answer) > self.max_answer_chars:
            return ParsedQuestion(None, f"the answer {answer[:12]} is longer than {self.max_answer_chars} characters")
        return ParsedQuestion(Question(text, answer))

    def solver_prompt(self, question: Question) -> str:
        return question.text + "="

    def reference_record(self, question: Question) -> dict:
        return {"input": question.text + "="}

    def difficulty(self, question: Question) -> dict[str, float]:
        operands = re.split(r"[-+*]", question.text)
        return {
            "digits": float(max(len(x) for x in operands)),
            "terms": float(len(operands)),
            "answer_digits": float(len(question.answer.lstrip("-"))),
            "sub": float("-" in question.text),
            "mul": float("*" in question.text),
        }

    def score(self, question: Question, responses: list[str], judge: Judge | None = None) -> ScoredResponses:
        answers = [r.strip() for r in responses]
        return ScoredResponses(
            scores={"completion": [float(a == question.answer) for a in answers]},
            format=[float(_INTEGER.fullmatch(a) is not None) for a in answers],
        )

    def warm_start_examples(self, n: int, seed: int) -> list[dict]:
        """n solver examples and n proposer examples. The solver learns the format on the warm-start levels
        (mostly additions <= 19; a tenth each of one-digit differences, one-digit products and sums of three
        one-digit numbers). The proposer learns to write a variant of the question in its prompt (operands
        moved by -3..+7, sometimes a term added or an operation changed), on small references: the prompt is
        a seed or, with --selfplay_reference_buffer, a recent learnable question, so what the proposer
        writes follows the curriculum; which variants are worth proposing is left to RL."""
        rng = random.Random(seed)
        out = []
        for i in range(n):
            text = LADDER_LEVELS[WARM_START_MIX[i % len(WARM_START_MIX)]](rng)
            out.append({"prompt": f"{text}=", "label": str(evaluate_expression(text))})
            reference = _join(rng, "+", [(0, self.warm_start_max_proposed)] * 2) if i % 2 else text
            out.append({"prompt": f"[{reference}]>", "label": propose_variant(reference, rng)})
        return out

    def ladder(self) -> dict[str, list[Question]]:
        """A fixed held-out set per difficulty level (LADDER_LEVELS), the same in every run."""
        rng = random.Random(LADDER_SEED)
        levels = {}
        for name, draw in LADDER_LEVELS.items():
            texts = [draw(rng) for _ in range(LADDER_QUESTIONS)]
            levels[name] = [Question(t, str(evaluate_expression(t))) for t in texts]
        return levels


_INTEGER = re.compile(r"-?(?:0|[1-9]\d*)")


def evaluate_expression(text: str) -> int:
    """The value of `text`, integers joined by + - * with the usual precedence (products first)."""
    total = 0
    for sign, product in re.findall(r"([-+]?)([^-+]+)", text):
        value = 1
        for factor in product.split("*"):
            value *= int(factor)
        total += -value if sign == "-" else value
    return total


def propose_variant(text: str, rng: random.Random) -> str:
    """A question near `text` (the proposer's warm-start target): each operand moved by -3..+7 with
    probability 0.6, a one-digit term added (up to 3 terms) or one operation changed with probability 0.15
    each; never `text` itself."""
    operands, ops = [int(x) for x in re.split(r"[-+*]", text)], re.findall(r"[-+*]", text)
    while True:
        new = [max(0, v + rng.randint(-3, 7)) if rng.random() < 0.6 else v for v in operands]
        new_ops = list(ops)
        if rng.random() < 0.15 and len(new) < 3:
            new, new_ops = [*new, rng.randint(0, 9)], [*new_ops, rng.choice("+-*")]
        if rng.random() < 0.15:
            new_ops[rng.randrange(len(new_ops))] = rng.choice("+-*")
        variant = str(new[0]) + "".join(op + str(v) for op, v in zip(new_ops, new[1:], strict=True))
        if variant != text:
            return variant


def _join(rng: random.Random, op: str, ranges: list[tuple[int, int]], descending: bool = False) -> str:
    values = [rng.randint(lo, hi) for lo, hi in ranges]
    if descending:
        values.sort(reverse=True)
    return op.join(map(str, values))


# What the solver's warm start teaches: 7 in 10 additions <= 19, one each of the other warm-start levels
WARM_START_MIX = ("add_0-19",) * 7 + ("sub_0-9", "mul_0-9", "sum3_0-9")

# The held-out ladder: the solver's greedy accuracy on each level, evaluated every --eval_steps.
LADDER_SEED = 20261125
LADDER_QUESTIONS = 40
LADDER_LEVELS = {  # name: operation_operand range; the warm start covers the first of each operation
    "add_0-19": lambda r: _join(r, "+", [(0, 19)] * 2),
    "add_20-29": lambda r: _join(r, "+", [(20, 29)] * 2),
    "add_30-49": lambda r: _join(r, "+", [(30, 49)] * 2),
    "add_50-99": lambda r: _join(r, "+", [(50, 99)] * 2),
    "add_100-999": lambda r: _join(r, "+", [(100, 999)] * 2),
    "sub_0-9": lambda r: _join(r, "-", [(0, 9)] * 2, descending=True),
    "sub_10-29": lambda r: _join(r, "-", [(10, 29)] * 2, descending=True),
    "sub_30-99": lambda r: _join(r, "-", [(30, 99)] * 2, descending=True),
    "mul_0-9": lambda r: _join(r, "*", [(0, 9)] * 2),
    "mul_10-19x2-9": lambda r: _join(r, "*", [(10, 19), (2, 9)]),
    "sum3_0-9": lambda r: _join(r, "+", [(0, 9)] * 3),
    "sum3_10-19": lambda r: _join(r, "+", [(10, 19)] * 3),
    # The first rungs past the warm start, where the proposer's variants of small seeds lead (an operand of
    # 20-29 beside a smaller one). Listed last so that the levels above keep the questions of earlier runs.
    "add_20-29+0-9": lambda r: _join(r, "+", [(20, 29), (0, 9)]),
    "add_20-29+10-19": lambda r: _join(r, "+", [(20, 29), (10, 19)]),
}


BUILTIN_TASKS: dict[str, type[SelfPlayTask]] = {
    "arithmetic": ArithmeticTask, "search": SearchTask, "code_output": CodeOutputTask,
}  # fmt: skip


# What a task's per-role sampling may override: where a response ends, never which tokens it is drawn from.
# The trainer replays the run's temperature and filters on every row (models/sampling_filter.py), so a role
# sampled with its own top-p or penalty would be scored under a distribution it was not drawn from.
ROLE_SAMPLING_KEYS = frozenset({"max_tokens", "stop", "skip_special_tokens", "include_stop_str_in_output"})


def load_task(
    name: str | None, path: str | None, kb: str | None = None, retriever_url: str | None = None
) -> SelfPlayTask:
    """The task of `--selfplay_task_path` if given, else the built-in `--selfplay_task`; `kb` and `retriever_url`
    (--selfplay_kb, --selfplay_retriever_url) configure the search task and no other."""
    if (kb or retriever_url) and (path is not None or name != "search"):
        flag = "--selfplay_kb" if kb else "--selfplay_retriever_url"
        raise ValueError(f"{flag} configures --selfplay_task search, not {path or name}")
    if path is None:
        if name not in BUILTIN_TASKS:
            raise ValueError(f"unknown --selfplay_task {name!r}; built-in tasks: {', '.join(BUILTIN_TASKS)}")
        if name == "search":
            return SearchTask(kb, retriever_url)
        return BUILTIN_TASKS[name]()
    module = import_user_file(path, "--selfplay_task_path", ValueError, "TASK")
    task = getattr(module, "TASK", None)
    missing = [m for m in ("proposer_prompt", "parse_question", "solver_prompt", "score") if not hasattr(task, m)]
    if task is None or missing:
        raise ValueError(f"--selfplay_task_path {path}: define TASK, a SelfPlayTask (missing: {missing or 'TASK'})")
    if not task.thresholds or set(task.weights) != set(task.thresholds):
        raise ValueError(f"--selfplay_task_path {path}: TASK.thresholds and TASK.weights must name the same dimensions")
    for role, overrides in (getattr(task, "sampling", None) or {}).items():
        reshaping = sorted(set(overrides) - ROLE_SAMPLING_KEYS)
        if reshaping:
            raise ValueError(
                f"--selfplay_task_path {path}: TASK.sampling[{role!r}] sets {', '.join(reshaping)}, which would change "
                f"the distribution the trainer scores; a role may set only {', '.join(sorted(ROLE_SAMPLING_KEYS))} "
                "(the run's --temperature / --top_p / --top_k apply to every role)"
            )
    return task
