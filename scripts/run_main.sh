#!/usr/bin/env bash
# Set up .venv and run the main job: the embedded default of train_ppo_ray.
#
# Runs on: a CPU-only machine (2 cores, no GPU), nothing fetched at run time: a tiny Qwen2 model and its
#          tokenizer are created locally, warm-started on built-in additions, then trained with
#          reinforce_baseline and the reinforce_pro IS correction (vLLM CPU engine in bf16, DeepSpeed fp32).
# Takes:   set-up of the CPU stack on a fresh machine (~2.5 min), then ~5.5 min of training.
# Writes:  ./runs/<time>/ (metrics.jsonl, tensorboard/, final_model/, summary.json); pass --save_path DIR
#          or any other train_ppo_ray flag to change it.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
EXTRAS=cpu,dev bash scripts/setup_env.sh
exec .venv/bin/python -m reinforce_pro.cli.train_ppo_ray "$@"
