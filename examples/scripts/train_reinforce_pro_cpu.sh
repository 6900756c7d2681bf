#!/usr/bin/env bash
# REINFORCE Pro on the embedded default: a tiny Qwen2 model created locally, warm-started on additions,
# then RL with reinforce_baseline advantages and the reinforce_pro IS correction (bf16 vLLM engine, fp32
# DeepSpeed trainer), checkpointing as it goes.
#
# Runs on: a CPU-only machine (2 cores is enough) with the `cpu` extra (bash scripts/setup_env.sh).
# Takes:   ~6 minutes for the default 700 steps; STEPS=2 for a smoke run.
# How:     directly (default), or as a Ray job when RAY_JOB_ADDRESS is set, e.g. after
#            ray start --head --node-ip-address 127.0.0.1 --dashboard-host 127.0.0.1
#            RAY_JOB_ADDRESS=http://127.0.0.1:8265 bash examples/scripts/train_reinforce_pro_cpu.sh
#          Kill it at any moment and run it again with RESUME=1 to continue from the last checkpoint.
#          ASYNC=1 generates the next batch while the policy trains (--async_train, queue ASYNC_QUEUE=1).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=${PYTHON:-"$ROOT/.venv/bin/python"}
RAY=${RAY:-"$(dirname "$PYTHON")/ray"}
RAY_JOB_ADDRESS=${RAY_JOB_ADDRESS:-}
OUT=${OUT:-"$ROOT/runs/reinforce_pro_cpu"}
STEPS=${STEPS:-700}
SAVE_STEPS=${SAVE_STEPS:-50}
RESUME=${RESUME:-0}
ASYNC=${ASYNC:-0}
ASYNC_QUEUE=${ASYNC_QUEUE:-1}
read -r -a EXTRA <<< "${EXTRA_ARGS:-}"

ALGO_ARGS=(
    --advantage_estimator reinforce_baseline --n_samples_per_prompt 8
    --enable_vllm_is_correction --vllm_is_correction_type reinforce_pro --vllm_is_truncated_threshold 0.5 5.0
)
BATCH_ARGS=(--rollout_batch_size 32 --train_batch_size 256 --max_samples $((32 * STEPS)))
CKPT_ARGS=(--save_path "$OUT" --ckpt_path "$OUT/ckpt" --save_steps "$SAVE_STEPS" --max_ckpt_num 2)
if [[ "$RESUME" == 1 ]]; then CKPT_ARGS+=(--load_checkpoint); fi
LOOP_ARGS=()
if [[ "$ASYNC" == 1 ]]; then LOOP_ARGS+=(--async_train --async_queue_size "$ASYNC_QUEUE"); fi
TRAIN=(-m reinforce_pro.cli.train_ppo_ray "${ALGO_ARGS[@]}" "${BATCH_ARGS[@]}" "${CKPT_ARGS[@]}" "${LOOP_ARGS[@]}"
       "${EXTRA[@]}")

if [[ -z "$RAY_JOB_ADDRESS" ]]; then
    exec "$PYTHON" "${TRAIN[@]}"
fi
# The package is installed in the venv the head runs from: no working_dir upload is needed.
exec "$RAY" job submit --address="$RAY_JOB_ADDRESS" \
    --runtime-env-json='{"env_vars": {"TOKENIZERS_PARALLELISM": "false"}}' \
    -- "$PYTHON" "${TRAIN[@]}"
