"""Rules of CONTRIBUTING.md that a machine can check: no function in the package over 60 lines, and no issue
number or commit hash in its comments and docstrings (the why belongs there, the history in git)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "reinforce_pro"
MAX_FUNCTION_LINES = 60


def test_no_function_is_longer_than_sixty_lines():
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []


def test_no_issue_number_or_commit_hash_in_the_package():
    """A comment or docstring that cites "issue 32" or "at 8b17c2a" sends a reader to a tracker or a log they may
    not have; say why instead. Hex words of 7-12 characters with a digit and a letter count as hashes, but for a
    citation of another repository's source at a commit ("owner/repo abc1234")."""
    issue = re.compile(r"\bissues? ?#?\d+", re.I)
    commit = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,12}\b")
    citation = re.compile(r"[\w.-]+/[\w.-]+ $")  # what precedes a hash that cites another repository
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            hashes = [m for m in commit.finditer(line) if not citation.search(line[: m.start()])]
            if issue.search(line) or hashes:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{n}: {line.strip()}")
    assert found == []


def _function(path: str, name: str) -> ast.FunctionDef:
    tree = ast.parse((PACKAGE / path).read_text())
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


def _called(func: ast.FunctionDef) -> set[str]:
    """The names a function calls: `f(...)` and `x.f(...)` both give "f"."""
    calls = (n.func for n in ast.walk(func) if isinstance(n, ast.Call))
    return {c.id if isinstance(c, ast.Name) else c.attr for c in calls if isinstance(c, (ast.Name, ast.Attribute))}


def test_main_reaches_fit_through_one_driver():
    """cli main -> driver.train -> driver.build_and_fit -> driver.fit_once -> PPOTrainer(...).fit: three files,
    each step a call in the one before, so a newcomer reads the run top to bottom (fit_once is one attempt, which
    build_and_fit repeats after a lost actor)."""
    assert "train" in _called(_function("cli/train_ppo_ray.py", "main"))
    assert {"prepare", "build_and_fit"} <= _called(_function("run/driver.py", "train"))
    assert "fit_once" in _called(_function("run/driver.py", "build_and_fit"))
    assert {"PPOTrainer", "fit"} <= _called(_function("run/driver.py", "fit_once"))


def _untyped_plans(tree: ast.Module) -> list[str]:
    funcs = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    return [f.name for f in funcs for a in f.args.args + f.args.kwonlyargs
            if a.arg == "plan" and (a.annotation is None or "RunPlan" not in ast.unparse(a.annotation))]  # fmt: skip


def _trainer_attributes_set(tree: ast.Module) -> list[int]:
    """Lines that assign an attribute of a name bound to PPOTrainer(...) in the same module."""
    made = [n for n in ast.walk(tree) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)]
    trainers = {t.id for n in made if "PPOTrainer" in ast.unparse(n.value.func) for t in n.targets
                if isinstance(t, ast.Name)}  # fmt: skip
    assigns = [(n, t) for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AugAssign))
               for t in (n.targets if isinstance(n, ast.Assign) else [n.target])]  # fmt: skip
    return [n.lineno for n, t in assigns
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in trainers]  # fmt: skip


def test_every_plan_parameter_is_typed_and_no_trainer_attribute_is_set_from_outside():
    """A RunPlan parameter says its type wherever it is taken; a PPOTrainer gets what it needs in its constructor,
    never by `trainer.x = ...` from the code that made it."""
    trees = {p.relative_to(PACKAGE).as_posix(): ast.parse(p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))}
    assert {path: _untyped_plans(t) for path, t in trees.items() if _untyped_plans(t)} == {}
    assert {path: _trainer_attributes_set(t) for path, t in trees.items() if _trainer_attributes_set(t)} == {}
    poked = ast.parse("t = PPOTrainer(a, b)\nt.engines_hold_start_weights = True\n")  # what the rule forbids
    assert _trainer_attributes_set(poked) == [2] and _untyped_plans(ast.parse("def f(plan): pass")) == ["f"]


def test_settings_classes_follow_one_naming_rule():
    """CONTRIBUTING.md's rule: a component's settings end in Config, a description of one member of a family in
    Spec; no third suffix (Settings, Options, Params)."""
    names = [n.name for p in PACKAGE.rglob("*.py") for n in ast.walk(ast.parse(p.read_text()))
             if isinstance(n, ast.ClassDef)]  # fmt: skip
    assert [n for n in names if re.search(r"(Settings|Options|Params)$", n)] == []
    assert {"EngineConfig", "SurrogateConfig", "LoopConfig", "FlagSpec", "GroupSpec"} <= set(names)
