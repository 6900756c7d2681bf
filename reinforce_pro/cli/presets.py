"""Named presets: the flag values of a kind of run, applied as the parser's defaults, so a flag given on the
command line (in either spelling) always wins over its preset value.

A command line with no `--pretrain` and no `--prompt_data` runs the embedded default: `embedded` (RL on
built-in additions with a tiny Qwen2 created locally), with `--builtin_task running_sum` or `scratchpad` the long-
response task's preset, or with `--absolute_zero` `embedded-selfplay`.
docs/flags.md lists both.
"""

from __future__ import annotations

from argparse import Namespace

from reinforce_pro.algos.losses import DEFAULT_IS_THRESHOLD

# The running-sum task's warm start: its greedy accuracy jumps from ~0.1 to ~0.8 within ~150 steps, at a step
# count that differs by seed, so it stops at a target accuracy rather than after a fixed number of steps.
RUNNING_SUM_WARMUP = {"sft_warmup_steps": 2000, "sft_warmup_target": 0.5}
# The main job's warm start on additions: its greedy accuracy jumps from ~0.05 to ~0.2 within a few dozen steps,
# at a step that differs by seed and, through float rounding, by host. A fixed step count stops before the jump on
# some hosts and after it on others, and RL from before the jump learns about half as much (docs/running.md).
ARITHMETIC_WARMUP = {"sft_warmup_steps": 600, "sft_warmup_target": 0.2}

EMBEDDED = {
    "advantage_estimator": "reinforce_baseline",
    "enable_vllm_is_correction": True,
    "vllm_is_correction_type": "reinforce_pro",
    "vllm_is_truncated_threshold": list(DEFAULT_IS_THRESHOLD),
    "n_samples_per_prompt": 8,
    "rollout_batch_size": 32,
    "train_batch_size": 256,
    "micro_train_batch_size": 64,
    "micro_rollout_batch_size": 64,
    "max_epochs": 1,
    "actor_learning_rate": 2e-4,
    "lr_scheduler": "constant_with_warmup",
    "lr_warmup_ratio": 0.0,
    "init_kl_coef": 0.0,
    "max_new_tokens": 6,
    "max_len": 64,
    "prompt_max_len": 32,
    "param_dtype": "fp32",
    "vllm_dtype": "bfloat16",  # a real (small) rollout/training mismatch for the IS correction to handle
    "zero_stage": 2,
    "vllm_num_engines": 1,
    "actor_num_gpus_per_node": 1,
    "critic_num_gpus_per_node": 1,
    "ref_num_gpus_per_node": 1,
    "reward_num_gpus_per_node": 1,
    **ARITHMETIC_WARMUP,
    "max_samples": 32 * 700,  # 700 RL steps, ~5 minutes on 2 cores
}
# With --absolute_zero the embedded default trains self-play on the arithmetic task: 16 seed prompts x 4
# questions x 8 solver samples per round; at most 16 x 8 solver and 16 x 4 proposer rows are trained.
# group scope: with the reference design's `sampled` scope the proposer is rewarded 1.0 for nearly every
# prompt (most resolve within the re-proposal budget) and measurably learned nothing in 20-step runs; the
# longer warm start gives the solver enough skill that some questions are learnable from the start.
EMBEDDED_SELFPLAY = {
    **EMBEDDED,
    "rollout_batch_size": 16,
    "train_batch_size": 256,
    "proposer_train_scope": "group",
    "proposer_repetition_penalty": 8.0,  # without it the proposer collapses onto a few questions
    "sft_warmup_steps": 1000,
    "sft_warmup_target": 0.0,  # both roles' warm start runs its steps: no single accuracy says when it is done
    "max_new_tokens": 20,  # the longest question the task accepts (4 operands of 4 digits) and its end token
    "eval_steps": 25,  # the solver's greedy accuracy on the task's held-out ladder (eval/ladder/*)
    "eval_before_training": True,  # ... and on the warm start's policy, as step 0
    "max_samples": 16 * 300,  # 300 steps, ~4 minutes on 2 cores
}


# With --builtin_task running_sum: the long-response task of the study (data/running_sum.py). Responses run to
# ~60 tokens, so the budget is 64 new tokens; the warm start stops while the model still errs on some steps, so
# RL has room to improve it.
EMBEDDED_RUNNING_SUM = {
    **EMBEDDED,
    "max_new_tokens": 64,
    "max_len": 96,
    "prompt_max_len": 32,
    **RUNNING_SUM_WARMUP,
    "max_samples": 32 * 200,  # 200 RL steps
}

# With --builtin_task scratchpad: four-digit additions worked column by column (data/scratchpad.py), ~55-token
# responses, on a 4-layer model (data.EMBEDDED_TASKS).
EMBEDDED_SCRATCHPAD = {
    **EMBEDDED,
    "max_new_tokens": 64,
    "max_len": 96,
    "prompt_max_len": 16,
    "sft_warmup_steps": 1200,
    "sft_warmup_target": 0.0,
    "max_samples": 32 * 200,  # 200 RL steps
}


PRESETS: dict[str, dict[str, object]] = {"embedded": EMBEDDED, "embedded-selfplay": EMBEDDED_SELFPLAY,
                                         "embedded-running-sum": EMBEDDED_RUNNING_SUM,
                                         "embedded-scratchpad": EMBEDDED_SCRATCHPAD}  # fmt: skip
TASK_PRESETS = {"arithmetic": "embedded", "running_sum": "embedded-running-sum", "scratchpad": "embedded-scratchpad"}


def preset_defaults(name: str, args: Namespace) -> dict[str, object]:
    """The preset's values as parser defaults. A command line that selects its correction with OpenRLHF 0.11.2's
    --algo.advantage.is_correction_level keeps it: the preset's correction type would otherwise read as a second
    choice."""
    values = dict(PRESETS[name])
    if args.is_correction_level != "off":
        values.pop("vllm_is_correction_type", None)
    return values


def preset_for(args: Namespace) -> str | None:
    """The preset a command line runs under: the embedded default's when it names no model and no data."""
    if args.pretrain is not None or args.prompt_data is not None:
        return None
    if args.absolute_zero:
        return "embedded-selfplay"
    return TASK_PRESETS[args.builtin_task]
