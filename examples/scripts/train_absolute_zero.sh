#!/usr/bin/env bash
# Absolute-Zero self-play: the policy proposes arithmetic questions and solves them; proposer and solver
# trajectories are trained in one update with the reinforce_pro IS correction.
#
# Runs on: a CPU-only machine (2 cores is enough) with the `cpu` extra installed (scripts/setup_env.sh),
#          or a GPU machine with the `gpu` extra: the same flags, vLLM and DeepSpeed pick the device.
# Takes:   ~6 minutes on 2 CPU cores (a 1000-step warm start, then 300 self-play steps).
# Model:   the built-in tiny Qwen2 (created locally, nothing downloaded). Set MODEL to a local HF directory
#          and SEEDS to a jsonl of seed records to self-play with your own model (then the warm start is
#          skipped and the task reads each record's fields: see docs/selfplay.md).
# Prints:  the mean learnable ratio and re-proposal attempts of the first and second half of the run.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=${PYTHON:-"$ROOT/.venv/bin/python"}
OUT=${OUT:-"$ROOT/runs/absolute_zero"}
STEPS=${STEPS:-300}
PROMPTS_PER_STEP=${PROMPTS_PER_STEP:-16}
TASK=${TASK:-arithmetic}
SCOPE=${SCOPE:-group}
PENALTY=${PENALTY:-8}  # R-Zero's repetition penalty on the proposer (0: off)
EVAL_STEPS=${EVAL_STEPS:-25}  # the task's held-out ladder every N steps (eval/ladder/*)
MODEL=${MODEL:-}
SEEDS=${SEEDS:-}
GPUS=${GPUS:-1}  # policy ranks (one per GPU; on CPU, one process)

DATA_ARGS=()
if [[ -n "$MODEL" ]]; then DATA_ARGS+=(--pretrain "$MODEL"); fi
if [[ -n "$SEEDS" ]]; then DATA_ARGS+=(--prompt_data "$SEEDS"); fi
SELFPLAY_ARGS=(
    --absolute_zero --selfplay_task "$TASK"
    --n_questions_per_prompt 4 --n_samples_per_prompt 8 --max_repropose_attempts 3
    --proposer_train_scope "$SCOPE" --proposer_repetition_penalty "$PENALTY"
    --eval_steps "$EVAL_STEPS" --eval_before_training
    --format_reward_coef 0.5 --proposer_reward_coef 0.1 --task_completion_weight 0.3
)
ALGO_ARGS=(
    --advantage_estimator reinforce_baseline
    --enable_vllm_is_correction --vllm_is_correction_type reinforce_pro --vllm_is_truncated_threshold 0.5 5.0
)
BATCH_ARGS=(
    --rollout_batch_size "$PROMPTS_PER_STEP" --train_batch_size 256 --micro_train_batch_size 32
    --max_samples $((PROMPTS_PER_STEP * STEPS))
)
PLACEMENT_ARGS=(--actor_num_gpus_per_node "$GPUS" --ref_num_gpus_per_node "$GPUS" --vllm_num_engines 1)

"$PYTHON" -m reinforce_pro.cli.train_ppo_ray \
    "${DATA_ARGS[@]}" "${SELFPLAY_ARGS[@]}" "${ALGO_ARGS[@]}" "${BATCH_ARGS[@]}" "${PLACEMENT_ARGS[@]}" \
    --save_path "$OUT"
