#!/usr/bin/env bash
# Set up .venv and run every check CI runs: ruff, compileall, pytest.
#
# Runs on: a CPU-only machine (2 cores is enough); GPU-only tests are skipped without a GPU.
# Takes:   set-up of the full CPU stack on a fresh machine (~4-6 min, see scripts/setup_env.sh), then the tests in
#          two tiers: the unit and contract tests on both cores (pytest-xdist: they are single-threaded Python),
#          then the end-to-end tests one at a time (each starts Ray, vLLM CPU engines and DeepSpeed, which use
#          both cores already).
#
#   bash scripts/test.sh             lint, the unit tests, the end-to-end tests: what CI runs
#   bash scripts/test.sh --fast      lint and the unit tests alone (the edit loop)
#   bash scripts/test.sh --recipes   lint and the recipe tests alone: each runs an example script whole, as a user
#                                    does, with its own Ray, engine and warm start (~15-20 min on 2 cores)
#   bash scripts/test.sh --all       all three tiers
#
# Extra arguments go to every pytest call, e.g. `bash scripts/test.sh --fast -k is_correction`; a tier the
# arguments leave empty is said and passed over. Every tier runs even when an earlier one fails, and the command
# fails if any did. The pytest calls share one time guard (TEST_GUARD_S, 80 min from the start of this script;
# 110 with the recipes): no test starts after it, so a run that hangs still reports inside CI's 90 minutes.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
MODE=ci
case "${1:-}" in --fast | --recipes | --all) MODE=${1#--}; shift ;; esac
case "$MODE" in recipes | all) GUARD_S=${TEST_GUARD_S:-6600} ;; *) GUARD_S=${TEST_GUARD_S:-4800} ;; esac

EXTRAS=cpu,models,search,frameworks,dev INTEGRATIONS=1 bash scripts/setup_env.sh  # + reasoning-gym, BM25, LangGraph, Agents SDK; OpenRLHF, TRL, verl
PY=.venv/bin/python

echo "[test] ruff"
"$PY" -m ruff check reinforce_pro tests benchmarks studies
"$PY" -m ruff format --check --quiet reinforce_pro tests benchmarks studies
echo "[test] compileall"
"$PY" -m compileall -q reinforce_pro tests benchmarks studies >/dev/null
echo "[test] set-up and lint took ${SECONDS} s"

FAILED=()
tier() {  # tier NAME PYTEST_ARGS...: one pytest call under what is left of the time guard
    local name=$1 left=$((GUARD_S - SECONDS)) rc=0
    shift
    if ((left < 60)); then
        echo "[test] $name: not run, the time guard (${GUARD_S} s) is spent" >&2
        FAILED+=("$name")
        return
    fi
    echo "[test] $name (tests slower than 60 s are named as they end; no test starts after ${left} s more)"
    local start=$SECONDS
    "$PY" -m pytest -q -o session_timeout="$left" "$@" || rc=$?
    echo "[test] $name took $((SECONDS - start)) s"
    if ((rc == 5)); then
        echo "[test] $name: no test selected"
    elif ((rc != 0)); then
        FAILED+=("$name")
    fi
}

if [[ "$MODE" != recipes ]]; then
    tier "unit tests" -n 2 -m "not e2e" --durations=10 "$@"
fi
if [[ "$MODE" == ci || "$MODE" == all ]]; then
    tier "end-to-end tests" -m "e2e and not recipe" --durations=20 "$@"  # the 20 slowest: where the time goes
fi
if [[ "$MODE" == recipes || "$MODE" == all ]]; then
    tier "recipe tests" -m recipe --durations=10 "$@"
fi
if ((${#FAILED[@]})); then
    echo "[test] failed: ${FAILED[*]}" >&2
    exit 1
fi
echo "[test] all passed"
