#!/usr/bin/env bash
# REINFORCE++-baseline with the reinforce_pro IS correction, submitted to a running Ray cluster.
#
# Runs on: a Ray cluster of NODES x GPUS_PER_NODE GPUs (default 1 x 8, e.g. H100 80GB) with the `gpu` extra
#          installed on every node; the head's dashboard at RAY_JOB_ADDRESS (default http://127.0.0.1:8265).
# Takes:   hours; checkpoints every 20 steps, and a resubmission resumes from the last one.
# Model:   a 7B-class instruct model: 4 vLLM engines (TP 1) + policy and reference colocated on the GPUs.
# Use:     MODEL=/models/Qwen2.5-7B-Instruct DATA=/data/gsm8k_train.jsonl bash examples/scripts/train_reinforce_baseline_ray.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_gpu_common.sh"

PLACEMENT_ARGS=(
    --actor_num_nodes "$NODES" --actor_num_gpus_per_node "$GPUS_PER_NODE"
    --ref_num_nodes "$NODES" --ref_num_gpus_per_node "$GPUS_PER_NODE"
    --vllm_num_engines $((NODES * GPUS_PER_NODE)) --vllm_tensor_parallel_size 1 --colocate_all_models
    --vllm_gpu_memory_utilization 0.5
)
ALGO_ARGS=(
    --advantage_estimator reinforce_baseline --n_samples_per_prompt 8
    --init_kl_coef 0.001 --kl_estimator k2 --use_kl_loss
    --rollout_batch_size 128 --train_batch_size 1024 --micro_train_batch_size 8 --micro_rollout_batch_size 16
    --actor_learning_rate 5e-7 --num_episodes 1 --max_epochs 1
)
SYSTEM_ARGS=(--zero_stage 3 --param_dtype bf16 --gradient_checkpointing --vllm_dtype auto)

submit "${DATA_ARGS[@]}" "${PLACEMENT_ARGS[@]}" "${ALGO_ARGS[@]}" "${IS_ARGS[@]}" "${SYSTEM_ARGS[@]}" "${RUN_ARGS[@]}"
