#!/usr/bin/env bash
# Search-augmented RL in Search-R1's format: a generated knowledge base, its BM25 retrieval service on
# loopback, a warm start on search demonstrations, then RL with the search agent (docs/agents.md).
#
# Runs on: a CPU-only machine (2 cores is enough) with the `cpu` and `search` extras
#          (EXTRAS=cpu,search,dev bash scripts/setup_env.sh), or a GPU machine with `gpu,search`.
# Takes:   about 1 minute of warm start, then STEPS RL steps of ~10 s each on 2 CPU cores.
# Service: started here (its process id kept) and stopped when the script exits, however it exits.
#          RETRIEVER_URL=http://host:port uses a running service of yours instead (Search-R1's contract).
# Model:   the built-in tiny Qwen2 (created locally), warm-started; MODEL=dir skips the warm start.
# Agent:   AGENT=examples/python/agent_search_openai.py trains the same agent written to the OpenAI SDK
#          (it calls the run's loopback endpoint; docs/agents.md); the default is the AgentInstance file.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=${PYTHON:-"$ROOT/.venv/bin/python"}
OUT=${OUT:-"$ROOT/runs/search_agent"}
STEPS=${STEPS:-60}
SEED=${SEED:-0}
PORT=${PORT:-8000}
MODEL=${MODEL:-}
RETRIEVER_URL=${RETRIEVER_URL:-}
PROMPTS_PER_STEP=${PROMPTS_PER_STEP:-16}
ENTITIES=${ENTITIES:-200}      # invented people in the knowledge base (4 passages, 4 questions each)
WARM_STEPS=${WARM_STEPS:-300}  # SFT steps on search demonstrations
GPUS=${GPUS:-1}                # policy ranks (one per GPU; on CPU, one process)
AGENT=${AGENT:-"$ROOT/examples/python/agent_search.py"}

source "$(dirname "${BASH_SOURCE[0]}")/_search_service.sh"
export SEARCH_RETRIEVER_URL="$RETRIEVER_URL" SEARCH_TOPK=2 SEARCH_INFO_CHARS=110 SEARCH_MAX_SEARCHES=3

if [[ -z "$MODEL" ]]; then
    "$PYTHON" -m reinforce_pro.search.demonstrations --kb "$OUT/kb" --out "$OUT/warm" --steps "$WARM_STEPS" --seed "$SEED"
    MODEL="$OUT/warm"
fi

DATA_ARGS=(
    --pretrain "$MODEL" --prompt_data "$OUT/kb/train.jsonl" --input_key question --label_key label
    --prompt_max_len 64 --max_len 512 --max_new_tokens 40
)
AGENT_ARGS=(--agent_func_path "$AGENT" --agent_max_turns 4)
ALGO_ARGS=(
    --advantage_estimator reinforce_baseline --init_kl_coef 0 --actor_learning_rate 3e-4
    --enable_vllm_is_correction --vllm_is_correction_type reinforce_pro --vllm_is_truncated_threshold 0.5 5.0
)
BATCH_ARGS=(
    --rollout_batch_size "$PROMPTS_PER_STEP" --n_samples_per_prompt 8 --train_batch_size $((PROMPTS_PER_STEP * 8))
    --micro_train_batch_size 32 --micro_rollout_batch_size 64 --max_samples $((PROMPTS_PER_STEP * STEPS))
)
PLACEMENT_ARGS=(--actor_num_gpus_per_node "$GPUS" --ref_num_gpus_per_node "$GPUS" --vllm_num_engines 1)
"$PYTHON" -m reinforce_pro.cli.train_ppo_ray "${DATA_ARGS[@]}" "${AGENT_ARGS[@]}" "${ALGO_ARGS[@]}" \
    "${BATCH_ARGS[@]}" "${PLACEMENT_ARGS[@]}" --seed "$SEED" --save_path "$OUT" "$@"
