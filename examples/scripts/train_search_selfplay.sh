#!/usr/bin/env bash
# Search self-play: the policy proposes questions about a knowledge base it has never read and answers them by
# searching it (Search-R1's turns against a BM25 service on loopback); no question is written by a person.
# Proposer and solver trajectories are trained in one update with the reinforce_pro IS correction; retrieved
# text is environment tokens, out of the loss and of the correction (docs/selfplay.md, "Search self-play").
#
# Runs on: a CPU-only machine (2 cores is enough) with the `cpu` and `search` extras
#          (EXTRAS=cpu,search,dev bash scripts/setup_env.sh), or a GPU machine with `gpu,search`.
# Takes:   a warm start on the formats (demonstrations from 20 other generated bases, none of this base's
#          questions) until its greedy search accuracy on another base reaches WARM_TARGET (at most WARM_STEPS
#          SFT steps), then STEPS self-play steps.
# Service: started here (its process id kept) and stopped when the script exits, however it exits.
#          RETRIEVER_URL=http://host:port uses a running service of yours instead (Search-R1's contract).
# Model:   the built-in tiny Qwen2 (created locally), warm-started; MODEL=dir skips the warm start.
# Task:    the built-in `search` task; TASK_PATH=file.py runs your own (a .py defining TASK, e.g. a SearchTask
#          subclass with another grammar), which finds the base and the service in SEARCH_SELFPLAY_KB and
#          SEARCH_RETRIEVER_URL.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=${PYTHON:-"$ROOT/.venv/bin/python"}
OUT=${OUT:-"$ROOT/runs/search_selfplay"}
STEPS=${STEPS:-40}
SEED=${SEED:-0}
PORT=${PORT:-8000}
MODEL=${MODEL:-}
RETRIEVER_URL=${RETRIEVER_URL:-}
TASK_PATH=${TASK_PATH:-}
PROMPTS_PER_STEP=${PROMPTS_PER_STEP:-16}
QUESTIONS=${QUESTIONS:-4}      # questions proposed per seed
SAMPLES=${SAMPLES:-8}          # solver episodes per question
REPROPOSE=${REPROPOSE:-3}      # re-proposal rounds for a seed whose questions are all or none learnable
ENTITIES=${ENTITIES:-200}      # invented people in the knowledge base
WARM_STEPS=${WARM_STEPS:-2000} # at most this many SFT steps on both roles' formats
WARM_TARGET=${WARM_TARGET:-0.25} # ... stopped once this accuracy is reached (0: every step)
EVAL_STEPS=${EVAL_STEPS:-10}   # held-out questions (people no proposal may name), by hops, every N steps
GPUS=${GPUS:-1}                # policy ranks (one per GPU; on CPU, one process)

source "$(dirname "${BASH_SOURCE[0]}")/_search_service.sh"

MODEL_ARGS=(--sft_warmup_steps "$WARM_STEPS" --sft_warmup_target "$WARM_TARGET")
if [[ -n "$MODEL" ]]; then MODEL_ARGS=(--pretrain "$MODEL"); fi
TASK_ARGS=(--selfplay_task search --selfplay_kb "$OUT/kb" --selfplay_retriever_url "$RETRIEVER_URL")
if [[ -n "$TASK_PATH" ]]; then
    export SEARCH_SELFPLAY_KB="$OUT/kb" SEARCH_RETRIEVER_URL="$RETRIEVER_URL"
    TASK_ARGS=(--selfplay_task_path "$TASK_PATH")
fi
SELFPLAY_ARGS=(
    --absolute_zero "${TASK_ARGS[@]}"
    --n_questions_per_prompt "$QUESTIONS" --n_samples_per_prompt "$SAMPLES" --max_repropose_attempts "$REPROPOSE"
    --proposer_train_scope group --task_completion_weight 1.0 --format_reward_coef 0.1 --proposer_reward_coef 0.1
    --eval_steps "$EVAL_STEPS" --eval_before_training
    --prompt_max_len 64 --max_len 512 --max_new_tokens 40
)
ALGO_ARGS=(
    --advantage_estimator reinforce_baseline --init_kl_coef 0 --actor_learning_rate 3e-4
    --enable_vllm_is_correction --vllm_is_correction_type reinforce_pro --vllm_is_truncated_threshold 0.5 5.0
)
BATCH_ARGS=(
    --rollout_batch_size "$PROMPTS_PER_STEP" --train_batch_size $((PROMPTS_PER_STEP * (SAMPLES + QUESTIONS)))
    --micro_train_batch_size 32 --micro_rollout_batch_size 64 --max_samples $((PROMPTS_PER_STEP * STEPS))
)
PLACEMENT_ARGS=(--actor_num_gpus_per_node "$GPUS" --ref_num_gpus_per_node "$GPUS" --vllm_num_engines 1)
"$PYTHON" -m reinforce_pro.cli.train_ppo_ray "${MODEL_ARGS[@]}" "${SELFPLAY_ARGS[@]}" "${ALGO_ARGS[@]}" \
    "${BATCH_ARGS[@]}" "${PLACEMENT_ARGS[@]}" --seed "$SEED" --save_path "$OUT" "$@"
