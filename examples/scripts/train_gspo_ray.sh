#!/usr/bin/env bash
# GSPO (sequence-level ratio, Zheng et al. 2025) with group-normalised advantages, submitted to a running
# Ray cluster. GSPO's loss applies no token-level IS weights: the reinforce_pro flags are kept so that
# is/vllm_kl still measures the rollout/trainer mismatch; IS_CORRECTION=tis etc. compares the same way.
#
# Runs on: a Ray cluster of NODES x GPUS_PER_NODE GPUs (default 1 x 8) with the `gpu` extra on every node;
#          the head's dashboard at RAY_JOB_ADDRESS (default http://127.0.0.1:8265).
# Takes:   hours; checkpoints every 20 steps; resubmit to resume.
# Use:     MODEL=/models/Qwen3-8B DATA=/data/math_train.jsonl bash examples/scripts/train_gspo_ray.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_gpu_common.sh"

PLACEMENT_ARGS=(
    --actor_num_nodes "$NODES" --actor_num_gpus_per_node "$GPUS_PER_NODE"
    --vllm_num_engines $((NODES * GPUS_PER_NODE / 2)) --vllm_tensor_parallel_size 2 --vllm_gpu_memory_utilization 0.8
)
ALGO_ARGS=(
    --policy_loss_type gspo --advantage_estimator group_norm --n_samples_per_prompt 8 --init_kl_coef 0
    --eps_clip_low_high 3e-4 4e-4
    --rollout_batch_size 128 --train_batch_size 1024 --micro_train_batch_size 4 --micro_rollout_batch_size 8
    --actor_learning_rate 1e-6 --dynamic_filtering --dynamic_filtering_reward_range 0 1
)
SYSTEM_ARGS=(--zero_stage 3 --param_dtype bf16 --gradient_checkpointing --vllm_dtype auto)

submit "${DATA_ARGS[@]}" "${PLACEMENT_ARGS[@]}" "${ALGO_ARGS[@]}" "${IS_ARGS[@]}" "${SYSTEM_ARGS[@]}" "${RUN_ARGS[@]}"
