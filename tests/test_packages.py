"""studies/ and benchmarks/ are packages run with `python -m`: no module edits sys.path to find another, every
module imports as part of its package, and the docs name them the way they run."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODULES = sorted(p for d in ("studies", "benchmarks") for p in (ROOT / d).glob("*.py") if p.name != "__init__.py")


def test_no_study_or_benchmark_edits_sys_path():
    edits = [f"{p.relative_to(ROOT)}:{n}" for p in MODULES for n, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"sys\.path\.(insert|append)|sys\.path\s*=", line)]  # fmt: skip
    assert not edits, f"edits sys.path (run it with python -m instead): {edits}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: f"{p.parent.name}.{p.stem}")
def test_each_study_and_benchmark_imports_as_part_of_its_package(path):
    module = importlib.import_module(f"{path.parent.name}.{path.stem}")
    assert module.__file__ == str(path)


def test_the_docs_run_studies_and_benchmarks_with_python_m():
    """A `python studies/NAME.py` line would fail today (its imports need the package): every page says
    `python -m studies.NAME`. The one exception is a registered command of an earlier commit, quoted as it ran."""
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").rglob("*.md"),
             ROOT / "studies" / "README.md", ROOT / "benchmarks" / "README.md", *MODULES]  # fmt: skip
    stale = []
    for page in pages:
        for m in re.finditer(r"python3? (studies|benchmarks)/([a-z_0-9]+)\.py", page.read_text()):
            if (ROOT / m[1] / f"{m[2]}.py").exists():
                stale.append(f"{page.relative_to(ROOT)}: {m[0]}")
    assert not stale, stale


def test_every_benchmark_runs_through_the_shared_command_line():
    """One runner for --output, --render and the result's provenance (benchmarks/common.py: bench_main, arms_main):
    a benchmark adds its options and its measurement, and builds no parser of its own."""
    scripts = [
        p for p in MODULES if p.parent.name == "benchmarks" and p.stem != "common" and "def main" in p.read_text()
    ]
    assert len(scripts) >= 20
    own = [p.stem for p in scripts if "ArgumentParser(" in p.read_text()]
    shared = [p.stem for p in scripts if re.search(r"return (bench_main|arms_main)\(", p.read_text())]
    assert own == [] and len(shared) == len(scripts), (own, sorted({p.stem for p in scripts} - set(shared)))


# studies that read saved JSON in a mode of their own (a positional study file, a rule and its verdicts, a
# regression check against a baseline) and keep their own command line
OWN_COMMAND_LINE = {"confirmation_rule", "drift_reading", "compare_is_correction"}


def test_every_study_runs_through_a_shared_command_line():
    """A study that resumes its runs goes through studies/runner.study_main (--seeds, --steps, --output, --name,
    --render, --allow-dirty, provenance, resuming), one that measures once through bench_main: it adds its own
    options and its runs, and builds no parser of its own."""
    scripts = [p for p in MODULES if p.parent.name == "studies" and "def main" in p.read_text()]
    assert len(scripts) >= 14
    shared = [p.stem for p in scripts if re.search(r"return (study_main|bench_main)\(", p.read_text())]
    own = [p.stem for p in scripts if "ArgumentParser(" in p.read_text()]
    assert sorted(own) == sorted(OWN_COMMAND_LINE) and len(shared) == len(scripts) - len(OWN_COMMAND_LINE), (
        own, sorted({p.stem for p in scripts} - set(shared)))  # fmt: skip
