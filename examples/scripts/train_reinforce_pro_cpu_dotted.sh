#!/usr/bin/env bash
# train_reinforce_pro_cpu.sh written in OpenRLHF v0.11's dotted flags (--rollout.batch_size, ...): the same
# run, for users whose scripts already use the new spelling. Every flat flag has its dotted twin
# (docs/flags.md); a script may mix the two.
#
# Runs on: a CPU-only machine (2 cores is enough) with the `cpu` extra (bash scripts/setup_env.sh).
# Takes:   ~6 minutes for the default 700 steps; STEPS=2 for a smoke run.
# How:     directly (default), or as a Ray job when RAY_JOB_ADDRESS is set (see train_reinforce_pro_cpu.sh).
#          RESUME=1 continues from the last checkpoint; ASYNC=1 trains asynchronously (queue ASYNC_QUEUE=1).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=${PYTHON:-"$ROOT/.venv/bin/python"}
RAY=${RAY:-"$(dirname "$PYTHON")/ray"}
RAY_JOB_ADDRESS=${RAY_JOB_ADDRESS:-}
OUT=${OUT:-"$ROOT/runs/reinforce_pro_cpu_dotted"}
STEPS=${STEPS:-700}
SAVE_STEPS=${SAVE_STEPS:-50}
RESUME=${RESUME:-0}
ASYNC=${ASYNC:-0}
ASYNC_QUEUE=${ASYNC_QUEUE:-1}
read -r -a EXTRA <<< "${EXTRA_ARGS:-}"

ALGO_ARGS=(
    --algo.advantage.estimator reinforce_baseline --rollout.n_samples_per_prompt 8
    --algo.advantage.is_correction_enable --algo.advantage.is_correction_type reinforce_pro
    --algo.advantage.is_correction_threshold 0.5 5.0
)
BATCH_ARGS=(--rollout.batch_size 32 --train.batch_size 256 --data.max_samples $((32 * STEPS)))
CKPT_ARGS=(--ckpt.output_dir "$OUT" --ckpt.path "$OUT/ckpt" --ckpt.save_steps "$SAVE_STEPS" --ckpt.max_num 2)
if [[ "$RESUME" == 1 ]]; then CKPT_ARGS+=(--ckpt.load_enable); fi
LOOP_ARGS=()
if [[ "$ASYNC" == 1 ]]; then LOOP_ARGS+=(--train.async_enable --train.async_queue_size "$ASYNC_QUEUE"); fi
TRAIN=(-m reinforce_pro.cli.train_ppo_ray "${ALGO_ARGS[@]}" "${BATCH_ARGS[@]}" "${CKPT_ARGS[@]}" "${LOOP_ARGS[@]}"
       "${EXTRA[@]}")

if [[ -z "$RAY_JOB_ADDRESS" ]]; then
    exec "$PYTHON" "${TRAIN[@]}"
fi
exec "$RAY" job submit --address="$RAY_JOB_ADDRESS" \
    --runtime-env-json='{"env_vars": {"TOKENIZERS_PARALLELISM": "false"}}' \
    -- "$PYTHON" "${TRAIN[@]}"
