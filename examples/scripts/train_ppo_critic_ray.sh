#!/usr/bin/env bash
# PPO with a critic (GAE) and the reinforce_pro IS correction, submitted to a running Ray cluster.
#
# Runs on: a Ray cluster of NODES x GPUS_PER_NODE GPUs (default 1 x 8) with the `gpu` extra on every node;
#          the head's dashboard at RAY_JOB_ADDRESS (default http://127.0.0.1:8265).
# Takes:   hours; checkpoints (policy and critic, with optimizer states) every 20 steps; resubmit to resume.
# Model:   a 7B-class model; policy, critic, reference and the vLLM engines share every GPU (colocated).
# Use:     MODEL=/models/Qwen2.5-7B-Instruct DATA=/data/gsm8k_train.jsonl bash examples/scripts/train_ppo_critic_ray.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_gpu_common.sh"

PLACEMENT_ARGS=(
    --actor_num_nodes "$NODES" --actor_num_gpus_per_node "$GPUS_PER_NODE"
    --critic_num_nodes "$NODES" --critic_num_gpus_per_node "$GPUS_PER_NODE"
    --ref_num_nodes "$NODES" --ref_num_gpus_per_node "$GPUS_PER_NODE"
    --vllm_num_engines $((NODES * GPUS_PER_NODE)) --vllm_tensor_parallel_size 1 --colocate_all_models
    --vllm_gpu_memory_utilization 0.4
)
ALGO_ARGS=(
    --advantage_estimator gae --gamma 1.0 --lambd 0.95 --n_samples_per_prompt 1
    --init_kl_coef 0.01 --kl_estimator k1
    --rollout_batch_size 512 --train_batch_size 256 --micro_train_batch_size 8 --micro_rollout_batch_size 16
    --actor_learning_rate 5e-7 --critic_learning_rate 9e-6 --max_epochs 1 --value_clip 0.5 --save_value_network
)
SYSTEM_ARGS=(--zero_stage 3 --param_dtype bf16 --gradient_checkpointing --vllm_dtype auto)

submit "${DATA_ARGS[@]}" "${PLACEMENT_ARGS[@]}" "${ALGO_ARGS[@]}" "${IS_ARGS[@]}" "${SYSTEM_ARGS[@]}" "${RUN_ARGS[@]}"
