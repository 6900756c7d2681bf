"""`code_output`: Absolute Zero's deduction task, for real models.

The proposer writes a small Python function `f` and an input; the sandbox runs it (twice, for determinism) and
its output is the answer; the solver predicts that output. Both roles use the form small code models have
seen most, a function followed by an assert:

    def f(s):
        return s.count('a') * 2
    assert f('banana') == 6

A proposer prompt shows two such blocks and ends in "def f(": the model writes the rest of a function and an
`assert f(<input>) == ...` line of its own (its claimed output is ignored: the sandbox decides). A solver
prompt is the function and "assert f(<input>) == "; the solver completes the line. Measured on
SmolLM2-135M-Instruct before any training (docs/selfplay.md): in this form about 1 in 6 proposals is a valid
program; asked for a "### code / ### input" layout instead, none of 48 were.
"""

from __future__ import annotations

import ast
import random
import zlib

from reinforce_pro.selfplay.sandbox import SandboxLimits, run_deterministic
from reinforce_pro.selfplay.tasks import (
    SOME_BUT_NOT_ALL,
    Judge,
    ParsedQuestion,
    Question,
    ScoredResponses,
    SelfPlayTask,
)

CODE_SEEDS = [
    ("def f(x):\n    return sorted(x)[::-1]", "[3, 1, 2]"),
    ("def f(s):\n    return s.count('a') * 2", "'banana'"),
    ("def f(n):\n    total = 0\n    for i in range(n):\n        total += i * i\n    return total", "5"),
    ("def f(d):\n    return {v: k for k, v in d.items()}", "{'a': 1, 'b': 2}"),
    ("def f(xs):\n    return [x for x in xs if x % 3 == 0]", "[1, 3, 6, 7, 9]"),
    ("def f(s):\n    return ''.join(reversed(s.split()))", "'one two three'"),
]

PROPOSAL_START = "def f("  # every proposer prompt ends here; the response is the rest of the program


class CodeOutputTask(SelfPlayTask):
    """Propose `f` and an input; solve by predicting repr(f(input)). Validated in the sandbox."""

    name = "code_output"
    thresholds = {"completion": SOME_BUT_NOT_ALL}
    weights = {"completion": 1.0}
    limits = SandboxLimits()
    runs_code = True
    # a proposal ends at the blank line after its assert; an answer is one line
    sampling = {"proposer": {"max_tokens": 128, "stop": ["\n\n"]}, "solver": {"max_tokens": 32, "stop": ["\n"]}}
    max_answer_chars = 60  # longer outputs are refused: the solver must be able to write them in its budget

    def __init__(self):
        self._outputs: dict[tuple[str, str], str | None] = {}  # (code, input) -> output, for prompt examples

    def seed_records(self, n: int, seed: int) -> list[dict]:
        rng = random.Random(seed)
        return [dict(zip(("code", "input"), rng.choice(CODE_SEEDS), strict=True)) for _ in range(n)]

    def proposer_prompt(self, record: dict) -> str:
        """Two example blocks, the record's and a built-in one chosen by the record's text, then "def f("."""
        other = CODE_SEEDS[zlib.crc32(record["code"].encode()) % len(CODE_SEEDS)]
        if other[0] == record["code"]:
            other = CODE_SEEDS[(CODE_SEEDS.index(other) + 1) % len(CODE_SEEDS)]
        first = self._example(record["code"], record["input"], record.get("output"))
        return first + self._example(*other) + PROPOSAL_START

    def _example(self, code: str, argument: str, output: str | None = None) -> str:
        """One block; a seed record without its output (a --prompt_data row) is run once in the sandbox, and one
        that does not run is shown without its assert."""
        if output is None:
            key = (code, argument)
            if key not in self._outputs:
                result = run_deterministic(code, "f", argument, self.limits)
                self._outputs[key] = result.output if result.ok else None
            output = self._outputs[key]
        return f"{code}\n" + (f"assert f({argument}) == {output}\n\n" if output is not None else "\n")

    def parse_question(self, text: str) -> ParsedQuestion:
        """The response continues "def f(": the program is every line before the first `assert f(...)` line,
        whose single argument (a Python literal) is the input."""
        lines = (PROPOSAL_START + text).split("\n")
        at = next((i for i, line in enumerate(lines) if line.startswith("assert f(")), None)
        if at is None:
            return ParsedQuestion(None, "expected the function, then a line 'assert f(<input>) == <output>'")
        code, argument = "\n".join(lines[:at]).strip(), _call_argument(lines[at])
        if argument is None:
            return ParsedQuestion(None, f"{lines[at][:60]!r}: f must be called on one Python literal")
        result = run_deterministic(code, "f", argument, self.limits)
        if not result.ok:
            return ParsedQuestion(None, f"sandbox: {result.reason}")
        if len(result.output) > self.max_answer_chars:
            return ParsedQuestion(None, f"the output is {len(result.output)} characters, over {self.max_answer_chars}")
        return ParsedQuestion(_question(code, argument, result.output))

    def solver_prompt(self, question: Question) -> str:
        return question.text + " "

    def reference_record(self, question: Question) -> dict:
        return {**question.meta, "output": question.answer}

    def score(self, question: Question, responses: list[str], judge: Judge | None = None) -> ScoredResponses:
        """Right when the answer's first line is a literal equal to the output, of the same type."""
        expected = ast.literal_eval(question.answer) if _is_literal(question.answer) else question.answer
        completion, fmt = [], []
        for response in responses:
            text = response.split("\n", 1)[0].strip()
            parsed = _is_literal(text)
            fmt.append(float(parsed))
            got = ast.literal_eval(text) if parsed else text
            completion.append(float(got == expected and type(got) is type(expected)))
        return ScoredResponses({"completion": completion}, fmt)

    def difficulty(self, question: Question) -> dict[str, float]:
        code = question.meta["code"]
        return {
            "lines": float(code.count("\n") + 1),
            "loops": float(any(w in code for w in ("for ", "while "))),
            "answer_chars": float(len(question.answer)),
        }

    def ladder(self) -> dict[str, list[Question]]:
        return {level: [_ladder_question(code, arg) for code, arg in items] for level, items in CODE_LADDER.items()}


def _call_argument(line: str) -> str | None:
    """The source of the single literal argument of `assert f(<arg>) [== ...]`, or None."""
    try:
        node = ast.parse(line.strip()).body[0]
    except (SyntaxError, ValueError, IndexError, RecursionError, MemoryError):
        return None
    test = getattr(node, "test", None)
    call = test.left if isinstance(test, ast.Compare) else test
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "f"):
        return None
    if len(call.args) != 1 or call.keywords:
        return None
    argument = ast.get_source_segment(line.strip(), call.args[0])
    return argument if argument is not None and _is_literal(argument) else None


def _is_literal(text: str) -> bool:
    try:
        ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return False
    return True


# The held-out ladder: fixed programs of five kinds, 24 each, drawn once from templates with constants and
# inputs. Their outputs are computed here, in this process: the programs are ours (constants in this file),
# never model-written.
LADDER_SEED = 20261125
LADDER_QUESTIONS = 24
_WORDS = ("cat", "banana", "tree", "apple", "moon", "river", "code", "stone")
LADDER_TEMPLATES = {
    "arith": lambda r: (f"def f(x):\n    return x * {r.randint(2, 9)} + {r.randint(1, 20)}", str(r.randint(0, 30))),
    "branch": lambda r: (
        (lambda a: f"def f(x):\n    if x > {a}:\n        return x - {a}\n    return {a} - x")(r.randint(3, 20)),
        str(r.randint(0, 30)),
    ),
    "string": lambda r: (
        r.choice(
            [
                "def f(s):\n    return s[::-1]",
                "def f(s):\n    return s.upper()",
                "def f(s):\n    return len(s) * 3",
                "def f(s):\n    return s[1:] + s[0]",
                "def f(s):\n    return s.count('a')",
            ]
        ),
        repr(r.choice(_WORDS)),
    ),  # fmt: skip
    "list": lambda r: (
        r.choice(
            [
                "def f(xs):\n    return sum(xs)",
                "def f(xs):\n    return max(xs) - min(xs)",
                "def f(xs):\n    return [x * 2 for x in xs]",
                "def f(xs):\n    return sorted(xs)",
                "def f(xs):\n    return xs[::-1]",
                "def f(xs):\n    return len(xs)",
            ]
        ),
        repr([r.randint(0, 9) for _ in range(r.randint(2, 5))]),
    ),  # fmt: skip
    "loop": lambda r: (
        (lambda a: f"def f(n):\n    total = {a}\n    for i in range(n):\n        total += i\n    return total")(
            r.randint(0, 5)
        ),
        str(r.randint(1, 6)),
    ),
}
CODE_LADDER = {
    level: [make(random.Random(f"{LADDER_SEED}/{level}/{i}")) for i in range(LADDER_QUESTIONS)]
    for level, make in LADDER_TEMPLATES.items()
}


def _ladder_question(code: str, argument: str) -> Question:
    namespace: dict = {}
    exec(code, namespace)  # noqa: S102 -- one of the fixed ladder programs above, never model-written text
    return _question(code, argument, repr(namespace["f"](ast.literal_eval(argument))))


def _question(code: str, argument: str, output: str) -> Question:
    """The solver sees the function and "assert f(<input>) ==", and completes the line with the output."""
    return Question(f"{code}\nassert f({argument}) ==", output, {"code": code, "input": argument})
