#!/usr/bin/env bash
# Create .venv-trl: TRL's GRPOTrainer for benchmarks/bench_peers.py, kept out of the project's own .venv.
#
# Runs on: the same CPU machine as scripts/setup_env.sh (PyPI reachable); ~1 min, ~1.5 GB.
# TRL 1.16 accepts the project's transformers 5.19 and torch 2.13.0+cpu, so both sides run the same
# kernels: only the trainers differ. torch is installed first and pinned (constraints/cpu.txt), as for .venv.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VENV=${VENV_TRL:-"$ROOT/.venv-trl"}
PYTHON=${PYTHON:-python3}
TRL_VERSION=${TRL_VERSION:-1.16.0}

[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
"${PIP[@]}" "torch==2.13.0"
"${PIP[@]}" -c "$ROOT/constraints/cpu.txt" "trl==${TRL_VERSION}" "transformers==5.19.0"
"$VENV/bin/python" -c "import torch, trl; assert not torch.version.cuda; print('[setup_trl] ok: trl', trl.__version__, 'torch', torch.__version__)"
