"""OpenRLHF's two spellings of every flag: v0.9.10's flat names and the dotted names of v0.10.2 onwards (v0.11).

OpenRLHF renamed its flags in v0.10.2 with no backward compatibility (`--pretrain` became
`--actor.model_name_or_path`, `--zero_stage` became `--ds.zero_stage`, ...). Here both spellings name one
argparse action: `DOTTED` maps a flat flag to its dotted name(s), `both_spellings` adds them when the flat
flag is defined, and a script may mix the two. Giving one setting twice in two spellings with different
values is an error (`conflicting_spellings`); the same spelling twice keeps argparse's last-one-wins.

The dotted names are those of OpenRLHF's dotted `openrlhf/cli/train_ppo_ray.py` (tests/data/openrlhf/
dotted-train_ppo_ray-flags.tsv lists them; tests/test_openrlhf_scripts.py checks each one is recognised).
Flags that only exist in dotted form (`--actor.adam.eps`, `--critic.max_norm`, Muon's slots, ...) are
defined in args.py under their dotted name.
"""

from __future__ import annotations

import argparse

# flat name -> dotted name (a tuple where OpenRLHF split one flat flag in two)
DOTTED: dict[str, str | tuple[str, ...]] = {
    # placement
    "ref_num_nodes": "ref.num_nodes",
    "ref_num_gpus_per_node": "ref.num_gpus_per_node",
    "reward_num_nodes": "reward.num_nodes",
    "reward_num_gpus_per_node": "reward.num_gpus_per_node",
    "actor_num_nodes": "actor.num_nodes",
    "actor_num_gpus_per_node": "actor.num_gpus_per_node",
    "critic_num_nodes": "critic.num_nodes",
    "critic_num_gpus_per_node": "critic.num_gpus_per_node",
    "colocate_actor_ref": "train.colocate_actor_ref",
    "colocate_critic_reward": "train.colocate_critic_reward",
    "colocate_all_models": "train.colocate_all",
    # engines, IS correction, async
    "vllm_num_engines": "vllm.num_engines",
    "vllm_tensor_parallel_size": "vllm.tensor_parallel_size",
    "vllm_sync_backend": "vllm.sync_backend",
    "vllm_sync_with_ray": "vllm.sync_with_ray",
    "enable_prefix_caching": "vllm.enable_prefix_caching",
    "enforce_eager": "vllm.enforce_eager",
    "vllm_enable_sleep": "vllm.enable_sleep",
    "vllm_gpu_memory_utilization": "vllm.gpu_memory_utilization",
    "enable_vllm_is_correction": "algo.advantage.is_correction_enable",
    "vllm_is_truncated_threshold": "algo.advantage.is_correction_threshold",
    "vllm_is_correction_type": "algo.advantage.is_correction_type",
    "async_train": "train.async_enable",
    "async_queue_size": "train.async_queue_size",
    "partial_rollout": "train.partial_rollout_enable",
    # checkpoints, evaluation, logging
    "eval_steps": "eval.steps",
    "save_steps": "ckpt.save_steps",
    "logging_steps": "logger.logging_steps",
    "ckpt_path": "ckpt.path",
    "save_hf_ckpt": "ckpt.save_hf",
    "disable_ds_ckpt": "ckpt.disable_ds",
    "max_ckpt_num": "ckpt.max_num",
    "max_ckpt_mem": "ckpt.max_mem",
    "load_checkpoint": "ckpt.load_enable",
    "best_metric_key": "ckpt.best_metric_key",
    "use_ds_universal_ckpt": "ds.use_universal_ckpt",
    "use_wandb": "logger.wandb.key",
    "wandb_org": "logger.wandb.org",
    "wandb_group": "logger.wandb.group",
    "wandb_project": "logger.wandb.project",
    "wandb_run_name": "logger.wandb.run_name",
    "use_tensorboard": "logger.tensorboard_dir",
    "dynamic_filtering": "algo.dynamic_filtering_enable",
    "dynamic_filtering_reward_range": "algo.dynamic_filtering_range",
    # DeepSpeed
    "zero_stage": "ds.zero_stage",
    "gradient_checkpointing": "actor.gradient_checkpointing_enable",
    "gradient_checkpointing_use_reentrant": "actor.gradient_checkpointing_reentrant",
    "deepcompile": "ds.deepcompile",
    "param_dtype": "ds.param_dtype",
    "enable_ema": "train.enable_ema",
    "ema_beta": "train.ema_beta",
    "zpg": "ds.zpg",
    "adam_offload": "ds.adam_offload",
    "attn_implementation": "ds.attn_implementation",
    "use_liger_kernel": "ds.use_liger_kernel",
    "grad_accum_dtype": "ds.grad_accum_dtype",
    "overlap_comm": "ds.overlap_comm",
    "disable_fast_tokenizer": "data.disable_fast_tokenizer",
    "dataloader_num_workers": "data.dataloader_num_workers",
    "deepspeed_enable_sleep": "ds.enable_sleep",
    "ds_tensor_parallel_size": "ds.tensor_parallel_size",
    "packing_samples": "ds.packing_samples",
    "use_dynamic_batch": "train.dynamic_batch_enable",
    "rollout_max_tokens_per_gpu": "rollout.max_tokens_per_gpu",
    "train_max_tokens_per_gpu": "train.max_tokens_per_gpu",
    "load_in_4bit": "ds.load_in_4bit",
    "lora_rank": "ds.lora.rank",
    "lora_alpha": "ds.lora.alpha",
    "target_modules": "ds.lora.target_modules",
    "lora_dropout": "ds.lora.dropout",
    "ring_attn_size": "ds.ring_attn_size",
    "ring_head_stride": "ds.ring_attn_head_stride",
    "value_head_prefix": "ds.value_head_prefix",
    # training
    "save_path": "ckpt.output_dir",
    "num_episodes": "train.num_episodes",
    "rollout_batch_size": "rollout.batch_size",
    "vllm_generate_batch_size": "rollout.vllm_generate_batch_size",
    "micro_rollout_batch_size": "rollout.micro_batch_size",
    "max_epochs": "train.max_epochs",
    "max_len": "data.max_len",
    "max_new_tokens": "rollout.max_new_tokens",
    "max_samples": "data.max_samples",
    "eps_clip": "actor.eps_clip",
    "eps_clip_low_high": "actor.eps_clip_low_high",
    "dual_clip": "actor.dual_clip",
    "value_clip": "critic.value_clip",
    "lambd": "algo.advantage.lambd",
    "gamma": "algo.advantage.gamma",
    "micro_train_batch_size": "train.micro_batch_size",
    "train_batch_size": "train.batch_size",
    "normalize_reward": "reward.normalize_enable",
    "top_p": "rollout.top_p",
    "temperature": "rollout.temperature",
    "seed": "train.seed",
    "full_determinism": "train.full_determinism_enable",
    "freezing_actor_steps": "critic.freezing_steps",
    "n_samples_per_prompt": "rollout.n_samples_per_prompt",
    "save_value_network": "critic.save_value_network",
    "kl_target": "algo.kl.target",
    "kl_horizon": "algo.kl.horizon",
    "init_kl_coef": "algo.kl.init_coef",
    "policy_loss_type": "actor.policy_loss_type",
    "kl_estimator": "algo.kl.estimator",
    "aux_loss_coef": "actor.aux_loss_coef",
    "entropy_loss_coef": "actor.entropy_coef",
    "reward_clip_range": "reward.clip_range",
    "actor_learning_rate": "actor.adam.lr",
    "critic_learning_rate": "critic.adam.lr",
    "adam_betas": "actor.adam.betas",
    "l2": "actor.adam.weight_decay",
    "max_norm": "actor.max_norm",
    "lr_scheduler": "actor.lr_scheduler",
    "lr_warmup_ratio": "actor.lr_warmup_ratio",
    "advantage_estimator": "algo.advantage.estimator",
    "use_kl_loss": "algo.kl.use_loss",
    "no_advantage_std_norm": "algo.advantage.no_std_norm",
    "overlong_buffer_len": "reward.overlong_buffer_len",
    "overlong_penalty_factor": "reward.overlong_penalty_factor",
    "stop_properly_penalty_coef": "reward.stop_properly_penalty_coef",
    # models and data
    "pretrain": "actor.model_name_or_path",
    "reward_pretrain": "reward.model_name_or_path",
    "remote_rm_url": "reward.remote_url",
    "critic_pretrain": "critic.model_name_or_path",
    "ref_reward_offload": ("ref.offload", "reward.offload"),
    "agent_func_path": "train.agent_func_path",
    "prompt_data": "data.prompt_dataset",
    "prompt_data_probs": "data.prompt_probs",
    "prompt_split": "data.prompt_split",
    "eval_dataset": "eval.dataset",
    "eval_split": "eval.split",
    "eval_temperature": "eval.temperature",
    "eval_n_samples_per_prompt": "eval.n_samples_per_prompt",
    "input_key": "data.input_key",
    "label_key": "data.label_key",
    "input_template": "data.input_template",
    "apply_chat_template": "data.apply_chat_template",
    "image_key": "data.image_key",
    "max_images_per_prompt": "data.max_images_per_prompt",
    "freeze_visual_encoder": "actor.freeze_visual_encoder",
}


def dotted_names(flat: str) -> tuple[str, ...]:
    """The dotted option strings of a flat flag (`--zero_stage` -> (`--ds.zero_stage`,)), or ()."""
    dotted = DOTTED.get(flat.removeprefix("--"), ())
    return tuple(f"--{d}" for d in ((dotted,) if isinstance(dotted, str) else dotted))


class both_spellings:  # noqa: N801 (used like a function: g = both_spellings(p.add_argument_group(...)))
    """An argument group whose add_argument also registers each flat flag's dotted name(s) on the same action."""

    def __init__(self, group: argparse._ArgumentGroup):
        self.group = group

    def add_argument(self, *names: str, **kwargs) -> argparse.Action:
        extra = tuple(d for d in dotted_names(names[0]) if d not in names)
        return self.group.add_argument(*names, *extra, **kwargs)


def spelling(parser: argparse.ArgumentParser, dest: str) -> str:
    """Every spelling of a setting, for messages: `--lora_rank / --ds.lora.rank`."""
    options = [o for a in parser._actions if a.dest == dest for o in a.option_strings]
    return " / ".join(options)


def given_options(parser: argparse.ArgumentParser, argv: list[str]) -> list[tuple[str, str, object]]:
    """(dest, option string, value) for each option string that appears in argv, parsed by argparse itself
    (so `--x=1`, nargs and types are handled as in the real parse); the last occurrence of a spelling wins."""
    quiet = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    owners: dict[str, tuple[str, str]] = {}
    for action in parser._actions:
        if action.dest == "help":
            continue
        for option in action.option_strings:
            key = f"option{len(owners)}"
            owners[key] = (action.dest, option)
            kwargs = {"dest": key, "default": argparse.SUPPRESS}
            if isinstance(action, argparse._StoreConstAction):  # store_true / store_false / store_const
                kwargs.update(action="store_const", const=action.const)
            else:
                kwargs.update(nargs=action.nargs, type=action.type)
            quiet.add_argument(option, **kwargs)
    ns, _ = quiet.parse_known_args(argv)
    return [(*owners[key], value) for key, value in vars(ns).items()]


def conflicting_spellings(parser: argparse.ArgumentParser, given: list[tuple[str, str, object]]) -> str | None:
    """'--a X and --b Y are two spellings ...' when one setting is given (`given_options`) in two spellings
    with two values."""
    first: dict[str, tuple[str, object]] = {}
    for dest, option, value in given:
        if dest in first and first[dest][0] != option and first[dest][1] != value:
            other, other_value = first[dest]
            return (
                f"{_shown(parser, other, other_value)} and {_shown(parser, option, value)} are two spellings of "
                "one setting with different values: give it once"
            )
        first.setdefault(dest, (option, value))
    return None


def _shown(parser: argparse.ArgumentParser, option: str, value: object) -> str:
    """An option as it was given: `--bf16`, `--zero_stage 3`, `--eps_clip_low_high 0.2 0.3`."""
    if parser._option_string_actions[option].nargs == 0:
        return option
    values = value if isinstance(value, (list, tuple)) else [value]
    return " ".join([option, *(str(v) for v in values)])
