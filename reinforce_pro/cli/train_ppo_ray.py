"""`python -m reinforce_pro.cli.train_ppo_ray`: OpenRLHF-style RL on Ray.

With no model or data flags it runs the embedded default on CPU: a tiny Qwen2 model and tokenizer
created locally, a short supervised warm start on built-in additions, then RL with reinforce_baseline
and the reinforce_pro IS correction. Its settings are a named preset (cli/presets.py), which changes the
defaults of the flags: a flag given on the command line wins.

`parse_args(argv)` validates flag values and their combinations without touching the file system or
starting anything; `main(argv)` then checks paths and runs. User errors end with one line on stderr
and exit status 2.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import TYPE_CHECKING

from reinforce_pro.algos.advantages import ADVANTAGE_ESTIMATORS
from reinforce_pro.cli.args import UNSUPPORTED, build_parser, out_of_bounds
from reinforce_pro.cli.presets import preset_defaults, preset_for
from reinforce_pro.cli.spellings import conflicting_spellings, given_options, spelling
from reinforce_pro.rollout.collective import SYNC_BACKENDS

if TYPE_CHECKING:
    from reinforce_pro.run.config import RunConfig

GROUP_ESTIMATORS = {"rloo", "reinforce_baseline", "group_norm", "dr_grpo"}
assert GROUP_ESTIMATORS <= set(ADVANTAGE_ESTIMATORS)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The checked flags (tests and the OpenRLHF scripts read these); `parse` also returns the run config."""
    return parse(argv)[0]


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, RunConfig]:
    """Flags -> (namespace, RunConfig), the config built once: its sections' own checks are what end a bad
    command line (in one line, worded with the flag), and the same object is the run's."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if clash := conflicting_spellings(parser, given_options(parser, argv)):
        parser.error(clash)
    if (preset := preset_for(args)) is not None:  # the preset's values become the defaults: given flags win
        parser.set_defaults(preset=preset, **preset_defaults(preset, args))
        args = parser.parse_args(argv)
    problem = (
        unsupported_flag(args, parser)
        or out_of_bounds(args)  # each flag's own bounds, declared on its field
        or invalid_combination(args)
        or invalid_selfplay(args)
        or invalid_running(args)
        or invalid_agent(args)
    )
    if problem:
        parser.error(problem)
    from reinforce_pro.cli.flags_to_config import run_config  # torch and the workers: not needed for --help

    try:
        return args, run_config(args)
    except ValueError as e:  # a section refused a value: `dual_clip must be > 1.0` -> `--dual_clip must ...`
        message = str(e)
        parser.error(f"--{message}" if hasattr(args, message.split(" ", 1)[0]) else message)


def unsupported_flag(args, parser) -> str | None:
    for dest, why in UNSUPPORTED.items():
        if getattr(args, dest) != parser.get_default(dest):
            return f"{spelling(parser, dest)} is recognised but not supported by reinforce_pro: {why}"
    return None


def template_problem(template: str) -> str | None:
    """What is wrong with an --input_template (filled with str.format, as in OpenRLHF), or None."""
    try:
        filled = template.format("\0")
    except (IndexError, KeyError, ValueError) as e:
        return f"needs exactly one {{}} placeholder (write literal braces as {{{{ }}}}): {type(e).__name__}: {e}"
    if filled.count("\0") != 1:
        return "needs exactly one {} placeholder, where the prompt text goes"
    return None


def invalid_combination(args) -> str | None:
    """The first problem with the flag values, or None."""
    return (
        invalid_numbers(args) or invalid_rollout_lag(args) or invalid_layout(args) or invalid_min_length(args)
    )  # fmt: skip


def invalid_min_length(args) -> str | None:
    """--min_new_tokens holds for whole prompt rollouts; a rollout that cuts a response's budget (partial chunks,
    agent turns, self-play roles) would ask the engine for a minimum above its maximum."""
    if args.min_new_tokens and (args.partial_rollout or args.agent_func_path or args.absolute_zero):
        return (
            "--min_new_tokens applies to whole prompt rollouts: drop --partial_rollout / --agent_func_path / "
            "--absolute_zero, or --min_new_tokens"
        )
    return None


def invalid_numbers(args) -> str | None:
    """Ranges and texts that are wrong on their own (a single flag's bounds are declared on its field)."""
    clip_low, clip_high = args.reward_clip_range
    if not clip_low < clip_high:
        return f"--reward_clip_range must satisfy LOW < HIGH, got {clip_low} {clip_high}"
    if args.input_template is not None and (problem := template_problem(args.input_template)):
        return f"--input_template {args.input_template!r}: {problem}"
    buffer, limit = args.overlong_buffer_len, args.max_new_tokens
    if buffer is not None and not (0 < buffer <= (limit if limit is not None else float("inf"))):
        return f"--overlong_buffer_len must be in (0, --max_new_tokens {limit}], got {buffer}"
    if args.stop_properly_penalty_coef is not None and args.stop_properly_penalty_coef > 1:
        coef = args.stop_properly_penalty_coef
        return f"--stop_properly_penalty_coef must be <= 1 (in [0, 1] scales, < 0 replaces), got {coef}"
    if args.lora_rank < 0 or args.lora_alpha <= 0 or not 0 <= args.lora_dropout < 1:
        got = f"{args.lora_rank} / {args.lora_alpha} / {args.lora_dropout}"
        return f"--lora_rank must be >= 0, --lora_alpha > 0 and --lora_dropout in [0, 1), got {got}"
    if args.lora_save_merged and not args.lora_rank:
        return "--lora_save_merged merges a LoRA adapter: add --lora_rank"
    return None


def invalid_rollout_lag(args) -> str | None:
    """Staleness, asynchronous training, partial rollouts and the weight-sync backend that serves them."""
    if args.partial_rollout and not args.async_train and args.rollout_staleness == 0:
        return (
            "--partial_rollout continues rollouts across weight syncs of --async_train: add --async_train, or "
            "--rollout_staleness K to sample each response's first chunk K + 1 versions back and the rest K back"
        )
    if args.partial_rollout and not args.async_train and args.agent_func_path:
        return "--partial_rollout with --rollout_staleness applies to prompt rollouts: agents need --async_train"
    if args.partial_rollout and args.absolute_zero:
        return "--partial_rollout applies to prompt and agent rollouts, not to --absolute_zero"
    if args.vllm_sync_backend not in SYNC_BACKENDS:
        return f"--vllm_sync_backend must be one of {', '.join(SYNC_BACKENDS)}, got {args.vllm_sync_backend}"
    if args.vllm_sync_backend == "gloo" and not args.vllm_sync_with_ray and args.rollout_staleness > 0:
        return "--rollout_staleness serves older weights, which only --vllm_sync_backend object_store keeps"
    if args.async_lag_target is not None:
        if not args.async_train:
            return "--async_lag_target moves the lead of --async_train's producer: add --async_train"
        if not (math.isfinite(args.async_lag_target) and args.async_lag_target > 0):
            return f"--async_lag_target must be a finite number > 0, got {args.async_lag_target}"
        if args.async_lag_metric == "is/token_masked_frac" and not args.enable_vllm_is_correction:
            return "--async_lag_metric is/token_masked_frac is logged by IS correction: add --enable_vllm_is_correction"
    if args.async_train and args.rollout_staleness > 0:
        return "--rollout_staleness imitates the lag of asynchronous training: use it or --async_train, not both"
    return None


def invalid_layout(args) -> str | None:
    """Sampling settings, batch arithmetic over the ranks, the reward source and colocation."""
    world = args.actor_num_nodes * args.actor_num_gpus_per_node
    checks = [
        (0 < args.top_p <= 1, f"--top_p must be in (0, 1], got {args.top_p}"),
        (
            args.advantage_estimator not in GROUP_ESTIMATORS or args.n_samples_per_prompt >= 2,
            f"--advantage_estimator {args.advantage_estimator} compares samples of a prompt: "
            f"--n_samples_per_prompt must be >= 2, got {args.n_samples_per_prompt}",
        ),
        (
            args.advantage_estimator not in GROUP_ESTIMATORS or args.gamma == 1,
            f"--advantage_estimator {args.advantage_estimator} needs --gamma 1, got {args.gamma}",
        ),
        (
            args.absolute_zero  # self-play batches vary in size: cut into near-equal mini-batches
            or (args.rollout_batch_size * args.n_samples_per_prompt) % args.train_batch_size == 0,
            f"--rollout_batch_size x --n_samples_per_prompt = {args.rollout_batch_size * args.n_samples_per_prompt} "
            f"samples per step must be a multiple of --train_batch_size {args.train_batch_size}",
        ),
        (
            args.ring_attn_size >= 1 and world % args.ring_attn_size == 0,
            f"--ring_attn_size {args.ring_attn_size} must divide the {world} policy ranks",
        ),
        (
            args.ring_attn_size == 1 or args.packing_samples,
            "--ring_attn_size splits packed rows along the sequence: add --packing_samples",
        ),
        (
            args.train_batch_size % (args.micro_train_batch_size * world) == 0,
            f"--train_batch_size {args.train_batch_size} must be a multiple of --micro_train_batch_size "
            f"{args.micro_train_batch_size} x {world} policy ranks",
        ),
        (
            args.prompt_data is None
            or args.remote_rm_url
            or args.reward_pretrain
            or args.absolute_zero
            or args.agent_func_path,
            "--prompt_data needs a reward: --remote_rm_url file.py or --reward_pretrain DIR",
        ),
        (not (args.remote_rm_url and args.reward_pretrain), "give --remote_rm_url or --reward_pretrain, not both"),
        (
            not args.colocate_all_models
            or (
                (args.vllm_num_engines or 1) * args.vllm_tensor_parallel_size <= world
                and args.actor_num_gpus_per_node % args.vllm_tensor_parallel_size == 0
            ),
            "--colocate_all_models puts each engine's --vllm_tensor_parallel_size workers on as many policy ranks "
            "of one node: --vllm_num_engines x --vllm_tensor_parallel_size must be at most the policy ranks, and "
            "--vllm_tensor_parallel_size must divide --actor_num_gpus_per_node",
        ),
        (
            not args.colocate_critic_reward or (args.advantage_estimator == "gae" and args.reward_pretrain),
            "--colocate_critic_reward shares the critic's slots with the reward model: it needs both "
            "(--advantage_estimator gae and --reward_pretrain)",
        ),
    ]
    return next((msg for ok, msg in checks if not ok), None)


def invalid_running(args) -> str | None:
    """The first problem with the checkpoint, evaluation, logging and filtering flags, or None."""
    low, high = args.dynamic_filtering_reward_range
    checks = [
        (
            args.eval_dataset or args.absolute_zero or (args.eval_steps <= 0 and not args.eval_before_training),
            "--eval_steps / --eval_before_training need --eval_dataset (self-play: its task's ladder)",
        ),
        (
            not args.best_metric_key or (args.eval_dataset and (args.eval_steps > 0 or args.eval_before_training)),
            "--best_metric_key picks by an eval metric: add --eval_dataset and --eval_steps",
        ),
        (low < high, f"--dynamic_filtering_reward_range must satisfy LOW < HIGH, got {low} {high}"),
        (
            not args.absolute_zero or not (args.dynamic_filtering or args.eval_dataset),
            "--absolute_zero has its own filter (learnability): drop --dynamic_filtering / --eval_dataset",
        ),
        (
            not (args.save_hf_ckpt and args.disable_ds_ckpt and args.save_steps <= 0),
            "--save_hf_ckpt needs --save_steps",
        ),
    ]
    problem = next((msg for ok, msg in checks if not ok), None)
    if problem is None and args.prompt_data_probs is not None:
        from reinforce_pro.data.prompts import DataError, parse_mixture

        try:
            parse_mixture(args.prompt_data or "", args.prompt_data_probs) if args.prompt_data else None
        except DataError as e:
            problem = str(e)
        if not args.prompt_data:
            problem = "--prompt_data_probs mixes the datasets of --prompt_data: give them (comma-separated)"
    if problem is None and args.best_metric_key:
        from pathlib import Path

        from reinforce_pro.trainer.evaluation import eval_metric_names

        names = eval_metric_names(Path(args.eval_dataset).stem, args.eval_n_samples_per_prompt)
        if args.best_metric_key not in names + [n.rsplit("/", 1)[1] for n in names]:
            problem = f"--best_metric_key {args.best_metric_key}: not an eval metric of this run ({', '.join(names)})"
    return problem


def invalid_agent(args) -> str | None:
    """The first problem with the multi-turn agent flags, or None."""
    if not args.agent_func_path:
        return None
    checks = [
        (
            not (args.remote_rm_url or args.reward_pretrain),
            "--agent_func_path: the environment gives the rewards; drop --remote_rm_url / --reward_pretrain",
        ),
        (
            args.agent_reward_mode != "per_turn" or args.advantage_estimator in ("reinforce", "gae"),
            f"--agent_reward_mode per_turn puts rewards on several tokens: --advantage_estimator must be reinforce "
            f"or gae, got {args.advantage_estimator}",
        ),
    ]
    return next((msg for ok, msg in checks if not ok), None)


def invalid_selfplay(args) -> str | None:
    """The first problem with the self-play flags, or None."""
    if not args.absolute_zero:
        return None
    # proposer rows form one group per step (sampled scope) or one per prompt (group scope)
    sampled = args.proposer_train_scope == "sampled"
    proposer_group = args.rollout_batch_size if sampled else args.n_questions_per_prompt
    group_flag = "--rollout_batch_size" if sampled else "--n_questions_per_prompt"
    checks = [
        (
            args.n_samples_per_prompt >= 2,
            "--absolute_zero judges learnability from several solver responses: --n_samples_per_prompt must be "
            f">= 2, got {args.n_samples_per_prompt}",
        ),
        (
            not (args.remote_rm_url or args.reward_pretrain),
            "--absolute_zero scores with its task: drop --remote_rm_url / --reward_pretrain",
        ),
        (
            args.advantage_estimator not in GROUP_ESTIMATORS or proposer_group >= 2,
            f"--advantage_estimator {args.advantage_estimator} compares proposer rows within a group of "
            f"{proposer_group} ({group_flag}): it must be >= 2",
        ),
    ]
    return next((msg for ok, msg in checks if not ok), None)


def main(argv: list[str] | None = None) -> int:
    """Flags -> RunConfig -> one run (run/driver.py: train)."""
    from reinforce_pro.run.driver import train

    _, cfg = parse(argv)
    return train(cfg)


if __name__ == "__main__":
    sys.exit(main())
