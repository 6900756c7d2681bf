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
