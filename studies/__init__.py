"""Learning studies: does a method train better, measured over paired seeds with registered statistics
(study_stats.py). Speed and memory are measured in benchmarks/, beside this folder; both share its helpers
(benchmarks/common.py: machine, commit, host id, provenance, JSON output). How a study is run: README.md."""

from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"
