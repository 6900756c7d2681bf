#!/usr/bin/env bash
# GPU smoke test: a few RL steps of a small model on ONE GPU, CUDA vLLM engine + DeepSpeed on NCCL.
#
# Runs on: one NVIDIA GPU (any with >= 16 GB), the `gpu` extra installed (vllm, deepspeed, ray).
# Takes:   ~2-4 minutes (engine start-up dominates).
# Model:   by default the built-in tiny Qwen2 (created locally, nothing downloaded); set MODEL to a local HF
#          directory to smoke-test a real model. Checks that the run finishes and writes metrics.jsonl.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=${PYTHON:-python3}
OUT=${OUT:-"$ROOT/runs/smoke_gpu"}
STEPS=${STEPS:-5}
MODEL=${MODEL:-}

MODEL_ARGS=()
if [[ -n "$MODEL" ]]; then
    MODEL_ARGS=(--pretrain "$MODEL" --param_dtype bf16 --vllm_dtype bfloat16)
else
    MODEL_ARGS=(--param_dtype fp32 --vllm_dtype bfloat16)
fi
PLACEMENT_ARGS=(
    --actor_num_nodes 1 --actor_num_gpus_per_node 1
    --ref_num_gpus_per_node 1 --critic_num_gpus_per_node 1 --reward_num_gpus_per_node 1
    --colocate_all_models
    --vllm_num_engines 1 --vllm_tensor_parallel_size 1 --vllm_gpu_memory_utilization 0.3
)
ALGO_ARGS=(
    --advantage_estimator reinforce_baseline --n_samples_per_prompt 8
    --enable_vllm_is_correction --vllm_is_correction_type reinforce_pro --vllm_is_truncated_threshold 0.5 5.0
    --init_kl_coef 0.001 --kl_estimator k3
)
BATCH_ARGS=(
    --rollout_batch_size 32 --train_batch_size 256 --micro_train_batch_size 64
    --max_samples $((32 * STEPS)) --max_new_tokens 8 --max_len 128
)

"$PYTHON" -m reinforce_pro.cli.train_ppo_ray \
    "${MODEL_ARGS[@]}" "${PLACEMENT_ARGS[@]}" "${ALGO_ARGS[@]}" "${BATCH_ARGS[@]}" --save_path "$OUT"

test -s "$OUT/metrics.jsonl"
echo "smoke_gpu: ok, $(wc -l < "$OUT/metrics.jsonl") steps in $OUT/metrics.jsonl"
