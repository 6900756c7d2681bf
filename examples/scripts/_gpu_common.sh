# Shared by the GPU-cluster recipes (sourced, not run). Every value can be overridden from the environment.
# MODEL and DATA are local paths on every node: nothing is downloaded at run time.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
RAY=${RAY:-ray}
RAY_JOB_ADDRESS=${RAY_JOB_ADDRESS:-http://127.0.0.1:8265}
MODEL=${MODEL:?set MODEL to a local HF model directory (the same path on every node)}
DATA=${DATA:?set DATA to a local jsonl / HF dataset directory of prompts with "input" and "label" fields}
REWARD=${REWARD:-"$ROOT/examples/python/reward_last_number.py"}
OUT=${OUT:-"$ROOT/runs/$(basename "${BASH_SOURCE[1]}" .sh)"}
NODES=${NODES:-1}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
IS_CORRECTION=${IS_CORRECTION:-reinforce_pro}
read -r -a EXTRA <<< "${EXTRA_ARGS:-}"

DATA_ARGS=(
    --pretrain "$MODEL" --prompt_data "$DATA" --input_key input --label_key label --apply_chat_template
    --remote_rm_url "$REWARD" --prompt_max_len 1024 --max_new_tokens 2048 --max_len 3072
)
IS_ARGS=(
    --enable_vllm_is_correction --vllm_is_correction_type "$IS_CORRECTION" --vllm_is_truncated_threshold 0.5 5.0
)
RUN_ARGS=(
    --save_path "$OUT" --ckpt_path "$OUT/ckpt" --save_steps 20 --max_ckpt_num 3 --load_checkpoint
    --logging_steps 1 --samples_log_steps 10 --seed 42
)
# The head uploads this checkout as the job's working directory (the same code on every node).
RUNTIME_ENV=$(printf '{"working_dir": "%s", "excludes": [".venv", "runs", "ckpt", ".git"], "env_vars": {"TOKENIZERS_PARALLELISM": "false"}}' "$ROOT")

submit() {
    "$RAY" job submit --address="$RAY_JOB_ADDRESS" --runtime-env-json="$RUNTIME_ENV" \
        -- python3 -m reinforce_pro.cli.train_ppo_ray "$@" "${EXTRA[@]}"
}
