"""The built-in self-play tasks.

- `arithmetic`: sized for the tiny CPU model. The proposer turns a seed addition "[a+b]>" into a new one
  "c+d"; the solver answers "c+d=" with the sum. The warm start teaches proposals with operands up to 29
  while the solver only ever saw operands up to 19: many early questions are too hard (never solved) or
  too easy (always solved), so the proposer has something to learn.
- `code_output`: Absolute Zero's deduction task. The proposer writes a small Python function `f` and an
  input; the sandbox runs it (twice, for determinism) to get the output; the solver predicts the output.
  Meant for real models: the tiny character-level model does not write Python.
"""

from __future__ import annotations

import ast
import random
import re

from reinforce_pro.selfplay.sandbox import SandboxLimits, run_deterministic
from reinforce_pro.selfplay.tasks import Judge, ParsedQuestion, Question, ScoredResponses, SelfPlayTask
from reinforce_pro.userfile import import_user_file

# At least one response right and at least one wrong, for any rollout_n <= 8.
SOME_BUT_NOT_ALL = (0.5, 0.125, 0.875)


class ArithmeticTask(SelfPlayTask):
    name = "arithmetic"
    thresholds = {"completion": SOME_BUT_NOT_ALL}
    weights = {"completion": 1.0}
    max_operand = 99
    warm_start_max_proposed = 29  # operands the warm-started proposer suggests
    warm_start_max_solved = 19  # operands the warm-started solver was taught

    _QUESTION = re.compile(r"(\d{1,2})\+(\d{1,2})")

    def seed_records(self, n: int, seed: int) -> list[dict]:
        from reinforce_pro.data.arithmetic import arithmetic_records

        return arithmetic_records(n, seed=seed)

    def proposer_prompt(self, record: dict) -> str:
        return f"[{record['input'].rstrip('=')}]>"

    def parse_question(self, text: str) -> ParsedQuestion:
        match = self._QUESTION.fullmatch(text.strip())
        if match is None:
            return ParsedQuestion(None, "not of the form a+b with one- or two-digit operands")
        a, b = int(match.group(1)), int(match.group(2))
        return ParsedQuestion(Question(f"{a}+{b}", str(a + b)))

    def solver_prompt(self, question: Question) -> str:
        return question.text + "="

    def difficulty(self, question: Question) -> dict[str, float]:
        operands = [int(x) for x in question.text.split("+")]
        return {"digits": float(max(len(str(x)) for x in operands)), "answer_digits": float(len(question.answer))}

    def score(self, question: Question, responses: list[str], judge: Judge | None = None) -> ScoredResponses:
        answers = [r.strip() for r in responses]
        return ScoredResponses(
            scores={"completion": [float(a == question.answer) for a in answers]},
            format=[float(a.isdigit()) for a in answers],
        )

    def warm_start_examples(self, n: int, seed: int) -> list[dict]:
        """n solver examples (a+b= -> sum, operands <= 19) and n proposer examples ([a+b]> -> c+d, operands
        <= 29, unrelated to the seed: the proposer learns the format, not what is learnable)."""
        rng = random.Random(seed)
        hi_s, hi_p = self.warm_start_max_solved, self.warm_start_max_proposed
        out = []
        for _ in range(n):
            a, b = rng.randint(0, hi_s), rng.randint(0, hi_s)
            out.append({"prompt": f"{a}+{b}=", "label": str(a + b)})
            c, d = rng.randint(0, hi_s), rng.randint(0, hi_s)
            out.append({"prompt": f"[{c}+{d}]>", "label": f"{rng.randint(0, hi_p)}+{rng.randint(0, hi_p)}"})
        return out


CODE_SEEDS = [
    ("def f(x):\n    return sorted(x)[::-1]", "[3, 1, 2]"),
    ("def f(s):\n    return s.count('a') * 2", "'banana'"),
    ("def f(n):\n    total = 0\n    for i in range(n):\n        total += i * i\n    return total", "5"),
    ("def f(d):\n    return {v: k for k, v in d.items()}", "{'a': 1, 'b': 2}"),
    ("def f(xs):\n    return [x for x in xs if x % 3 == 0]", "[1, 3, 6, 7, 9]"),
    ("def f(s):\n    return ''.join(reversed(s.split()))", "'one two three'"),
]


class CodeOutputTask(SelfPlayTask):
    """Propose `f` and an input; solve by predicting repr(f(input)). Validated in the sandbox."""

    name = "code_output"
    thresholds = {"completion": SOME_BUT_NOT_ALL}
    weights = {"completion": 1.0}
    limits = SandboxLimits()
    runs_code = True

    def seed_records(self, n: int, seed: int) -> list[dict]:
        rng = random.Random(seed)
        return [dict(zip(("code", "input"), rng.choice(CODE_SEEDS), strict=True)) for _ in range(n)]

    def proposer_prompt(self, record: dict) -> str:
        return (
            "Write a new deterministic Python function f and an input for it, in the format of the example.\n"
            f"### code\n{record['code']}\n### input\n{record['input']}\n### new code\n"
        )

    def parse_question(self, text: str) -> ParsedQuestion:
        code, sep, argument = text.partition("### input")
        code, argument = code.strip(), argument.strip()
        if not sep or not code or not argument:
            return ParsedQuestion(None, "expected the code, a '### input' line, then a Python literal")
        try:
            ast.literal_eval(argument)
        except (ValueError, SyntaxError):
            return ParsedQuestion(None, f"the input {argument[:40]!r} is not a Python literal")
        result = run_deterministic(code, "f", argument, self.limits)
        if not result.ok:
            return ParsedQuestion(None, f"sandbox: {result.reason}")
        text = f"### code\n{code}\n### input\n{argument}"
        return ParsedQuestion(Question(text, result.output, {"code": code, "input": argument}))

    def solver_prompt(self, question: Question) -> str:
        return f"Predict the output of f(input).\n{question.text}\n### output\n"

    def score(self, question: Question, responses: list[str], judge: Judge | None = None) -> ScoredResponses:
        expected = ast.literal_eval(question.answer) if _is_literal(question.answer) else question.answer
        completion, fmt = [], []
        for response in responses:
            text = response.strip()
            parsed = _is_literal(text)
            fmt.append(float(parsed))
            got = ast.literal_eval(text) if parsed else text
            completion.append(float(got == expected and type(got) is type(expected)))
        return ScoredResponses({"completion": completion}, fmt)


def _is_literal(text: str) -> bool:
    try:
        ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


BUILTIN_TASKS: dict[str, type[SelfPlayTask]] = {"arithmetic": ArithmeticTask, "code_output": CodeOutputTask}


def load_task(name: str | None, path: str | None) -> SelfPlayTask:
    """The task of `--selfplay_task_path` if given, else the built-in `--selfplay_task`."""
    if path is None:
        if name not in BUILTIN_TASKS:
            raise ValueError(f"unknown --selfplay_task {name!r}; built-in tasks: {', '.join(BUILTIN_TASKS)}")
        return BUILTIN_TASKS[name]()
    module = import_user_file(path, "--selfplay_task_path", ValueError, "TASK")
    task = getattr(module, "TASK", None)
    missing = [m for m in ("proposer_prompt", "parse_question", "solver_prompt", "score") if not hasattr(task, m)]
    if task is None or missing:
        raise ValueError(f"--selfplay_task_path {path}: define TASK, a SelfPlayTask (missing: {missing or 'TASK'})")
    if not task.thresholds or set(task.weights) != set(task.thresholds):
        raise ValueError(f"--selfplay_task_path {path}: TASK.thresholds and TASK.weights must name the same dimensions")
    return task
