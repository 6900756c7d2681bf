#!/usr/bin/env bash
# Set up .venv and run every check CI runs: ruff, compileall, pytest.
#
# Runs on: a CPU-only machine (2 cores is enough); GPU-only tests are skipped without a GPU.
# Takes:   set-up of the full CPU stack on a fresh machine (~2.5 min, see scripts/setup_env.sh), then a
#          few minutes of tests (the end-to-end ones start Ray, one vLLM CPU engine and DeepSpeed).
# Extra arguments are passed to pytest, e.g. `bash scripts/test.sh -k is_correction`.
# `--fast` (first argument) runs the unit and contract tests alone: every test not marked e2e, i.e. none that
# starts Ray, a vLLM engine or DeepSpeed (the edit loop; CI runs everything).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
EXTRAS=cpu,models,search,frameworks,dev INTEGRATIONS=1 bash scripts/setup_env.sh  # + reasoning-gym, BM25, LangGraph, Agents SDK; OpenRLHF, TRL, verl
PY=.venv/bin/python

echo "[test] ruff"
"$PY" -m ruff check reinforce_pro tests benchmarks studies
"$PY" -m ruff format --check --quiet reinforce_pro tests benchmarks studies
echo "[test] compileall"
"$PY" -m compileall -q reinforce_pro tests benchmarks studies >/dev/null
echo "[test] pytest (set-up and lint took ${SECONDS} s; tests slower than 60 s are named as they end)"
if [[ "${1:-}" == --fast ]]; then
    shift
    "$PY" -m pytest -q -m "not e2e and not gpu" --durations=10 "$@"
else
    "$PY" -m pytest -q --durations=20 "$@"  # the 20 slowest tests listed: where the suite's time goes
fi
