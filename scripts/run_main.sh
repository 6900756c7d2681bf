#!/usr/bin/env bash
# Set up .venv and run the project's main job on this machine.
#
# Runs on: a CPU-only machine, nothing fetched at run time.
# Takes:   set-up (~45 s on a fresh machine), then about a second.
# Until the distributed trainer lands (issue: "Distributed RL trainer on Ray"), the main job is the
# algorithm self-check: every IS correction through the real PolicyLoss under a simulated drift.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
bash scripts/setup_env.sh
exec .venv/bin/python -m reinforce_pro.selfcheck "$@"
